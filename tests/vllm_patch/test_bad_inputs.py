"""Bad or odd inputs: each is answered with one line that names the problem and the fix
(no traceback), and leaves the tree byte for byte as it was, symlinks and modes included.

A file or tree path that is not UTF-8, a target file that does not parse or is a
symlink, Ctrl-C once the change is made, a tampered originals store, a cache or an export
destination that cannot be written, a version with no release number, and a git tree
that git refuses.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import (
    full_snapshot,
    git,
    read_only,
    run,
    small_copy,
    small_git_copy,
)
from vllm_patch import cli, patch, tree
from vllm_patch.releases import NEWEST, Design
from vllm_patch.targets import envs, mamba_ssm

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("check", "apply", "status", "revert")


def only_line(out: str) -> str:
    """The one line an error printed (the last line of the output); no traceback."""
    assert "Traceback" not in out, out
    return out.rstrip("\n").splitlines()[-1]


def installed(root: Path) -> Path:
    """`root` as pip leaves an installed vLLM: the package beside its dist-info."""
    dist = root / f"vllm-{NEWEST.version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {NEWEST.version}\n"
    )
    return root


@pytest.fixture
def small_tree(pristine: Path, tmp_path: Path) -> Path:
    return small_git_copy(pristine, tmp_path / "small")


# --- a target file that is not UTF-8 ---------------------------------------------------------

LATIN_1 = b"# caf\xe9\n"
"""A comment with a latin-1 byte: a file with it is not UTF-8."""


@pytest.mark.parametrize("command", COMMANDS)
def test_a_target_file_that_is_not_utf8_is_refused_in_one_line(
    small_tree: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "revert":
        assert run(capsys, "apply", small_tree)[0] == 0
    file = small_tree / envs.PATH
    file.write_bytes(file.read_bytes() + LATIN_1)
    if command != "revert":
        git(small_tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "latin-1")
    before = full_snapshot(small_tree)
    status, out = run(capsys, command, small_tree)
    offset = file.read_bytes().index(b"\xe9")
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: {envs.PATH} is not UTF-8 text (byte 0xe9 at offset {offset}), "
        "as vLLM's sources are: save it as UTF-8 (e.g. iconv -f latin1 -t utf-8), or "
        "restore vLLM's file; nothing was changed"
    )
    assert full_snapshot(small_tree) == before


@pytest.mark.parametrize("endings", ["all", "mixed"])
@pytest.mark.parametrize("command", ["check", "apply"])
def test_a_target_file_with_crlf_endings_is_refused_in_one_line(
    small_tree: Path, command: str, endings: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = small_tree / envs.PATH
    lines = file.read_bytes().split(b"\n")
    if endings == "all":
        file.write_bytes(b"\r\n".join(lines))
        first = 1
    else:
        file.write_bytes(b"\n".join(lines[:3]) + b"\r\n" + b"\n".join(lines[3:]))
        first = 3
    git(small_tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "crlf")
    before = full_snapshot(small_tree)
    status, out = run(capsys, command, small_tree)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: {envs.PATH} has CR line endings (line {first} the first), and vLLM's "
        "sources have LF only, as the patch writes them: restore the file with LF endings "
        "(git config core.autocrlf false, then git checkout the file, or dos2unix it); "
        "nothing was changed"
    )
    assert full_snapshot(small_tree) == before


# --- a tree path that is not UTF-8 -----------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_a_tree_path_that_is_not_utf8_is_refused_in_one_line(
    pristine: Path, tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = tmp_path / os.fsdecode(b"caf\xe9")
    parent.mkdir()
    root = small_git_copy(pristine, parent / "vllm-tree")
    before = full_snapshot(root)
    status, out = run(capsys, command, root)
    assert status == 1, out
    shown = f"{tmp_path}/caf\\xe9/vllm-tree"
    assert only_line(out) == (
        f"sr-prefetch: {shown} is not a UTF-8 path (it has the byte \\xe9), and sr-prefetch "
        "reads and names only UTF-8 paths: rename it, or the folder above it that has the "
        "byte, to a UTF-8 name"
    )
    assert full_snapshot(root) == before


# --- a target file that is a symlink ---------------------------------------------------------

REAL = "vllm/model_executor/layers/mamba/ops/mamba_ssm_impl.py"
"""Where the symlinked mamba_ssm.py points, in the same tree."""


def symlinked(root: Path) -> Path:
    """`root` with mamba_ssm.py moved to REAL and a relative symlink in its place."""
    (root / mamba_ssm.PATH).rename(root / REAL)
    (root / mamba_ssm.PATH).symlink_to(Path(REAL).name)
    return root


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_a_committed_symlink_is_patched_through_and_comes_back_a_symlink(
    pristine: Path, tmp_path: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    root = symlinked(small_copy(pristine, tmp_path / "small"))
    git(root, "init", "-q")
    git(root, "add", "--all")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "vLLM")
    git(root, "tag", f"v{NEWEST.version}")
    before = full_snapshot(root)
    status, out = run(capsys, "apply", root, "--design", design)
    assert status == 0, out
    assert f"written through the symlink to {REAL}" in out
    assert os.readlink(root / mamba_ssm.PATH) == Path(REAL).name
    assert git(root, "status", "--porcelain", "--", mamba_ssm.PATH, REAL) == f" M {REAL}\n"
    status, out = run(capsys, "status", root)
    assert status == 0 and f"Design applied: {design}" in out, out
    status, out = run(capsys, "revert", root)
    assert status == 0, out
    assert git(root, "status", "--porcelain", "-uall") == ""
    assert full_snapshot(root) == before


def test_a_symlink_in_an_installed_vllm_is_kept_and_its_file_restored(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = symlinked(small_copy(pristine, tmp_path / "site"))
    installed(root)
    before = full_snapshot(root)
    assert run(capsys, "apply", root)[0] == 0
    assert os.readlink(root / mamba_ssm.PATH) == Path(REAL).name
    status, out = run(capsys, "revert", root)
    assert status == 0, out
    assert full_snapshot(root) == before


def test_a_symlink_out_of_the_tree_is_refused_in_one_line(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = small_git_copy(pristine, tmp_path / "small")
    outside = tmp_path / "elsewhere.py"
    outside.write_bytes((root / mamba_ssm.PATH).read_bytes())
    (root / mamba_ssm.PATH).unlink()
    (root / mamba_ssm.PATH).symlink_to(outside)
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "linked")
    before = full_snapshot(root)
    status, out = run(capsys, "apply", root)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: {mamba_ssm.PATH} is a symlink to {outside}, outside {root}, and "
        "sr-prefetch changes files in the tree only: replace the link by a copy of the "
        f"file (cp --remove-destination {outside} {root / mamba_ssm.PATH}), or patch the "
        "tree it points into; nothing was changed"
    )
    assert full_snapshot(root) == before
    assert outside.read_bytes() == (pristine / mamba_ssm.PATH).read_bytes()


# --- Ctrl-C once the change is made ------------------------------------------------------------


def test_ctrl_c_after_the_change_is_made_keeps_it_and_says_so(
    small_tree: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = cli._print_reports
    handler = signal.getsignal(signal.SIGINT)  # SIG_IGN under nohup, else Python's

    def interrupted(reports: list[patch.FileReport]) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the report is printed
        printed(reports)

    monkeypatch.setattr(cli, "_print_reports", interrupted)
    status, out = run(capsys, "apply", small_tree)
    assert status == 130, out
    assert only_line(out) == (
        "sr-prefetch: interrupted once the apply of the reset design was made; it is kept, "
        "as reported above"
    )
    assert "Applied the reset design" in out
    assert signal.getsignal(signal.SIGINT) is handler
    monkeypatch.undo()
    status, out = run(capsys, "status", small_tree)
    assert status == 0 and "Design applied: reset" in out, out


def test_ctrl_c_as_the_process_ends_is_not_a_silent_death(small_tree: Path) -> None:
    """Once the report is printed, a Ctrl-C no longer kills the process with no word
    (rc -2): the change stands, and the exit status is 0, or 130 with a line saying so."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_patch", "apply", str(small_tree)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("  added") and lines[-1].endswith(f"{patch.fork_test.PATH}\n"):
            break
    process.send_signal(signal.SIGINT)
    out = "".join(lines) + process.stdout.read()
    process.wait()
    assert process.returncode in (0, 130), (process.returncode, out)
    if process.returncode == 130:
        assert "it is kept" in out.splitlines()[-1], out
    assert "Traceback" not in out
    assert (
        "Design applied: reset"
        in subprocess.run(
            [sys.executable, "-m", "vllm_patch", "status", str(small_tree)],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    )


# --- a tampered originals store --------------------------------------------------------------


def test_a_tampered_originals_store_is_named_not_the_file_it_keeps(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = small_copy(pristine, tmp_path / "site")
    installed(root)
    assert run(capsys, "apply", root, "--design", Design.FORWARD_CONTEXT)[0] == 0
    kept = root / patch.ORIGINALS / envs.PATH
    kept.write_bytes(kept.read_bytes() + b"# tampered\n")
    before = full_snapshot(root)
    status, out = run(capsys, "revert", root)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: {patch.ORIGINALS}/{envs.PATH}, the copy apply kept of {envs.PATH}, "
        f"was changed since: it is not vLLM {NEWEST.version}'s file; nothing was reverted: "
        f"delete it (revert then takes the patch out of {envs.PATH} by its structure), or "
        f"reinstall vLLM {NEWEST.version}"
    )
    assert full_snapshot(root) == before


# --- a cache or an export destination that cannot be written -------------------------------


def test_a_cache_path_that_is_a_file_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    cache.write_text("not a folder\n")
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(cache))
    status, out = run(capsys, "apply")
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: cannot write sr-prefetch's cache at {cache}: {cache} is a file, "
        "not a folder: remove it, or point SR_PREFETCH_CACHE at a folder"
    )
    assert cache.read_text() == "not a folder\n"


