"""Applying a design to a vLLM target, checking it, reading it back, taking it out.

Nothing is written until every file's new content is known and every directory
to write is writable: the operations run in memory, and the writes are one
transaction (journal.py), so a refused, failed or killed command leaves the target
as it was or, where it was killed after its changes were committed, as it would
have left it.  The command line settles a transaction cut short (journal.settle)
before it calls any of these.
A file that the design leaves as it is (no edit in this release) is not written,
kept or reported as changed.

What is applied is read from the files themselves, not from a record kept
beside them: a design is applied when each of its files, taken back out
structurally (syntax.revert_all), gives a text that the design turns into
that file again, byte for byte.  That holds as well for a tree patched by
`git am` as for one patched by `apply`.  An installed vLLM also keeps the
files `apply` replaced (ORIGINALS), and `revert` gives those back as they were.
"""

from __future__ import annotations

import enum
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import fork_test, journal, targets, vendor
from .gitrepo import dirty_paths
from .releases import Design, Release, pristine_sha256
from .syntax import FileOperations, SiteError, UnparsableError, apply_all, each_edit, revert_all
from .targets import ssu_dispatch
from .tree import Kind, Target

ORIGINALS = "vllm/.sr-prefetch-originals"
"""Where `apply` keeps an installed vLLM's replaced files (inside the package, so that
they go wherever it goes); `revert` restores them and removes the folder."""


class PatchError(Exception):
    """The command is refused; the message says why and what to do instead."""


class PartlyPatched(PatchError):
    """The target holds traces of a design but no whole one."""


class NotUtf8(PatchError):
    """A file the patch reads is not UTF-8 text, as vLLM's sources are."""


class NotLfText(PatchError):
    """A file the patch changes has CR line endings, which vLLM's sources do not."""


class SymlinkOutside(PatchError):
    """A file the patch changes is a symlink that leads out of the tree."""


class TamperedOriginal(PatchError):
    """A file `apply` kept (ORIGINALS) is no longer the release's file."""


class FileState(str, enum.Enum):
    """What a command found, or would do, for one file (FileReport.state)."""

    # check
    WOULD_CHANGE = "would change"
    WOULD_ADD = "would add"
    UNCHANGED = "unchanged"
    APPLIED = "applied"
    MISSING = "missing"
    CONFLICT = "conflict"
    EXISTS = "exists"
    READ_ONLY = "read-only"
    # apply and status
    CHANGED = "changed"
    ADDED = "added"
    KEPT = "kept"
    STALE = "stale"
    UNKNOWN = "unknown"
    # revert
    RESTORED = "restored"
    REMOVED = "removed"

    def __str__(self) -> str:
        return self.value


@dataclass
class FileReport:
    """What a command found, or would do, for one file."""

    path: str
    state: FileState
    details: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"  {self.state!s:<14} {self.path}"] + [f"      {line}" for line in self.details]


@dataclass
class TreeStatus:
    """What `status` reports."""

    target: Target
    design: Design | None
    files: list[FileReport]
    problem: str | None = None


def operations(design: Design, target: Target) -> tuple[FileOperations, ...]:
    """The operations of `design` on `target`'s files."""
    return targets.file_operations(design, target.release)


def patched_text(target: Target, text: str, file_ops: FileOperations) -> str:
    """`text` with the operations applied, or PatchError naming file, function and release."""
    try:
        return apply_all(text, file_ops)
    except SiteError as error:
        raise PatchError(_moved(target.release, file_ops.path, error)) from None


def _moved(release: Release, path: str, error: SiteError) -> str:
    if isinstance(error, UnparsableError):
        return (
            f"{path} does not parse as Python ({error}): restore vLLM's file "
            "(git checkout -- <file>, or reinstall vLLM)"
        )
    return (
        f"{path}: {error} (vLLM {release.version}); the code moved from where the patch "
        "expects it for this release"
    )


