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
- A refused apply or revert leaves nothing behind, check says when it cannot write the
  tree, a file with no edit is neither kept nor reported changed, and Ctrl-C undoes and
  exits 130 with one line.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_patch.helpers import (
    TREE_FILES,
    commit,
    full_snapshot,
    git,
    read_only,
    tree_files,
)
from vllm_patch import cli, journal, patch, releases, sources
from vllm_patch.releases import Design
from vllm_patch.targets import mamba_mixer2, mamba_ssm

REPO = Path(__file__).resolve().parents[2]
PRIMITIVES = ("_mkdir", "_write", "_fsync", "_replace", "_unlink", "_rmdir")
EXECUTABLE = "vllm/v1/worker/gpu_model_runner.py"
"""A file given mode 0o755 in every test tree: its mode must survive apply and revert."""
READ_ONLY_FILE = "vllm/envs.py"
"""A file given mode 0o444 in the trees that are not git trees (git keeps only 0o755)."""
SYMLINKED = mamba_ssm.PATH
"""A target file that is a relative symlink, in every test tree, to LINKED: apply and
revert write through it, and it stays a link."""
LINKED = "vllm/model_executor/layers/mamba/ops/mamba_ssm_impl.py"
NOT_UTF8 = os.fsdecode(b"vllm/model_executor/layers/mamba/ops/notes-caf\xe9.txt")
"""A file beside the targets whose name and bytes are latin-1, in every test tree: the
journal writes beside it and must leave it as it is."""


def odd_files(root: Path) -> None:
    """Makes SYMLINKED a symlink to LINKED, and writes NOT_UTF8."""
    (root / SYMLINKED).rename(root / LINKED)
    (root / SYMLINKED).symlink_to(Path(LINKED).name)
    (root / NOT_UTF8).write_bytes(b"caf\xe9\n")


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
    odd_files(root)
    return root


def small_git(source: Path, root: Path) -> Path:
    """A git tree of the newest release's files that sr-prefetch reads and changes."""
    for path in TREE_FILES:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes((source / path).read_bytes())
    os.chmod(root / EXECUTABLE, 0o755)
    odd_files(root)
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
    # The symlinked target was written through, and is a link still.
    assert apply.after[SYMLINKED] == apply.before[SYMLINKED] == ("symlink", Path(LINKED).name)
    assert apply.after[LINKED] != apply.before[LINKED]
    assert apply.after[NOT_UTF8] == apply.before[NOT_UTF8]
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


# --- kill -9 ----------------------------------------------------------------------------------

KILL_TRIALS = 200
KILL_DESIGN = Design.FORWARD_CONTEXT
"""The kill loop's design: its apply parses the small files only (the reset design also
parses the model runners, ~4x the time before the first write), and still writes the
kept originals, the vendored package and its directories."""