def test_a_read_only_cache_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(cache))
    with read_only(cache):
        status, out = run(capsys, "apply")
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: cannot write sr-prefetch's cache at {cache}: {cache} is not writable "
        "(its mode, its owner, or a read-only file system): make it writable, or point "
        "SR_PREFETCH_CACHE at a folder you may write"
    )
    assert list(cache.iterdir()) == []


def test_a_full_disk_under_the_cache_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(cache))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "mkdir", full)
    status, out = run(capsys, "apply")
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: cannot write sr-prefetch's cache at {cache}: its disk is full: free "
        "space there, or point SR_PREFETCH_CACHE at a folder on another disk"
    )


def test_export_to_a_folder_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = run(capsys, "export", "-o", tmp_path)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: cannot write the patch to {tmp_path}: it is a folder: give a file "
        f"name (-o {tmp_path}/sr-prefetch.patch), or - for stdout; nothing was written"
    )
    assert list(tmp_path.iterdir()) == []


def test_export_to_an_unwritable_place_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    with read_only(folder):
        status, out = run(capsys, "export", "-o", folder / "x.patch")
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: cannot write the patch to {folder / 'x.patch'}: {folder} is not "
        "writable (its mode, its owner, or a read-only file system): give a path you may "
        "write, or - for stdout; nothing was written"
    )
    assert list(folder.iterdir()) == []


