"""Changing a vLLM tree's files as one transaction that no crash can leave half done.

`replace_files` writes a journal into the tree (JOURNAL: each file's old and new
bytes and modes, the directories it makes and removes) before it touches any other
file, and every command calls `settle` first: it finishes a committed journal and
undoes one marked for undo.  Why every instant of kill -9, full disk or power loss
is one that `settle` brings to "as before" or "as after":

- Until MANIFEST is in place, nothing outside the journal was touched.  It is
  renamed into place only after every blob it names, and itself, were fsynced, and
  the journal directory is fsynced before the first target file is touched; a
  journal without it is deleted, nothing else.
- With MANIFEST, each step on the tree is idempotent and reads only fsynced journal
  data, checked before the first step: MANIFEST against its own sha256, every blob
  against the size and sha256 it records, every path as one inside the tree and
  outside the journal, and no file in the journal that it does not name.  Where only
  a new blob fails, settle undoes from the old bytes; any other failure refuses the
  journal whole, and nothing is written.  A file is replaced whole:
  its bytes are written beside it and fsynced, then renamed over it (atomic) and its
  directory fsynced; so each target is wholly old or wholly new, and settle can redo
  every step, or undo every step from the old bytes, whatever subset was done.
- A failure inside the process (an OSError, Ctrl-C) renames MANIFEST to ROLLBACK and
  undoes; settle reads ROLLBACK as "undo", so an undo cut short is finished too.
- The journal goes once every step was fsynced, its marker first: a journal without
  a marker is always safe to delete.

A non-blocking flock on the vllm/ directory, held by a transaction and by settle,
keeps a second command from settling a journal that a live one is writing.
Every change to the disk goes through the six primitives below (`_mkdir` ... `_rmdir`),
the steps a crash can fall between.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

JOURNAL = "vllm/.sr-prefetch-journal"
"""Where a transaction keeps its journal while it runs (removed when it ends)."""
MANIFEST = "manifest.json"
ROLLBACK = "rollback.json"
_PART = "manifest.json.part"


class JournalError(Exception):
    """A transaction could not start, or its undo could not finish; the message says
    what to do."""


@dataclass
class _File:
    path: str
    old: bytes | None
    old_mode: int | None
    new: bytes | None
    new_mode: int | None


@dataclass
class _Plan:
    what: str
    files: list[_File] = field(default_factory=list)
    made: list[str] = field(default_factory=list)
    """Directories the transaction makes, parents first."""
    removed: list[tuple[str, int]] = field(default_factory=list)
    """Directories it removes (emptied), deepest first, with their modes."""


# --- the primitives: the only calls that change the disk ------------------------------------


def _mkdir(path: Path, mode: int | None = None) -> None:
    os.mkdir(path)
    if mode is not None:
        os.chmod(path, mode)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(source: Path, destination: Path) -> None:
    os.replace(source, destination)


def _unlink(path: Path) -> None:
    os.unlink(path)


def _rmdir(path: Path) -> None:
    os.rmdir(path)


# --- the transaction ------------------------------------------------------------------------


def replace_files(
    root: Path,
    changes: Mapping[str, bytes | None],
    prune: Iterable[str] = (),
    what: str = "change",
    made: Callable[[str], None] | None = None,
) -> None:
    """Writes (bytes) or removes (None) each path under `root`, keeping the modes of the
    files it replaces, then removes the directories in `prune` and above them that this
    leaves empty: all of it or, after any failure, none of it (module docstring).

    `made(what)` is called once every step is done, inside the transaction: an exception
    before it returns still undoes them all; from its return on, the change stands (the
    journal's removal, cut short, is finished by the next command).  The command line
    takes Ctrl-C from then on as "the change is kept", not "undone" (cli.py)."""
    with _locked(root):
        _settle_locked(root)
        plan = _plan(root, changes, prune, what)
        if not plan.files and not plan.removed:
            return
        journal = root / JOURNAL
        try:
            _prepare(root, plan)
        except BaseException:
            with contextlib.suppress(OSError):
                _remove_journal(root)
            raise
        try:
            _forward(root, plan)
            if made is not None:
                made(what)
        except BaseException as error:
            try:
                _replace(journal / MANIFEST, journal / ROLLBACK)
                _fsync(journal)
                _backward(root, plan)
                _remove_journal(root)
            except BaseException as undo_error:
                raise JournalError(
                    f"the {what} of {root} failed ({_said(error)}) and undoing it failed "
                    f"too ({_said(undo_error)}); the next sr-prefetch command on {root} "
                    "finishes undoing it"
                ) from error
            raise
        _remove_journal(root)


def _said(error: BaseException) -> str:
    return str(error) or type(error).__name__


def settle(root: Path) -> str | None:
    """Finishes or undoes a transaction that was cut short in `root`; says which, or
    None where there was none."""
    if not os.path.lexists(root / JOURNAL):
        return None
    with _locked(root):
        return _settle_locked(root)


def _settle_locked(root: Path) -> str | None:
    journal = root / JOURNAL
    if not os.path.lexists(journal):
        return None
    if journal.is_symlink() or not journal.is_dir():
        raise JournalError(
            f"{journal} is not a folder, and sr-prefetch keeps its journal there: remove "
            f"it (rm {journal}) and run the command again; nothing was changed"
        )
    if (journal / MANIFEST).is_file():
        try:
            plan = _load(root, MANIFEST)
        except _DamagedNewBlob as damage:
            # The old bytes are intact: the tree goes back to them, as after a failure.
            plan = _load(root, MANIFEST, kinds=("old",))
            _replace(journal / MANIFEST, journal / ROLLBACK)
            _fsync(journal)
            _backward(root, plan)
            message = f"undid the {plan.what} that was cut short, as {damage}"
        else:
            _forward(root, plan)
            message = f"finished the {plan.what} that was cut short"
    elif (journal / ROLLBACK).is_file():
        plan = _load(root, ROLLBACK, kinds=("old",))
        _backward(root, plan)
        message = f"undid the {plan.what} that was cut short"
    else:
        message = "removed the journal of a command cut short before it changed anything"
    _remove_journal(root)
    return f"{root}: {message}"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    fd = os.open(root / "vllm", os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(
                f"another sr-prefetch command is changing {root}; run this one when it ends"
            ) from None
        yield
    finally:
        os.close(fd)


def _plan(
    root: Path, changes: Mapping[str, bytes | None], prune: Iterable[str], what: str
) -> _Plan:
    umask = os.umask(0)
    os.umask(umask)
    plan = _Plan(what)
    for path, new in changes.items():
        target = root / path
        old = target.read_bytes() if target.is_file() else None
        if old == new:
            continue
        mode = target.stat().st_mode & 0o7777 if old is not None else None
        plan.files.append(_File(path, old, mode, new, mode if mode is not None else 0o666 & ~umask))
        if new is not None:
            for parent in reversed(Path(path).parents[:-1]):
                name = parent.as_posix()
                if not (root / parent).is_dir() and name not in plan.made:
                    plan.made.append(name)
    removed = {f.path for f in plan.files if f.new is None}
    plan.removed = _emptied(root, removed, prune)
    return plan


def _emptied(root: Path, removed: set[str], tops: Iterable[str]) -> list[tuple[str, int]]:
    """The directories in and above `tops` (up to `root`) left empty once `removed` go,
    deepest first."""
    emptied: list[tuple[str, int]] = []
    gone = set(removed)
    for top in tops:
        start = root / top
        if not start.is_dir():
            continue
        for directory, dirs, files in os.walk(start, topdown=False):
            relative = Path(directory).relative_to(root).as_posix()
            children = [f"{relative}/{name}" for name in dirs + files]
            if all(child in gone for child in children) and relative not in gone:
                gone.add(relative)
                emptied.append((relative, os.stat(directory).st_mode & 0o7777))
        if top not in gone:
            continue
        above = start.parent
        while above != root:
            relative = above.relative_to(root).as_posix()
            if relative in gone:
                break
            if not all(f"{relative}/{name}" in gone for name in os.listdir(above)):
                break
            gone.add(relative)
            emptied.append((relative, above.stat().st_mode & 0o7777))
            above = above.parent
    return emptied


def _prepare(root: Path, plan: _Plan) -> None:
    journal = root / JOURNAL
    _mkdir(journal)
    _fsync(journal.parent)
    entries = []
    for index, file in enumerate(plan.files):
        for kind, data in (("old", file.old), ("new", file.new)):
            if data is not None:
                _write(journal / f"{index}.{kind}", data, 0o600)
                _fsync(journal / f"{index}.{kind}")
        entries.append({"path": file.path, "old_mode": file.old_mode, "new_mode": file.new_mode})
        entries[-1].update(old=_blob_record(file.old), new=_blob_record(file.new))
    body = {"what": plan.what, "files": entries, "made": plan.made, "removed": plan.removed}
    manifest = {"sha256": _digest(_canonical(body)), "plan": body}
    _write(journal / _PART, json.dumps(manifest, indent=1).encode(), 0o600)
    _fsync(journal / _PART)
    _replace(journal / _PART, journal / MANIFEST)
    _fsync(journal)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical(body: object) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def _blob_record(data: bytes | None) -> dict[str, object] | None:
    """What MANIFEST records of a blob: its size and sha256; None where there is none."""
    return None if data is None else {"size": len(data), "sha256": _digest(data)}


class _Damaged(ValueError):
    """The journal is not as sr-prefetch wrote it."""


class _DamagedNewBlob(_Damaged):
    """A new-bytes blob is not as written; the old bytes may still be replayed."""


def _load(root: Path, marker: str, kinds: tuple[str, ...] = ("old", "new")) -> _Plan:
    """The plan `marker` records, with the blobs of `kinds` (the others left None), all
    of it checked first (module docstring).  Raises _DamagedNewBlob where only a new
    blob fails its check, JournalError for any other damage."""
    journal = root / JOURNAL
    try:
        return _read(root, journal, marker, kinds)
    except _DamagedNewBlob:
        raise
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise JournalError(
            f"{journal / marker} cannot be replayed ({error}): sr-prefetch did not write it as "
            "it is, and changed nothing; put the files it names back by hand (git checkout, "
            f"or reinstall vLLM) and remove {journal}"
        ) from None


def _read(root: Path, journal: Path, marker: str, kinds: tuple[str, ...]) -> _Plan:
    manifest = json.loads((journal / marker).read_bytes())
    body = _typed(manifest["plan"], dict)
    if _digest(_canonical(body)) != manifest["sha256"]:
        raise _Damaged(f"{marker} is not the manifest its sha256 names")
    plan = _Plan(_typed(body["what"], str), made=_typed(body["made"], list))
    plan.removed = [(path, _mode(mode)) for path, mode in body["removed"]]
    names = {marker}
    for index, entry in enumerate(_typed(body["files"], list)):
        blob: dict[str, bytes | None] = {}
        for kind in ("old", "new"):
            if entry[kind] is not None:
                names.add(f"{index}.{kind}")
            blob[kind] = _blob(journal, f"{index}.{kind}", entry[kind]) if kind in kinds else None
        plan.files.append(
            _File(
                entry["path"],
                blob["old"],
                None if entry["old"] is None else _mode(entry["old_mode"]),
                blob["new"],
                None if entry["new"] is None else _mode(entry["new_mode"]),
            )
        )
    extra = sorted(set(os.listdir(journal)) - names)
    if extra:
        raise _Damaged(f"the journal holds files it does not name: {', '.join(extra)}")
    for path in [*plan.made, *(p for p, _ in plan.removed), *(f.path for f in plan.files)]:
        _check_inside(root, path)
    return plan


def _typed(value: object, kind: type) -> object:
    if not isinstance(value, kind):
        raise _Damaged(f"{value!r} where a {kind.__name__} belongs")
    return value


def _mode(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0o7777:
        raise _Damaged(f"{value!r} is not a file mode")
    return value


def _blob(journal: Path, name: str, record: object) -> bytes | None:
    """The blob `name` that MANIFEST records as `record`, after its size and sha256
    are checked."""
    if record is None:
        return None
    record = _typed(record, dict)
    damaged = _DamagedNewBlob if name.endswith(".new") else _Damaged
    try:
        data = (journal / name).read_bytes()
    except FileNotFoundError:
        raise damaged(f"its blob {name} is missing") from None
    if len(data) != record["size"]:
        raise damaged(f"its blob {name} is {len(data)} bytes, not the {record['size']} written")
    if _digest(data) != record["sha256"]:
        raise damaged(f"its blob {name} is not the bytes its sha256 names")
    return data


def _check_inside(root: Path, path: object) -> None:
    """`path` names a place in the tree: relative, no `..`, not the journal, and no
    symlink on the way leads out of `root`."""
    pure = PurePosixPath(_typed(path, str))
    journal = PurePosixPath(JOURNAL)
    if (
        pure.is_absolute()
        or pure.as_posix() != path
        or any(part in ("", ".", "..") for part in pure.parts)
        or pure == journal
        or journal in pure.parents
    ):
        raise _Damaged(f"{path!r} is not a path inside the tree")
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(root / pure.parent)
    if os.path.commonpath([real_root, real_parent]) != real_root:
        raise _Damaged(f"{path!r} leads out of the tree")


def _forward(root: Path, plan: _Plan) -> None:
    for directory in plan.made:
        if not (root / directory).is_dir():
            _mkdir(root / directory)
            _fsync((root / directory).parent)
    for file in plan.files:
        _put(root, file.path, file.new, file.new_mode)
    for directory, _ in plan.removed:
        if (root / directory).is_dir():
            _rmdir(root / directory)
            _fsync((root / directory).parent)


def _backward(root: Path, plan: _Plan) -> None:
    for directory, mode in reversed(plan.removed):
        if not (root / directory).is_dir():
            _mkdir(root / directory, mode)
            _fsync((root / directory).parent)
    for file in reversed(plan.files):
        _put(root, file.path, file.old, file.old_mode)
    for directory in reversed(plan.made):
        if (root / directory).is_dir():
            _rmdir(root / directory)
            _fsync((root / directory).parent)


def _put(root: Path, path: str, data: bytes | None, mode: int | None) -> None:
    """Makes `path` hold `data` with `mode` (None: not exist), idempotently."""
    target = root / path
    staged = target.with_name(f".{target.name}.sr-prefetch")
    if os.path.lexists(staged):
        _unlink(staged)
        _fsync(target.parent)
    if data is None:
        if os.path.lexists(target):
            _unlink(target)
            _fsync(target.parent)
        return
    assert mode is not None
    if _holds(target, data, mode):
        return
    _write(staged, data, mode)
    _fsync(staged)
    _replace(staged, target)
    _fsync(target.parent)


def _holds(target: Path, data: bytes, mode: int) -> bool:
    try:
        return target.stat().st_mode & 0o7777 == mode and target.read_bytes() == data
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
            return False
        raise


def _remove_journal(root: Path) -> None:
    journal = root / JOURNAL
    if not journal.is_dir():
        return
    for marker in (MANIFEST, ROLLBACK):
        if (journal / marker).exists():
            _unlink(journal / marker)
            _fsync(journal)
    for entry in sorted(journal.iterdir()):
        _unlink(entry)
    _rmdir(journal)
    _fsync(journal.parent)