def applied_design(target: Target) -> Design | None:
    """The design applied to the target, or None; PatchError for half states."""
    applied = _applied(target)
    return applied[0] if applied else None


def _applied(target: Target) -> tuple[Design, list[str]] | None:
    """applied_design, and the files it changed (those with an edit in this release)."""
    for design in Design:
        changed = _changed_by(target, design)
        if changed is not None:
            return design, changed
    leftovers = _leftovers(target)
    if leftovers:
        raise PartlyPatched(
            f"{target.root} is partly patched ({'; '.join(leftovers)}), neither clean nor a "
            "whole design: restore those files (git checkout -- <file>, or reinstall vLLM), "
            "remove the added files, then apply again"
        )
    return None


def check(target: Target, design: Design) -> tuple[bool, list[FileReport]]:
    """Dry run of `apply`: whether it would succeed, and what it would do per file."""
    ok, reports, _ = _check(target, design)
    return ok, reports


def _check(target: Target, design: Design) -> tuple[bool, list[FileReport], dict[str, str]]:
    """check's verdict and reports, and the patched text of each file it would change."""
    applied = _applied(target)
    current = applied[0] if applied else None
    if applied and current is design:
        touched = applied[1] + _added_paths(target.root)
        return True, [FileReport(path, FileState.APPLIED) for path in touched], {}
    if current is not None:
        raise PatchError(_other_design_message(target.root, current, design))
    reports = []
    patched: dict[str, str] = {}
    dirty = set(_local_edits(target, design))
    for file_ops in operations(design, target):
        text = _read(target.root, file_ops.path)
        if text is None:
            missing = FileReport(file_ops.path, FileState.MISSING, ["the file does not exist"])
            reports.append(missing)
            continue
        if "\r" in text:
            line = text.count("\n", 0, text.index("\r")) + 1
            raise NotLfText(
                f"{file_ops.path} has CR line endings (line {line} the first), and vLLM's "
                "sources have LF only, as the patch writes them: restore the file with LF "
                "endings (git config core.autocrlf false, then git checkout the file, or "
                "dos2unix it); nothing was changed"
            )
        problems = [_local_edit_reason(target)] if file_ops.path in dirty else []
        details = _through_link(target.root, file_ops.path)
        original = text
        for edit in each_edit(text, file_ops, located=True):
            if edit.error is not None:
                problems.append(_moved(target.release, file_ops.path, edit.error))
                break
            details.append(f"{edit.operation.why} ({edit.where})")
            text = edit.text
        if problems:
            reports.append(FileReport(file_ops.path, FileState.CONFLICT, problems))
        elif text == original:
            reports.append(FileReport(file_ops.path, FileState.UNCHANGED, details))
        else:
            reports.append(FileReport(file_ops.path, FileState.WOULD_CHANGE, details))
            patched[file_ops.path] = text
    added = sorted(_added_files(target, design))
    for path in added:
        exists = (target.root / path).exists()
        reports.append(
            FileReport(path, FileState.EXISTS, ["already there"])
            if exists
            else FileReport(path, FileState.WOULD_ADD)
        )
    ok = all(report.state in _APPLICABLE for report in reports)
    if ok:
        written = [
            _real_path(target.root, r.path) for r in reports if r.state != FileState.UNCHANGED
        ]
        if target.kind is Kind.INSTALLED:
            written += [
                f"{ORIGINALS}/{r.path}" for r in reports if r.state == FileState.WOULD_CHANGE
            ]
        reports += _unwritable(target.root, written)
    return ok and all(report.state in _APPLICABLE for report in reports), reports, patched


