"""apply and revert cut short at any instant: the next command leaves the tree as before or
as after, byte for byte (contents, modes, directory entries), never half patched.

- Fault injection: apply's and revert's writes are one `journal.replace_files` call,
  recorded from the real command on vLLM 0.33.0 (the release with the most files) in a
  git tree and in an installed-style tree.  It is replayed once per primitive I/O
  operation k (every directory made or removed, file written, fsync, rename, removal),
  with the k-th failing: as an OSError (the process lives and undoes), as a crash (it
  and every later operation never happen; a write cut short leaves half its bytes), or
  as a power loss (a crash that also cuts short every file written and not fsynced).
- A real kill -9 loop: `python -m vllm_patch apply|revert PATH` killed at random
  instants, each followed by `status` in a new process.
- The defects the journal's commit fixed: residue of a refused apply, check on a tree
  it cannot write, a file with no edit kept and reported changed, Ctrl-C's traceback.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import random
import shutil
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_patch.helpers import TREE_FILES, commit, git, tree_files
from vllm_patch import cli, journal, releases

REPO = Path(__file__).resolve().parents[2]
PRIMITIVES = ("_mkdir", "_write", "_fsync", "_replace", "_unlink", "_rmdir")
EXECUTABLE = "vllm/v1/worker/gpu_model_runner.py"
"""A file given mode 0o755 in every test tree: its mode must survive apply and revert."""
READ_ONLY_FILE = "vllm/envs.py"
"""A file given mode 0o444 in the trees that are not git trees (git keeps only 0o755)."""


def full_snapshot(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under `root` (but a top-level .git): its type, mode and, for a
    file, sha256: equal snapshots, equal trees."""
    entries: dict[str, tuple[Any, ...]] = {}
    for directory, dirs, files in os.walk(root):
        relative = Path(directory).relative_to(root)
        if relative == Path("."):
            dirs[:] = [name for name in dirs if name != ".git"]
        for name in dirs + files:
            path = Path(directory) / name
            info = os.lstat(path)
            key = (relative / name).as_posix()
            if stat.S_ISREG(info.st_mode):
                entries[key] = ("file", stat.S_IMODE(info.st_mode), _digest(path, info))
            else:
                entries[key] = (stat.filemode(info.st_mode), stat.S_IMODE(info.st_mode))
    return entries


_DIGESTS: dict[tuple[int, ...], str] = {}


def _digest(path: Path, info: os.stat_result) -> str:
    """sha256 of the file, remembered per inode and version: the fault loops' trees share
    the unchanged files by hard links (copy_tree), which sr-prefetch replaces, never edits."""
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _DIGESTS[key]


def small_installed(source: Path, root: Path, release: releases.Release) -> Path:
    """An installed vLLM as pip leaves one, of the files sr-prefetch reads and changes:
    the package beside its vllm-*.dist-info, no git."""
    for path in tree_files(release):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes((source / path).read_bytes())
    dist = root / f"vllm-{release.version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {release.version}\n"
    )
    os.chmod(root / EXECUTABLE, 0o755)
    os.chmod(root / READ_ONLY_FILE, 0o444)
    return root


def small_git(source: Path, root: Path) -> Path:
    """A git tree of the newest release's files that sr-prefetch reads and changes."""
    for path in TREE_FILES:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes((source / path).read_bytes())
    os.chmod(root / EXECUTABLE, 0o755)
    git(root, "init", "-q")
    git(root, "add", "--all")
    commit(root, f"vLLM v{releases.NEWEST.version}")
    git(root, "tag", f"v{releases.NEWEST.version}")
    return root


def copy_tree(source: Path, destination: Path, linked: bool = False) -> Path:
    """A copy of the tree at `source` (its files hard-linked where `linked`: the journal
    writes new files and renames them over the old, so a link is never written through)."""
    shutil.rmtree(destination, ignore_errors=True)
    shutil.copytree(
        source, destination, symlinks=True, copy_function=os.link if linked else shutil.copy2
    )
    return destination


def sr_prefetch(*args: str | Path) -> tuple[int, str]:
    """sr-prefetch's exit status and all it printed, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = cli.main([str(arg) for arg in args])
    return status, out.getvalue()


# --- fault injection ---------------------------------------------------------------------------


class Crash(BaseException):
    """The process died at this operation: nothing after it happens (not even the undo)."""


@dataclass
class Transaction:
    """One command's call of journal.replace_files, and the trees around it."""

    start: Path
    """A copy of the tree as the command found it."""
    arguments: tuple[Any, ...]
    before: dict[str, tuple[Any, ...]]
    after: dict[str, tuple[Any, ...]]
    operations: list[tuple[str, str]] = field(default_factory=list)
    """(primitive, path) of each operation of the unfaulted transaction, in order."""


