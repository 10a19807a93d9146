"""Each design's export, checked by the release's own pre-commit hooks (vllm_patch/precommit.py).

The sdists and the hook environments come from the install step
(.ci/install-checks.sh); a test that finds them missing fails and names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_patch import precommit, releases, sdist
from vllm_patch.releases import Design

INSTALL = ".ci/install-checks.sh"


def require(version: str) -> None:
    if not sdist.cached(version):
        pytest.fail(f"vLLM {version}'s sdist is not cached: run {INSTALL} first (it fetches it)")


def config_of(version: str, directory: Path) -> Path:
    require(version)
    config, _ = precommit.write_config(releases.get(version), directory)
    missing = precommit.missing_environments(config)
    if missing:
        pytest.fail(f"vLLM {version}'s hook environments are not built: run {INSTALL} first")
    return config


@pytest.mark.parametrize("release", releases.RELEASES, ids=str)
def test_every_remote_hook_of_every_release_is_mapped(release: releases.Release) -> None:
    require(release.version)
    text = sdist.read_members(release.version, [precommit.CONFIG])[precommit.CONFIG].decode()
    local = yaml.safe_load(precommit.local_config(text))
    assert all(repo["repo"] in ("local", "meta") for repo in local["repos"])
    ids = [hook["id"] for repo in local["repos"] for hook in repo["hooks"]]
    assert "ruff-format" in ids and "clang-format" in ids and "check-forbidden-imports" in ids


def test_new_findings_leave_out_line_numbers_and_count_repeats() -> None:
    result = precommit.HookResult(
        "mypy",
        pristine=["a.py:10: error: x  [misc]"],
        patched=["a.py:12: error: x  [misc]", "a.py:40: error: x  [misc]", "b.py:1:2: E1 y"],
    )
    assert result.new == ["a.py:40: error: x  [misc]", "b.py:1:2: E1 y"]


@pytest.fixture(scope="module")
def source_clone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A clone of the newest release's sdist tree, and its hook configuration."""
    scratch = tmp_path_factory.mktemp("precommit")
    config = config_of(releases.NEWEST.version, scratch)
    clone = scratch / "vllm"
    precommit._git(
        scratch, "clone", "--quiet", str(precommit.source_tree(releases.NEWEST)), str(clone)
    )
    return clone, config


def test_a_hook_finds_a_forbidden_import_and_not_in_the_release_file(
    source_clone: tuple[Path, Path],
) -> None:
    clone, config = source_clone
    path = "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py"
    findings, _ = precommit.run_hook(clone, config, "check-forbidden-imports", [path])
    assert findings == []
    (clone / path).write_text("import re\n" + (clone / path).read_text())
    findings, _ = precommit.run_hook(clone, config, "check-forbidden-imports", [path])
    assert len(findings) == 1 and "forbidden import: re" in findings[0], findings
    assert (clone / path).read_text().startswith("import re\n")  # put back as it was


def test_a_fixing_hooks_changes_are_its_findings(source_clone: tuple[Path, Path]) -> None:
    clone, config = source_clone
    path = "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py"
    (clone / path).write_text((clone / path).read_text() + "x = ( 1 )\n")
    findings, _ = precommit.run_hook(clone, config, "ruff-format", [path])
    assert {f"{path}: -x = ( 1 )", f"{path}: +x = 1"} <= set(findings), findings


def test_a_hook_that_cannot_run_here_fails_on_a_file_it_selects(
    source_clone: tuple[Path, Path],
) -> None:
    clone, config = source_clone
    (clone / "NOTES.md").write_text("# notes\n")
    chosen = precommit.selected(clone, config, ["NOTES.md", "vllm/envs.py"])
    assert chosen["markdownlint-cli2"] == ["NOTES.md"] and chosen["clang-format"] == []
    findings, output = precommit.run_hook(clone, config, "markdownlint-cli2", ["NOTES.md"])
    assert findings == ["NOTES.md"] and "cannot run here" in output, output
    (clone / "NOTES.md").unlink(missing_ok=True)


@pytest.mark.parametrize("design", list(Design), ids=str)
@pytest.mark.parametrize("version", precommit.CI_RELEASES)
def test_the_export_adds_no_finding_to_the_releases_hooks(
    version: str, design: Design, tmp_path: Path
) -> None:
    config_of(version, tmp_path)
    results = precommit.check(releases.get(version), design)
    assert any(result.selected for result in results if result.hook.startswith("mypy"))
    new = {result.hook: result.new for result in results if result.new}
    assert not new, "\n".join(f"{hook}:\n  " + "\n  ".join(lines) for hook, lines in new.items())