def apply(
    target: Target, design: Design, made: Callable[[str], None] | None = None
) -> tuple[bool, list[FileReport]]:
    """Applies `design`; returns (changed, per-file report).  Refuses with PatchError.
    `made` is journal.replace_files': told once the change is made."""
    ok, reports, patched = _check(target, design)
    if all(report.state == FileState.APPLIED for report in reports):
        return False, reports
    if not ok:
        failing = [
            line for report in reports if report.state not in _APPLICABLE for line in report.lines()
        ]
        raise PatchError(
            f"cannot apply the {design} design to {target.root}; nothing was changed:\n"
            + "\n".join(failing)
        )
    changes: dict[str, bytes | None] = {}
    for path, text in patched.items():
        changes[_real_path(target.root, path)] = text.encode()
        if target.kind is Kind.INSTALLED:
            changes[f"{ORIGINALS}/{path}"] = (target.root / path).read_bytes()
    changes.update(_added_files(target, design))
    journal.replace_files(target.root, changes, what=f"apply of the {design} design", made=made)
    return True, [FileReport(r.path, _DONE[r.state], r.details) for r in reports]


_DONE = {
    FileState.WOULD_CHANGE: FileState.CHANGED,
    FileState.WOULD_ADD: FileState.ADDED,
    FileState.UNCHANGED: FileState.UNCHANGED,
}
"""What apply made of each state check reported."""


def revert(
    target: Target, made: Callable[[str], None] | None = None
) -> tuple[Design | None, list[FileReport]]:
    """Takes the applied design back out; returns (design, per-file report) or (None, []).
    `made` is journal.replace_files': told once the change is made."""
    design = applied_design(target)
    if design is None:
        return None, []
    changes: dict[str, bytes | None] = {}
    reports = []
    for file_ops in operations(design, target):
        current = _read(target.root, file_ops.path) or ""
        kept = _kept(target, file_ops.path)
        if kept is not None:
            if patched_text(target, kept, file_ops) != current:
                replaced = target.root / ORIGINALS / file_ops.path
                raise PatchError(
                    f"{file_ops.path} was changed after the patch was applied; nothing was "
                    f"reverted (the file apply replaced is {replaced})"
                )
            original, how = kept, ["the file apply replaced"]
        else:
            original, how = revert_all(current, file_ops), []
        if original != current:
            changes[_real_path(target.root, file_ops.path)] = original.encode()
            how = _through_link(target.root, file_ops.path) + how
            reports.append(FileReport(file_ops.path, FileState.RESTORED, how))
    for path in _added_paths(target.root):
        changes[path] = None
        reports.append(FileReport(path, FileState.REMOVED))
    for path in _bytecode(target.root):
        changes[path] = None
    unwritable = _unwritable(target.root, list(changes))
    if unwritable:
        raise PatchError(
            f"cannot revert the {design} design from {target.root}; nothing was changed:\n"
            + "\n".join(line for report in unwritable for line in report.lines())
        )
    journal.replace_files(
        target.root,
        changes,
        prune=[
            vendor.VENDORED_PACKAGE,
            *sorted({str(Path(path).parent) for path in fork_test.PATHS}),
            ORIGINALS,
        ],
        what=f"revert of the {design} design",
        made=made,
    )
    return design, reports


def _kept(target: Target, path: str) -> str | None:
    """The text of `path` that apply kept in an installed vLLM (ORIGINALS), or None;
    TamperedOriginal where it is no longer the release's file (apply keeps only that:
    it refuses, outside git, a file that differs from the release's)."""
    kept = f"{ORIGINALS}/{path}"
    text = _read(target.root, kept)
    if text is None:
        return None
    version = target.release.version
    shipped = pristine_sha256().get(version, {}).get(path)
    if shipped is not None and hashlib.sha256(text.encode()).hexdigest() != shipped:
        raise TamperedOriginal(
            f"{kept}, the copy apply kept of {path}, was changed since: it is not vLLM "
            f"{version}'s file; nothing was reverted: delete it (revert then takes the patch "
            f"out of {path} by its structure), or reinstall vLLM {version}"
        )
    return text


