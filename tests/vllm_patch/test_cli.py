"""apply, check, status, revert and export against a pristine vLLM v0.33.0 tree, both designs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import git, snapshot
from vllm_patch import cli, edits, fork_test, tree, vendor

DESIGNS = sorted(edits.DESIGNS)


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    """sr-prefetch's exit status and everything it printed."""
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def changed_files(root: Path) -> set[str]:
    return {line[3:] for line in git(root, "status", "--porcelain", "-uall").splitlines()}


@pytest.mark.parametrize("design", DESIGNS)
def test_apply_status_revert(
    vllm_tree: Path, design: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = run(capsys, "apply", vllm_tree, "--design", design)
    assert status == 0, out
    expected = {fe.path for fe in edits.DESIGNS[design].file_edits}
    expected |= set(edits.DESIGNS[design].added_files())
    assert changed_files(vllm_tree) == expected
    for path in expected:
        assert path in out

    status, out = run(capsys, "status", vllm_tree)
    assert status == 0, out
    assert "vLLM version: 0.33.0" in out
    assert f"Design applied: {design}" in out
    assert all(path in out for path in expected)

    status, out = run(capsys, "revert", vllm_tree)
    assert status == 0, out
    assert git(vllm_tree, "status", "--porcelain", "-uall") == ""
    status, out = run(capsys, "status", vllm_tree)
    assert "Design applied: none" in out


def test_reset_design_edits_the_runners_and_forward_context_does_not() -> None:
    runners = {edits.V1_RUNNER, edits.V2_RUNNER, edits.V2_CUDAGRAPH}
    touched = {
        name: {fe.path for fe in design.file_edits} for name, design in edits.DESIGNS.items()
    }
    assert runners <= touched[edits.RESET]
    assert touched[edits.FORWARD_CONTEXT] == {edits.ENVS, edits.SSU_DISPATCH}


@pytest.mark.parametrize("design", DESIGNS)
def test_check_says_per_file_what_apply_would_do(
    vllm_tree: Path, design: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(vllm_tree)
    status, out = run(capsys, "check", vllm_tree, "--design", design)
    assert status == 0, out
    assert "would apply cleanly" in out
    for file_edits in edits.DESIGNS[design].file_edits:
        assert f"would change   {file_edits.path}" in out
        assert all(edit.why in out for edit in file_edits.edits)
    assert f"would add      {fork_test.PATH}" in out
    assert snapshot(vllm_tree) == before

    assert run(capsys, "apply", vllm_tree, "--design", design)[0] == 0
    status, out = run(capsys, "check", vllm_tree, "--design", design)
    assert status == 0 and "already applied" in out


@pytest.mark.parametrize("design", DESIGNS)
def test_applying_twice_is_a_no_op_that_says_so(
    vllm_tree: Path, design: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", vllm_tree, "--design", design)[0] == 0
    before = snapshot(vllm_tree)
    status, out = run(capsys, "apply", vllm_tree, "--design", design)
    assert status == 0
    assert "already applied" in out and "nothing to do" in out
    assert snapshot(vllm_tree) == before


@pytest.mark.parametrize("design", DESIGNS)
def test_export_applies_with_git_am_and_gives_the_same_files(
    pristine: Path,
    vllm_tree: Path,
    tmp_path: Path,
    design: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mail = tmp_path / f"{design}.patch"
    status, out = run(capsys, "export", "--design", design, "-o", mail)
    assert status == 0, out
    text = mail.read_text()
    subject = edits.DESIGNS[design].commit_message.splitlines()[0]
    assert "Subject: [PATCH] [Mamba] Draw a forward" in text
    explained = "Call sites" if design == edits.RESET else "identity of vLLM's ForwardContext"
    assert explained in " ".join(text.split())

    fresh = tree.clone(pristine, tmp_path / "fresh")
    git(
        fresh,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "am",
        "--quiet",
        "--keep-non-patch",
        str(mail),
    )
    assert git(fresh, "status", "--porcelain", "-uall") == ""
    assert git(fresh, "log", "-1", "--format=%s") == subject + "\n"

    assert run(capsys, "apply", vllm_tree, "--design", design)[0] == 0
    assert snapshot(fresh) == snapshot(vllm_tree)
    # A tree patched by git am reads back as applied, and reverts byte for byte.
    status, out = run(capsys, "status", fresh)
    assert f"Design applied: {design}" in out
    assert run(capsys, "revert", fresh)[0] == 0
    assert git(fresh, "diff", "HEAD~1", "--stat") == ""


def test_apply_without_a_path_patches_the_cached_pristine_tree(
    pristine: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cache = tmp_path / "cache"
    tree.clone(pristine, cache / f"vllm-{tree.SUPPORTED_VERSION}")
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(cache))
    status, out = run(capsys, "apply")
    assert status == 0, out
    default = cache / f"vllm-{tree.SUPPORTED_VERSION}"
    assert f"at {default}" in out and "git -C" in out
    assert f"Design applied: {edits.RESET}" in run(capsys, "status", default)[1]
    assert git(default, "log", "--format=%s") == f"{tree.PRISTINE_COMMIT_MESSAGE}\n"
    status, out = run(capsys, "apply")
    assert status == 0 and "already applied" in out


def test_the_pristine_tree_is_the_v0_33_0_source(pristine: Path) -> None:
    assert tree.read_version(pristine) == tree.SUPPORTED_VERSION
    assert git(pristine, "describe", "--tags").strip() == f"v{tree.SUPPORTED_VERSION}"
    assert not list(pristine.rglob("*.so")), "compiled binaries are not source"
    for path, digest in edits.PRISTINE_SHA256.items():
        assert snapshot(pristine)[path] == digest, path


def test_vendored_files_equal_what_runner_hooks_produces(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", vllm_tree)[0] == 0
    produced = vendor.vendored_files()
    package = vllm_tree / vendor.VENDORED_PACKAGE
    in_tree = {
        path.relative_to(vllm_tree).as_posix(): path.read_bytes()
        for path in package.rglob("*")
        if path.is_file()
    }
    assert in_tree == produced
    source = vendor.source_dir()
    shipped = {path.name for path in source.glob("*.py")} | {
        f"csrc/{path.name}" for path in (source / "csrc").iterdir()
    }
    assert {path.removeprefix(vendor.VENDORED_PACKAGE + "/") for path in produced} == shipped


def test_status_flags_a_vendored_copy_that_runner_hooks_has_moved_past(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", vllm_tree)[0] == 0
    hooks = vllm_tree / vendor.VENDORED_PACKAGE / "hooks.py"
    hooks.write_text(hooks.read_text() + "# an old copy\n")
    status, out = run(capsys, "status", vllm_tree)
    assert status == 0
    assert "stale" in out and "sr-prefetch revert" in out


def test_status_of_an_unsupported_version_says_so(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version_file = vllm_tree / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace("0.33.0", "0.34.1"))
    out = run(capsys, "status", vllm_tree)[1]
    assert "vLLM version: 0.34.1 (not supported" in out


def test_version_of_a_fork_checkout_comes_from_its_tag(vllm_tree: Path) -> None:
    (vllm_tree / "vllm" / "_version.py").unlink()
    git(vllm_tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "drop")
    assert tree.read_version(vllm_tree) == "0.33.0+1"


def test_a_tree_outside_git_is_patched_and_reverted(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(pristine, plain, ignore=shutil.ignore_patterns(".git"))
    before = snapshot(plain)
    assert run(capsys, "apply", plain)[0] == 0
    assert snapshot(plain) != before
    assert run(capsys, "revert", plain)[0] == 0
    assert snapshot(plain) == before
