"""Every refusal: a clear message, a non-zero exit, and the tree exactly as it was."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import git, snapshot
from vllm_patch import cli, edits


def refused(capsys: pytest.CaptureFixture[str], root: Path, *args: str | Path) -> str:
    """Runs sr-prefetch; asserts it exits 1 and leaves `root` unchanged; returns its message."""
    before = snapshot(root)
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    assert status == 1, captured.out + captured.err
    assert snapshot(root) == before
    return captured.out + captured.err


def commit(root: Path, message: str) -> None:
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message)


@pytest.mark.parametrize("command", ["apply", "check", "revert", "status"])
def test_a_path_that_is_not_a_vllm_tree(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README.md").write_text("not vLLM\n")
    message = refused(capsys, tmp_path, command, tmp_path)
    assert "is not a vLLM tree" in message


def test_the_package_directory_instead_of_the_tree(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = refused(capsys, vllm_tree, "apply", vllm_tree / "vllm")
    assert "give the directory that contains it" in message


@pytest.mark.parametrize("command", ["apply", "check", "revert"])
def test_another_vllm_version(
    vllm_tree: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    version_file = vllm_tree / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace("0.33.0", "0.34.1"))
    commit(vllm_tree, "v0.34.1")
    message = refused(capsys, vllm_tree, command, vllm_tree)
    assert "is vLLM 0.34.1" in message and "supports vLLM 0.33.0 only" in message


@pytest.mark.parametrize("design", sorted(edits.DESIGNS))
def test_local_edits_in_a_file_it_must_change(
    vllm_tree: Path, design: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dispatch = vllm_tree / edits.SSU_DISPATCH
    dispatch.write_text(dispatch.read_text() + "# a local edit\n")
    message = refused(capsys, vllm_tree, "apply", vllm_tree, "--design", design)
    assert edits.SSU_DISPATCH in message and "uncommitted changes" in message
    assert "nothing was changed" in message


def test_local_edits_outside_git(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(pristine, plain, ignore=shutil.ignore_patterns(".git"))
    envs = plain / edits.ENVS
    envs.write_text(envs.read_text() + "# a local edit\n")
    message = refused(capsys, plain, "apply", plain)
    assert edits.ENVS in message and "differs from vLLM v0.33.0" in message


@pytest.mark.parametrize(
    ("applied", "wanted"),
    [(edits.RESET, edits.FORWARD_CONTEXT), (edits.FORWARD_CONTEXT, edits.RESET)],
)
def test_the_other_design_already_applied(
    vllm_tree: Path, applied: str, wanted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["apply", str(vllm_tree), "--design", applied]) == 0
    capsys.readouterr()
    for command in ("apply", "check"):
        message = refused(capsys, vllm_tree, command, vllm_tree, "--design", wanted)
        assert f"already has the {applied} design applied" in message
        assert f"sr-prefetch revert {vllm_tree}" in message
        assert f"sr-prefetch apply {vllm_tree} --design {wanted}" in message


def test_an_anchor_the_fork_changed_is_named_with_the_reason(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = vllm_tree / edits.V1_RUNNER
    runner.write_text(runner.read_text().replace("outputs = self.model(", "outputs = self.fwd("))
    commit(vllm_tree, "a fork change")
    for command in ("check", "apply"):
        message = refused(capsys, vllm_tree, command, vllm_tree)
        assert f"conflict       {edits.V1_RUNNER}" in message
        assert "anchor 4 (_dummy_run:" in message and "not found" in message
        assert "it begins 'slot_mapping=slot_mappings,'" in message


def test_a_duplicated_anchor_is_refused(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envs = vllm_tree / edits.ENVS
    envs.write_text(
        envs.read_text().replace(
            "    VLLM_ENABLE_HPC_OPS: bool = False\n",
            "    VLLM_ENABLE_HPC_OPS: bool = False\n" * 2,
        )
    )
    commit(vllm_tree, "a fork change")
    message = refused(capsys, vllm_tree, "apply", vllm_tree)
    assert "found 2 times, must be unique" in message


def test_a_partly_patched_tree(vllm_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["apply", str(vllm_tree)]) == 0
    capsys.readouterr()
    git(vllm_tree, "checkout", "--", edits.V1_RUNNER)
    for command in ("apply", "revert"):
        message = refused(capsys, vllm_tree, command, vllm_tree)
        assert "partly patched" in message
    status = cli.main(["status", str(vllm_tree)])
    assert status == 1 and "partly patched" in capsys.readouterr().out


def test_an_edited_patched_line_blocks_revert(
    vllm_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["apply", str(vllm_tree)]) == 0
    capsys.readouterr()
    dispatch = vllm_tree / edits.SSU_DISPATCH
    dispatch.write_text(
        dispatch.read_text().replace(
            "_attach_sr_seed_prefetcher(mamba_config",
            "_attach_sr_seed_prefetcher(  mamba_config",
        )
    )
    message = refused(capsys, vllm_tree, "revert", vllm_tree)
    assert "partly patched" in message


def test_a_failed_write_leaves_the_tree_as_it_was(
    vllm_tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_replace = Path.replace
    calls = []

    def failing_replace(self: Path, target: Path) -> Path:
        calls.append(target)
        if len(calls) == 4:
            raise OSError("disk full")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", failing_replace)
    assert "disk full" in refused(capsys, vllm_tree, "apply", vllm_tree)
    assert len(calls) == 4
    assert git(vllm_tree, "status", "--porcelain", "-uall") == ""