def status(target: Target) -> TreeStatus:
    """The design applied, and the files it touched, with their state."""
    try:
        applied = _applied(target)
    except PartlyPatched as error:
        return TreeStatus(target, None, [], str(error))
    if applied is None:
        return TreeStatus(target, None, [])
    design, changed = applied
    files = [FileReport(path, FileState.CHANGED) for path in changed]
    files += [FileReport(path, _added_state(path)) for path in _added_paths(target.root)]
    try:
        expected = _added_files(target, design)
    except vendor.VendorError as error:
        files.append(FileReport(vendor.VENDORED_PACKAGE, FileState.UNKNOWN, [str(error)]))
        return TreeStatus(target, design, files)
    present = {path: (target.root / path).read_bytes() for path in _added_paths(target.root)}
    present = {p: d for p, d in present.items() if _added_state(p) == FileState.ADDED}
    if present != expected:
        stale = sorted(p for p in set(present) | set(expected) if present.get(p) != expected.get(p))
        files.append(
            FileReport(
                vendor.VENDORED_PACKAGE,
                FileState.STALE,
                [
                    f"differs from what runner_hooks produces now: {', '.join(stale)}",
                    f"refresh it with: sr-prefetch revert {target.root} && "
                    f"sr-prefetch apply {target.root}",
                ],
            )
        )
    return TreeStatus(target, design, files)


def _added_state(path: str) -> FileState:
    """How status names a file a design added: kept (an original) or added."""
    return FileState.KEPT if path.startswith(ORIGINALS) else FileState.ADDED


def _added_files(target: Target, design: Design) -> dict[str, bytes]:
    """What the design adds: the vendored package, and the fork's tests (fork_test.files)
    in any target but an installed vLLM."""
    files = vendor.vendored_files(design)
    if target.kind is not Kind.INSTALLED:
        tests = fork_test.files(design, _read(target.root, ssu_dispatch.PATH) or "")
        files.update({path: text.encode("utf-8") for path, text in tests.items()})
    return files


def _changed_by(target: Target, design: Design) -> list[str] | None:
    """The files `design` changed where it is applied to the target, else None."""
    changed = []
    for file_ops in operations(design, target):
        text = _read(target.root, file_ops.path)
        if text is None:
            return None
        try:
            if revert_all(text, file_ops) != text:
                changed.append(file_ops.path)
        except SiteError:
            return None
    return changed if (target.root / vendor.VENDORED_PACKAGE).is_dir() else None


def _leftovers(target: Target) -> list[str]:
    """Traces of any design in a target where no whole design is applied."""
    ssu = _read(target.root, ssu_dispatch.PATH) or ""
    rendered = {text for design in Design for text in fork_test.files(design, ssu).values()}
    found = [
        f"{path} exists"
        for path in _added_paths(target.root)
        if path not in fork_test.PATHS or _read(target.root, path) in rendered
    ]
    for path in targets.PATHS:
        text = _read(target.root, path) or ""
        if "sr_seed_prefetch" in text or "VLLM_MAMBA_SR_SEED_" in text:
            found.append(f"{path} has edits")
    return found


def _added_paths(root: Path) -> list[str]:
    """The files a design added that are in the tree now: the whole vendored
    package (whatever runner_hooks held when it was applied), the fork test, and an
    installed vLLM's kept originals."""
    paths = []
    for folder in (vendor.VENDORED_PACKAGE, ORIGINALS):
        top = root / folder
        paths += sorted(
            path.relative_to(root).as_posix()
            for path in (top.rglob("*") if top.is_dir() else [])
            if path.is_file() and "__pycache__" not in path.parts
        )
    paths += [path for path in fork_test.PATHS if (root / path).is_file()]
    return paths


def _bytecode(root: Path) -> list[str]:
    """Bytecode that running the added files left: it goes when they go."""
    tests = [Path(path) for path in fork_test.PATHS]
    caches = [
        *(root / vendor.VENDORED_PACKAGE).rglob("__pycache__/*"),
        *(c for t in tests for c in (root / t.parent / "__pycache__").glob(f"{t.stem}.*")),
    ]
    return sorted(path.relative_to(root).as_posix() for path in caches if path.is_file())


