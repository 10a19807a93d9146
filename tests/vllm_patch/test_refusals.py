"""Every refusal: a clear message, exit status 1, and the target exactly as it was.

The trees are small copies of the newest release's pristine tree: its files that
sr-prefetch reads or changes, nothing else (the same target to the patch, at a
fraction of a full clone's cost).
"""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import commit, git, small_copy, small_git_copy, snapshot
from vllm_patch import cli, journal, releases
from vllm_patch.releases import NEWEST, Design
from vllm_patch.targets import envs, ssu_dispatch, v1_runner, v2_cudagraph

TARGET_COMMANDS = ["apply", "check", "revert", "status"]


def refused(capsys: pytest.CaptureFixture[str], root: Path, *args: str | Path) -> str:
    """Runs sr-prefetch; asserts it exits 1 and leaves `root` unchanged; returns its message."""
    before = snapshot(root)
    status = cli.main([str(arg) for arg in args])
    captured = capsys.readouterr()
    assert status == 1, captured.out + captured.err
    assert snapshot(root) == before
    return captured.out + captured.err


def applied(capsys: pytest.CaptureFixture[str], *args: str | Path) -> None:
    status = cli.main(["apply", *map(str, args)])
    captured = capsys.readouterr()
    assert status == 0, captured.out + captured.err


@pytest.fixture
def small_tree(pristine: Path, tmp_path: Path) -> Path:
    """A git tree of the pristine tree's files that sr-prefetch reads or changes,
    committed and tagged as the pristine tree is."""
    return small_git_copy(pristine, tmp_path / "small")


def set_version(root: Path, version: str) -> None:
    """Gives the tree at `root` another vLLM version, committed, as a fork's checkout."""
    version_file = root / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(NEWEST.version, version))
    commit(root, f"v{version}")


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} in {path}"
    path.write_text(text.replace(old, new))