@contextlib.contextmanager
def injected(fault_at: int | None, mode: str) -> Iterator[list[tuple[str, str]]]:
    """journal's primitives, counted; the `fault_at`-th fails as `mode` says ("error",
    "crash", "power").  fsync is counted, not done: what it guarantees is modelled
    (a power loss cuts short the files written since their last fsync)."""
    log: list[tuple[str, str]] = []
    unsynced: set[str] = set()
    real = {name: getattr(journal, name) for name in PRIMITIVES}
    dead = False

    def counted(name: str) -> Callable[..., None]:
        def primitive(*args: Any) -> None:
            nonlocal dead
            if dead:
                raise Crash
            path = str(args[0])
            log.append((name, path))
            if len(log) == fault_at:
                if mode == "error":
                    raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
                dead = True
                if name == "_write":  # killed in the middle of writing
                    Path(path).write_bytes(args[1][: len(args[1]) // 2])
                    unsynced.add(path)
                if mode == "power":
                    for lost in unsynced:
                        if os.path.isfile(lost):
                            os.truncate(lost, os.path.getsize(lost) // 2)
                raise Crash
            if name == "_fsync":
                unsynced.discard(path)
                return
            real[name](*args)
            if name == "_write":
                unsynced.add(path)
            elif name == "_replace" and path in unsynced:
                unsynced.discard(path)
                unsynced.add(str(args[1]))
            elif name == "_unlink":
                unsynced.discard(path)

        return primitive

    with pytest.MonkeyPatch.context() as patched:
        for name in PRIMITIVES:
            patched.setattr(journal, name, counted(name))
        yield log


def recorded(command: list[str | Path], root: Path, copies: Path) -> Transaction:
    """Runs the command on `root`, recording its call of journal.replace_files."""
    start = copy_tree(root, copies / f"start-{command[0]}")
    calls = []
    real = journal.replace_files

    def spy(*args: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))
        real(*args, **kwargs)

    before = full_snapshot(root)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(journal, "replace_files", spy)
        status, out = sr_prefetch(*command)
    assert status == 0, out
    ((args, kwargs),) = calls
    assert args[0] == root
    arguments = (args[1], kwargs.get("prune", ()), kwargs.get("what", "change"))
    transaction = Transaction(start, arguments, before, full_snapshot(root))
    # The same call on a copy, counted: what the command wrote, it wrote through it.
    replay = copy_tree(start, copies / "replay")
    with injected(None, "none") as log:
        journal.replace_files(replay, *arguments)
    assert full_snapshot(replay) == transaction.after
    transaction.operations = log
    return transaction


@pytest.fixture(scope="module", params=["git", "installed"])
def transactions(
    request: pytest.FixtureRequest, pristine: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Transaction]:
    """apply's and revert's transactions (reset design, vLLM 0.33.0) in a tree of the kind."""
    base = tmp_path_factory.mktemp(f"faults-{request.param}")
    if request.param == "git":
        root = small_git(pristine, base / "tree")
    else:
        root = small_installed(pristine, base / "tree", releases.NEWEST)
    apply = recorded(["apply", root], root, base)
    revert = recorded(["revert", root], root, base)
    assert revert.after == apply.before
    return {"apply": apply, "revert": revert}


@pytest.mark.parametrize("mode", ["error", "crash", "power"])
@pytest.mark.parametrize("command", ["apply", "revert"])
def test_a_fault_at_every_operation(
    transactions: dict[str, Transaction],
    command: str,
    mode: str,
    tmp_path: Path,
) -> None:
    transaction = transactions[command]
    operations = transaction.operations
    assert {name for name, _ in operations} == set(PRIMITIVES)
    # From here on the journal is being removed: every change to the tree is done.
    done_at = next(
        k
        for k, (name, path) in enumerate(operations, 1)
        if name == "_unlink" and path.endswith(f"{journal.JOURNAL}/{journal.MANIFEST}")
    )
    outcomes: dict[bool, Path] = {}
    rng = random.Random(f"{command}-{mode}")
    for k in range(1, len(operations) + 1):
        root = copy_tree(transaction.start, tmp_path / "tree", linked=True)
        where = f"fault at operation {k} of {len(operations)}: {operations[k - 1]}"
        # A crash also stops the undo, which says so (JournalError) where it began one.
        expected = OSError if mode == "error" else (Crash, journal.JournalError)
        with injected(k, mode), pytest.raises(expected):
            journal.replace_files(root, *transaction.arguments)
        if mode == "error" and k < done_at:
            # Undone in the process: as before at once, no journal left.
            assert full_snapshot(root) == transaction.before, where
            continue
        if mode != "error":
            # The next command may itself be killed while it settles; the one after finishes.
            with injected(rng.randint(1, 40), "crash"), contextlib.suppress(Crash):
                journal.settle(root)
        journal.settle(root)
        state = full_snapshot(root)
        assert state in (transaction.before, transaction.after), where
        if (state == transaction.after) not in outcomes:
            outcomes[state == transaction.after] = copy_tree(root, tmp_path / f"{k}")
    # Each way it came out, then status, then revert or apply: back to the other state.
    # (Once per outcome, in one mode: the state is one of two snapshots, which these
    # commands are tested on with every kind of tree elsewhere.)
    for forward, root in outcomes.items() if mode == "crash" else ():
        applied = forward == (command == "apply")
        status, out = sr_prefetch("status", root)
        assert status == 0 and f"Design applied: {'reset' if applied else 'none'}" in out, out
        status, out = sr_prefetch("revert" if applied else "apply", root)
        assert status == 0, out
        clean = transaction.before if command == "apply" else transaction.after
        dirty = transaction.after if command == "apply" else transaction.before
        assert full_snapshot(root) == (clean if applied else dirty)
    assert set(outcomes) == ({True} if mode == "error" else {False, True})