def _sr_prefetch_process(*args: str | Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "vllm_patch", *map(str, args)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _journal_window(root: Path, *args: str | Path) -> tuple[float, float, float]:
    """When, after its start, the command's journal was first and last seen, and when it
    ended (polled every millisecond)."""
    start = time.monotonic()
    process = _sr_prefetch_process(*args)
    seen: list[float] = []
    while process.poll() is None:
        if (root / journal.JOURNAL).exists():
            seen.append(time.monotonic() - start)
        time.sleep(0.001)
    out = process.communicate()[0].decode()
    assert process.returncode == 0 and seen, out
    return seen[0], seen[-1], time.monotonic() - start


def test_kill_9_at_random_instants(pristine: Path, tmp_path: Path) -> None:
    """KILL_TRIALS runs of apply or revert on installed-style trees, each killed (SIGKILL)
    at a random instant, mostly while its journal exists; then `status` in a new process
    must settle the tree to exactly the clean or the applied one."""
    trees = [
        small_installed(pristine, tmp_path / f"site-{n}", releases.NEWEST)
        for n in range(max(2, os.cpu_count() or 2))
    ]
    clean = full_snapshot(trees[0])
    apply_window = _journal_window(trees[0], "apply", trees[0], "--design", KILL_DESIGN)
    applied = full_snapshot(trees[0])
    revert_window = _journal_window(trees[0], "revert", trees[0])
    assert full_snapshot(trees[0]) == clean
    # A quarter of the kills at any instant of the run; the others at a random instant
    # of the journal's life, counted from when it appears (the load of the machine moves
    # it), as long as it lasted in the run above and a tenth more.
    rng = random.Random(0)
    windows = {"apply": apply_window, "revert": revert_window}
    delays = {
        command: [
            (True, rng.uniform(0, 1.1 * (last - first))) if n % 4 else (False, rng.uniform(0, end))
            for n in range(KILL_TRIALS)
        ]
        for command, (first, last, end) in windows.items()
    }
    results: list[tuple[str, bool, bool]] = []  # command, journal left, rolled forward
    failures: list[str] = []
    lock = threading.Lock()

    def trials(root: Path) -> None:
        state = clean
        while True:
            with lock:
                if len(results) >= KILL_TRIALS or failures:
                    return
                trial = len(results)
                results.append(("", False, False))
            command = "apply" if state is clean else "revert"
            args = ("--design", KILL_DESIGN) if command == "apply" else ()
            process = _sr_prefetch_process(command, root, *args)
            from_journal, delay = delays[command][trial]
            if from_journal:  # not before 0.7 of the journal's first sighting; then polled
                time.sleep(0.7 * windows[command][0])
            while from_journal and process.poll() is None:
                if (root / journal.JOURNAL).exists():
                    break
                time.sleep(0.002)
            time.sleep(delay)
            process.kill()
            process.communicate()
            left = (root / journal.JOURNAL).exists()
            status = _sr_prefetch_process("status", root)
            out = status.communicate()[0].decode()
            now = full_snapshot(root)
            if status.returncode != 0 or now not in (clean, applied) or "partly" in out:
                with lock:
                    failures.append(f"trial {trial}, {command} killed: status says\n{out}")
                return
            forward = (now == applied) == (command == "apply")
            with lock:
                results[trial] = (command, left, forward)
            state = clean if now == clean else applied

    start = time.monotonic()
    workers = [threading.Thread(target=trials, args=(root,)) for root in trees]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - start
    assert not failures, failures[0]
    cut_short = [r for r in results if r[1]]
    print(
        f"\n{len(results)} kills in {elapsed:.0f} s on {len(trees)} trees: "
        f"{len(cut_short)} left a journal ({sum(r[2] for r in cut_short)} finished, "
        f"{sum(not r[2] for r in cut_short)} undone by status); "
        f"{sum(r[0] == 'revert' for r in results)} were reverts"
    )
    assert len(results) == KILL_TRIALS
    # The loop tests something only where kills land inside the transaction, both ways.
    assert len(cut_short) >= KILL_TRIALS // 10
    assert {r[2] for r in cut_short} == {False, True}


# --- refusals, reports and Ctrl-C ------------------------------------------------------------


@pytest.fixture
def installed_033(pristine: Path, tmp_path: Path) -> Path:
    return small_installed(pristine, tmp_path / "site", releases.NEWEST)


def test_a_read_only_directory_is_refused_and_leaves_nothing_behind(
    installed_033: Path,
) -> None:
    before = full_snapshot(installed_033)
    with read_only(installed_033 / "vllm/v1/worker/gpu"):
        status, out = sr_prefetch("apply", installed_033)
        assert full_snapshot(installed_033) == before
        assert status == 1 and "vllm/v1/worker/gpu is not writable" in out, out
        assert "nothing was changed" in out


def test_check_says_when_it_cannot_write_the_tree(installed_033: Path) -> None:
    with read_only(installed_033 / "vllm/v1/worker/gpu"):
        status, out = sr_prefetch("check", installed_033)
    assert status == 1 and "would NOT apply" in out, out
    assert "read-only      vllm/v1/worker/gpu" in out and "is not writable" in out


def test_revert_refuses_a_read_only_directory(installed_033: Path) -> None:
    assert sr_prefetch("apply", installed_033, "--design", Design.FORWARD_CONTEXT)[0] == 0
    applied = full_snapshot(installed_033)
    with read_only(installed_033 / "vllm/model_executor/layers/mamba"):
        status, out = sr_prefetch("revert", installed_033)
        assert status == 1 and "mamba is not writable" in out, out
        assert full_snapshot(installed_033) == applied


def test_a_file_with_no_edit_is_neither_kept_nor_reported_changed(
    tmp_path: Path,
) -> None:
    # vLLM 0.26.0's mamba_mixer2.py has no Triton ReplaySSM call, so no edit: the
    # patch leaves it out of every report and keeps no copy of it.
    release = releases.get("0.26.0")
    files = sources.release_files(release, tree_files(release))
    source = tmp_path / "files"
    for path, data in files.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(data)
    site = small_installed(source, tmp_path / "site", release)
    before = full_snapshot(site)
    status, out = sr_prefetch("check", site)
    assert status == 0 and mamba_mixer2.PATH not in out, out
    status, out = sr_prefetch("apply", site)
    assert status == 0 and mamba_mixer2.PATH not in out, out
    assert not (site / patch.ORIGINALS / mamba_mixer2.PATH).exists()
    assert full_snapshot(site)[mamba_mixer2.PATH] == before[mamba_mixer2.PATH]
    status, out = sr_prefetch("status", site)
    assert status == 0 and mamba_mixer2.PATH not in out, out
    status, out = sr_prefetch("revert", site)
    assert status == 0 and mamba_mixer2.PATH not in out, out
    assert full_snapshot(site) == before


def test_ctrl_c_during_apply_undoes_it_and_exits_130_with_one_line(
    installed_033: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = full_snapshot(installed_033)
    real_replace = os.replace
    calls = []

    def interrupted(source: Any, destination: Any) -> None:
        calls.append(destination)
        if len(calls) == 3:  # after the journal's commit and a first file replaced
            raise KeyboardInterrupt
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", interrupted)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status = cli.main(["apply", str(installed_033), "--design", "forward-context"])
    except BaseException as error:
        pytest.fail(f"sr-prefetch let {type(error).__name__} out of main()")
    monkeypatch.undo()
    assert len(calls) > 3  # the undo renamed files back
    assert status == 130 and err.getvalue() == "sr-prefetch: interrupted; nothing was changed\n"
    assert full_snapshot(installed_033) == before


def test_a_journal_that_a_live_command_holds_is_left_to_it(installed_033: Path) -> None:
    (installed_033 / journal.JOURNAL).mkdir()
    fd = os.open(installed_033 / "vllm", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        status, out = sr_prefetch("status", installed_033)
        assert status == 1 and "another sr-prefetch command is changing" in out, out
        assert (installed_033 / journal.JOURNAL).is_dir()
    finally:
        os.close(fd)
    # Once it is gone, the next command settles what it left (here: nothing committed).
    status, out = sr_prefetch("status", installed_033)
    assert status == 0 and "before it changed anything" in out, out
    assert not (installed_033 / journal.JOURNAL).exists()