_APPLICABLE = (FileState.WOULD_CHANGE, FileState.WOULD_ADD, FileState.UNCHANGED)
"""The states of check's reports that apply can act on."""


def _unwritable(root: Path, paths: list[str]) -> list[FileReport]:
    """A report for each directory that writing or removing `paths` (and the journal) needs
    and this process may not write: the nearest existing one of each path's parents."""
    folders: dict[Path, list[str]] = {}
    for path in [journal.JOURNAL, *paths]:
        folder = (root / path).parent
        while not folder.exists():
            folder = folder.parent
        folders.setdefault(folder, []).append(path)
    return [
        FileReport(
            str(folder.relative_to(root)),
            FileState.READ_ONLY,
            [
                f"{folder} is not writable (its mode, its owner, or a read-only file system), "
                f"so {', '.join(written)} cannot be written there: make it writable, or run "
                "as a user who may write it"
            ],
        )
        for folder, written in folders.items()
        if not os.access(folder, os.W_OK | os.X_OK)
    ]


def _local_edits(target: Target, design: Design) -> list[str]:
    """The files the design changes that carry local edits.

    In a git work tree: uncommitted changes (committed fork changes are fine
    where the sites are still found).  Outside git there is no history to tell
    local from committed, so any difference from the release's file counts.
    """
    paths = [fo.path for fo in operations(design, target)]
    if target.kind is Kind.GIT:
        real = {
            _real_path(target.root, path): path for path in paths if (target.root / path).exists()
        }
        return [real[path] for path in dirty_paths(target.root, list(real))]
    shipped = pristine_sha256().get(target.release.version, {})
    return [
        path
        for path in paths
        if (target.root / path).is_file()
        and hashlib.sha256((target.root / path).read_bytes()).hexdigest() != shipped.get(path)
    ]


def _local_edit_reason(target: Target) -> str:
    if target.kind is Kind.GIT:
        return "has uncommitted changes: commit or stash them first"
    return (
        f"differs from vLLM {target.release.version}'s file, and without git local edits "
        "cannot be told from the release's code: patch a git checkout instead, or give the "
        "right --base"
    )


def _other_design_message(root: Path, current: Design, wanted: Design) -> str:
    return (
        f"{root} already has the {current} design applied; to switch to {wanted}, run\n"
        f"  sr-prefetch revert {root}\n  sr-prefetch apply {root} --design {wanted}"
    )


def _read(root: Path, path: str) -> str | None:
    """The file's text exactly as stored (no newline translation), or None; NotUtf8
    where it is not UTF-8."""
    file = root / path
    if not file.is_file():
        return None
    data = file.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotUtf8(
            f"{path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start}), as vLLM's sources are: save it as UTF-8 (e.g. iconv -f latin1 "
            "-t utf-8), or restore vLLM's file; nothing was changed"
        ) from None


def _real_path(root: Path, path: str) -> str:
    """The file that `path` names, as a path in the tree: itself, or where the symlinks
    on its way lead (the journal replaces a file whole, so a link is written through, and
    stays a link); SymlinkOutside where they lead out of the tree."""
    file = root / path
    real = file.resolve()
    if real == file:
        return path
    if not real.is_relative_to(root):
        how = "is a symlink" if file.is_symlink() else "lies behind a symlink"
        raise SymlinkOutside(
            f"{path} {how} to {real}, outside {root}, and sr-prefetch changes files in the "
            f"tree only: replace the link by a copy of the file (cp --remove-destination "
            f"{real} {file}), or patch the tree it points into; nothing was changed"
        )
    return real.relative_to(root).as_posix()


def _through_link(root: Path, path: str) -> list[str]:
    """check's, apply's and revert's word on a file written through a symlink."""
    real = _real_path(root, path)
    return [f"written through the symlink to {real}"] if real != path else []