# --- what is not a target ---------------------------------------------------------------------


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_a_path_that_is_not_a_vllm_tree(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README.md").write_text("not vLLM\n")
    message = refused(capsys, tmp_path, command, tmp_path)
    assert "is not a vLLM tree" in message


def test_the_package_directory_instead_of_the_tree(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = refused(capsys, small_tree, "apply", small_tree / "vllm")
    assert "give the directory that contains it" in message


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_a_path_and_installed_together(
    small_tree: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = refused(capsys, small_tree, command, small_tree, "--installed")
    assert "give PATH or --installed, not both" in message


@pytest.mark.parametrize("command", ["check", "revert", "status"])
def test_no_target_where_one_is_needed(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = refused(capsys, tmp_path, command)
    assert f"sr-prefetch {command} needs PATH or --installed" in message


def test_installed_where_this_python_imports_no_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A None entry in sys.modules is how Python says that a module cannot be imported.
    monkeypatch.setitem(sys.modules, "vllm", None)
    message = refused(capsys, tmp_path, "apply", "--installed")
    assert "this Python imports no vLLM" in message


# --- releases the patch does not support ------------------------------------------------------


@pytest.mark.parametrize("command", TARGET_COMMANDS)
def test_a_release_newer_than_the_newest_supported(
    small_tree: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    set_version(small_tree, "0.34.1")
    message = refused(capsys, small_tree, command, small_tree)
    assert f"vLLM 0.34.1 is newer than the newest supported release, {NEWEST.version}" in message
    assert "say which with --base" in message


def test_a_release_before_the_stochastic_rounding_seed_path(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    set_version(small_tree, "0.19.1")
    message = refused(capsys, small_tree, "apply", small_tree)
    assert "vLLM 0.19.1 predates the stochastic-rounding seed path" in message
    assert releases.supported() in message


@pytest.mark.parametrize("command", ["apply", "export"])
def test_an_unsupported_base_without_a_path(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # An empty cache of its own: nothing may be fetched or built for an unsupported release.
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(tmp_path / "cache"))
    output = ["-o", tmp_path / "never.patch"] if command == "export" else []
    message = refused(capsys, tmp_path, command, "--base", "0.19.0", *output)
    assert "vLLM 0.19.0 is not a supported release" in message
    assert "0.20.0" in message


# --- what the patch must not overwrite --------------------------------------------------------


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_local_edits_in_a_file_it_must_change(
    small_tree: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    dispatch = small_tree / ssu_dispatch.PATH
    dispatch.write_text(dispatch.read_text() + "# a local edit\n")
    message = refused(capsys, small_tree, "apply", small_tree, "--design", design)
    assert f"conflict       {ssu_dispatch.PATH}" in message
    assert "has uncommitted changes" in message and "nothing was changed" in message


def test_local_edits_outside_git(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = small_copy(pristine, tmp_path / "plain")
    local = plain / envs.PATH
    local.write_text(local.read_text() + "# a local edit\n")
    message = refused(capsys, plain, "apply", plain)
    assert f"conflict       {envs.PATH}" in message
    assert f"differs from vLLM {NEWEST.version}'s file" in message
    assert "patch a git checkout instead" in message


@pytest.mark.parametrize(
    ("applied_design", "wanted"),
    [(Design.RESET, Design.FORWARD_CONTEXT), (Design.FORWARD_CONTEXT, Design.RESET)],
    ids=str,
)
def test_the_other_design_already_applied(
    small_tree: Path, applied_design: Design, wanted: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    applied(capsys, small_tree, "--design", applied_design)
    for command in ("apply", "check"):
        message = refused(capsys, small_tree, command, small_tree, "--design", wanted)
        assert f"already has the {applied_design} design applied" in message
        assert f"sr-prefetch revert {small_tree}" in message
        assert f"sr-prefetch apply {small_tree} --design {wanted}" in message


# --- sites and files the fork moved -----------------------------------------------------------


def test_a_site_the_fork_moved_is_named_with_its_function_and_release(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fork renamed the model call in _dummy_run: the hooks have no `with` to join.
    runner = small_tree / v1_runner.PATH
    replace_once(runner, "outputs = self.model(", "outputs = self.forward_model(")
    commit(small_tree, "a fork change")
    for command, verdict in (("check", "would NOT apply"), ("apply", "nothing was changed")):
        message = refused(capsys, small_tree, command, small_tree)
        assert verdict in message
        assert f"conflict       {v1_runner.PATH}" in message
        # The file, the function, what is not there, and the release.
        assert (
            f"{v1_runner.PATH}: GPUModelRunner._dummy_run: no `with set_forward_context(...)` "
            f"statement around `self.model(...)` (vLLM {NEWEST.version})"
        ) in message


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        (
            "        rand_seed = (\n",
            "        spare_seed = torch.randint(0, 2**32, (1,), device=state.device)\n"
            "        rand_seed = (\n",
            "FlashInferSSUBackend.__call__: 2 of `torch.randint(0, 2**32, (1,), "
            "device=state.device)`, expected one",
        ),
        (
            "\ndef get_mamba_ssu_backend(",
            "\nclass FlashInferSSUBackend:\n    pass\n\n\ndef get_mamba_ssu_backend(",
            "FlashInferSSUBackend is defined 2 times",
        ),
    ],
    ids=["stock-draw-twice", "backend-class-twice"],
)
def test_a_site_found_twice_is_refused(
    small_tree: Path, old: str, new: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    replace_once(small_tree / ssu_dispatch.PATH, old, new)
    commit(small_tree, "a fork change")
    # ssu_dispatch.py's sites are both designs'; forward-context is the quicker to check.
    message = refused(capsys, small_tree, "apply", small_tree, "--design", Design.FORWARD_CONTEXT)
    assert f"conflict       {ssu_dispatch.PATH}" in message
    assert f"{ssu_dispatch.PATH}: {reason} (vLLM {NEWEST.version})" in message


def test_a_file_the_patch_changes_is_missing(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    git(small_tree, "rm", "-q", v2_cudagraph.PATH)
    commit(small_tree, "a fork without the V2 graph manager")
    message = refused(capsys, small_tree, "apply", small_tree)
    assert f"missing        {v2_cudagraph.PATH}" in message
    assert "the file does not exist" in message and "nothing was changed" in message


# --- half states ------------------------------------------------------------------------------


def test_a_partly_patched_tree(small_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    applied(capsys, small_tree)
    git(small_tree, "checkout", "--", v1_runner.PATH)
    for command in ("apply", "revert", "status"):
        message = refused(capsys, small_tree, command, small_tree)
        assert "partly patched" in message
    assert "Design applied: none whole" in message


def test_an_edited_patched_line_blocks_revert(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    applied(capsys, small_tree, "--design", Design.FORWARD_CONTEXT)
    # One space more in the call the patch added to initialize_mamba_ssu_backend.
    replace_once(
        small_tree / ssu_dispatch.PATH,
        "    _attach_sr_seed_prefetcher(mamba_config,",
        "    _attach_sr_seed_prefetcher( mamba_config,",
    )
    message = refused(capsys, small_tree, "revert", small_tree)
    assert "partly patched" in message and f"{ssu_dispatch.PATH} has edits" in message


# --- failed writes ----------------------------------------------------------------------------


def test_a_failed_write_leaves_the_tree_as_it_was(
    small_tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_replace = journal._replace
    calls = []

    def failing_replace(source: Path, target: Path) -> None:
        calls.append(target)
        if len(calls) == 4:
            raise OSError("disk full")
        real_replace(source, target)

    monkeypatch.setattr(journal, "_replace", failing_replace)
    assert "disk full" in refused(capsys, small_tree, "apply", small_tree)
    assert len(calls) > 4  # the 4th failed, and the undo renamed files back
    assert git(small_tree, "status", "--porcelain", "-uall") == ""


@pytest.mark.parametrize(
    ("code", "problem", "fix"),
    [
        (errno.ENOSPC, "its disk is full", "free space on that disk"),
        (errno.EPERM, "vllm is not writable", "chattr -i where a file is immutable"),
    ],
    ids=["full_disk", "immutable_file"],
)
def test_an_os_error_is_one_line_with_its_file_and_fix(
    small_tree: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    problem: str,
    fix: str,
) -> None:
    real_replace = journal._replace

    def failing_replace(source: Path, target: Path) -> None:
        if target.name == "envs.py":
            raise OSError(code, "the OS's words", str(source))
        real_replace(source, target)

    monkeypatch.setattr(journal, "_replace", failing_replace)
    message = refused(capsys, small_tree, "apply", small_tree)
    assert message.count("\n") == 1 and "Traceback" not in message, message
    assert message.startswith(f"sr-prefetch: cannot change {small_tree / envs.PATH}: "), message
    assert problem in message and fix in message, message
    assert git(small_tree, "status", "--porcelain", "-uall") == ""


def test_a_failed_removal_leaves_the_patched_tree_as_it_was(
    small_tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    applied(capsys, small_tree, "--design", Design.FORWARD_CONTEXT)
    real_unlink = journal._unlink
    calls = []

    def failing_unlink(path: Path) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise OSError("read-only file system")
        real_unlink(path)

    with monkeypatch.context() as failing:
        failing.setattr(journal, "_unlink", failing_unlink)
        assert "read-only file system" in refused(capsys, small_tree, "revert", small_tree)
    assert len(calls) >= 3
    status = cli.main(["status", str(small_tree)])
    assert status == 0 and f"Design applied: {Design.FORWARD_CONTEXT}" in capsys.readouterr().out