def test_export_over_an_existing_file_is_refused_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mail = tmp_path / "x.patch"
    mail.write_text("mine\n")
    status, out = run(capsys, "export", "-o", mail)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: {mail} exists: add --force to replace it, or give another file; "
        "nothing was written"
    )
    assert mail.read_text() == "mine\n"
    status, out = run(capsys, "export", "--force", "-o", mail)
    assert status == 0, out
    assert mail.read_text().startswith("From ")


# --- a target file that does not parse -------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["git tree", "plain tree", "installed"])
def test_a_target_file_that_does_not_parse_is_refused_and_changes_nothing(
    pristine: Path, tmp_path: Path, kind: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No traceback on any verb or kind of target; check and apply name the file and
    where it stops parsing, revert refuses the tree, status reports it."""
    if kind == "git tree":
        root = small_git_copy(pristine, tmp_path / "small")
    else:
        root = small_copy(pristine, tmp_path / "small")
        if kind == "installed":
            (root / "vllm/_version.py").unlink()
            installed(root)
    if command == "revert":
        assert run(capsys, "apply", root)[0] == 0
    file = root / envs.PATH
    file.write_text(file.read_text() + "\ndef (:\n")
    line = file.read_text().count("\n")
    if kind == "git tree" and command != "revert":
        git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "broken")
    before = full_snapshot(root)
    status, out = run(capsys, command, root)
    assert "Traceback" not in out, out
    assert status == (0 if command == "status" else 1), out
    if command in ("check", "apply"):
        assert (
            f"{envs.PATH} does not parse as Python (invalid syntax, line {line}): restore "
            "vLLM's file (git checkout -- <file>, or reinstall vLLM)"
        ) in out, out
    assert full_snapshot(root) == before


# --- versions and git -----------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["source tree", "installed"])
def test_a_version_file_that_is_not_utf8_is_one_line(
    pristine: Path, tmp_path: Path, kind: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = small_copy(pristine, tmp_path / "small")
    if kind == "installed":
        (root / "vllm/_version.py").unlink()
        metadata = installed(root) / f"vllm-{NEWEST.version}.dist-info" / "METADATA"
        bad = metadata
    else:
        bad = root / "vllm/_version.py"
    bad.write_bytes(b'__version__ = "0.33.0\xff"\nVersion: \xff\n')
    before = full_snapshot(root)
    status, out = run(capsys, command, root)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: {bad.resolve()} is not UTF-8 (byte {bad.read_bytes().index(0xFF)}), "
        "so it tells no vLLM version: restore it (git checkout, or reinstall vLLM), or name "
        "the release with --base"
    )
    assert full_snapshot(root) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_a_path_that_is_a_symlink_loop_is_one_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    status, out = run(capsys, command, loop)
    assert status == 1, out
    assert only_line(out).startswith(f"sr-prefetch: {loop} cannot be resolved ("), out
    assert only_line(out).endswith("): give a path without a symlink loop"), out


@pytest.mark.parametrize("command", COMMANDS)
def test_a_version_with_no_release_number_hints_at_base(
    small_tree: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (small_tree / "vllm/_version.py").write_text('__version__ = "dev"\n')
    git(small_tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "dev")
    before = full_snapshot(small_tree)
    status, out = run(capsys, command, small_tree)
    assert status == 1, out
    assert only_line(out).endswith(
        "cannot read a release number from vLLM version 'dev': name the release it is "
        "based on with --base RELEASE"
    ), out
    assert full_snapshot(small_tree) == before
    status, out = run(capsys, command, small_tree, "--base", NEWEST.version)
    assert status == 0, out


@pytest.mark.parametrize("command", COMMANDS)
def test_a_git_tree_that_git_refuses_is_said_to_be_refused(
    small_tree: Path,
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = full_snapshot(small_tree)
    monkeypatch.setenv("GIT_TEST_ASSUME_DIFFERENT_OWNER", "1")  # as if another user owned it
    status, out = run(capsys, command, small_tree)
    assert status == 1, out
    assert only_line(out) == (
        f"sr-prefetch: git refuses the git tree at {small_tree} (fatal: detected dubious "
        f"ownership in repository at '{small_tree}'): run as its owner, or trust it with "
        f"git config --global --add safe.directory {small_tree}"
    )
    assert full_snapshot(small_tree) == before
    assert tree.find_tree(small_tree) == small_tree


def test_a_fetch_killed_before_its_rename_leaves_nothing_for_long(tmp_path: Path) -> None:
    """The next fetch removes a dead fetch's staging folder, and keeps a live one's."""
    from vllm_patch import sources

    target = tmp_path / "vllm-0.33.0"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"vllm-0.33.0.{dead.pid}.abc123"
    live = tmp_path / f"vllm-0.33.0.{os.getpid()}.def456"
    other = tmp_path / "vllm-0.30.0.1.abc"
    for folder in (stale, live, other):
        (folder / "vllm").mkdir(parents=True)
    sources._remove_stale_stagings(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_ctrl_c_while_the_command_line_loads_is_one_line() -> None:
    """A KeyboardInterrupt raised as vllm_patch.cli is imported (the first fraction of a
    second, before cli's own handler is in place): exit 130, one line."""
    code = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vllm_patch.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "import vllm_patch\n"
        "vllm_patch.entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 130, done
    assert done.stdout == "" and done.stderr == (
        "sr-prefetch: interrupted while starting; nothing was changed\n"
    )
