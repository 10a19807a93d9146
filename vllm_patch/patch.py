"""Applying a design to a vLLM tree, checking it, reading it back, taking it out.

Nothing is written until every file's new content is known: edits are
computed in memory, and the writes are undone if one of them fails, so a
refused or failed command leaves the tree exactly as it was.

What is applied is read from the files themselves rather than from a record
kept beside them: a design is applied when every edit's replacement is there
exactly once and taking it back out reproduces, edit for edit, the text it
came from.  That holds as well for a tree patched by `git am` as for one
patched by `apply`, and leaves no state file in the fork.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import fork_test, tree, vendor
from .edits import DESIGNS, PRISTINE_SHA256, Design, FileEdits


class PatchError(Exception):
    """The command is refused; the message says why and what to do instead."""


@dataclass
class FileReport:
    """What a command found, or would do, for one file."""

    path: str
    state: str
    details: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"  {self.state:<14} {self.path}"] + [f"      {line}" for line in self.details]


@dataclass
class TreeStatus:
    """What `status` reports."""

    root: Path
    version: str
    design: str | None
    files: list[FileReport]
    problem: str | None = None


def edit_text(text: str, file_edits: FileEdits) -> tuple[str, list[str]]:
    """`text` with the edits applied in order, and the anchors that failed (then unchanged)."""
    problems = []
    edited = text
    for number, edit in enumerate(file_edits.edits, 1):
        count = edited.count(edit.anchor)
        if count != 1:
            found = "not found" if count == 0 else f"found {count} times, must be unique"
            problems.append(
                f"anchor {number} ({edit.why}): {found}; it begins {_first_line(edit.anchor)!r}"
            )
            continue
        edited = edited.replace(edit.anchor, edit.replacement, 1)
    return (text, problems) if problems else (edited, [])


def unedit_text(text: str, file_edits: FileEdits) -> str | None:
    """The text the edits were applied to, or None if `text` is not exactly that, edited."""
    original = text
    for edit in reversed(file_edits.edits):
        if original.count(edit.replacement) != 1:
            return None
        original = original.replace(edit.replacement, edit.anchor, 1)
    edited, problems = edit_text(original, file_edits)
    return original if not problems and edited == text else None


def applied_design(root: Path) -> str | None:
    """The design applied to the tree at `root`, or None where none is; refuses half states."""
    applied = [name for name, design in DESIGNS.items() if _is_applied(root, design)]
    if applied:
        return applied[0]
    leftovers = _leftovers(root)
    if leftovers:
        raise PatchError(
            f"{root} is partly patched ({'; '.join(leftovers)}), neither clean nor a whole "
            "design: restore those files from git (git checkout -- <file>; remove the added "
            "files), then apply again"
        )
    return None


def check(root: Path, design_name: str) -> tuple[bool, list[FileReport]]:
    """Dry run of `apply`: whether it would succeed, and what it would do per file."""
    design = DESIGNS[design_name]
    current = applied_design(root)
    if current == design_name:
        return True, [FileReport(path, "applied") for path in _touched_paths(root, design)]
    if current is not None:
        raise PatchError(_other_design_message(root, current, design_name))
    reports = []
    dirty = set(_local_edits(root, design))
    for file_edits in design.file_edits:
        text = _read(root, file_edits.path)
        if text is None:
            reports.append(FileReport(file_edits.path, "missing", ["the file does not exist"]))
            continue
        _, problems = edit_text(text, file_edits)
        if file_edits.path in dirty:
            problems.insert(0, _local_edit_reason(root))
        if problems:
            reports.append(FileReport(file_edits.path, "conflict", problems))
        else:
            whys = [edit.why for edit in file_edits.edits]
            reports.append(FileReport(file_edits.path, "would change", whys))
    for path in sorted(design.added_files()):
        exists = (root / path).exists()
        reports.append(
            FileReport(
                path,
                "exists" if exists else "would add",
                ["already there"] if exists else [],
            )
        )
    ok = all(report.state in ("would change", "would add") for report in reports)
    return ok, reports


def apply(root: Path, design_name: str) -> tuple[bool, list[FileReport]]:
    """Applies `design_name`; returns (changed, per-file report).  Refuses with PatchError."""
    design = DESIGNS[design_name]
    ok, reports = check(root, design_name)
    if all(report.state == "applied" for report in reports):
        return False, reports
    if not ok:
        failing = [
            line
            for report in reports
            if report.state not in ("would change", "would add")
            for line in report.lines()
        ]
        raise PatchError(
            f"cannot apply the {design_name} design to {root}; nothing was changed:\n"
            + "\n".join(failing)
        )
    changes: dict[str, bytes | None] = {}
    for file_edits in design.file_edits:
        text = _read(root, file_edits.path)
        assert text is not None
        changes[file_edits.path] = edit_text(text, file_edits)[0].encode("utf-8")
    changes.update(design.added_files())
    _write_all(root, changes)
    done = {"would change": "changed", "would add": "added"}
    return True, [FileReport(r.path, done[r.state], r.details) for r in reports]


def revert(root: Path) -> tuple[str | None, list[FileReport]]:
    """Takes the applied design back out; returns (design, per-file report) or (None, [])."""
    design_name = applied_design(root)
    if design_name is None:
        return None, []
    design = DESIGNS[design_name]
    changes: dict[str, bytes | None] = {}
    reports = []
    for file_edits in design.file_edits:
        text = _read(root, file_edits.path)
        original = None if text is None else unedit_text(text, file_edits)
        assert original is not None, "applied_design checked every file"
        changes[file_edits.path] = original.encode("utf-8")
        reports.append(FileReport(file_edits.path, "restored"))
    for path in _added_paths(root):
        changes[path] = None
        reports.append(FileReport(path, "removed"))
    for path in _bytecode(root):
        changes[path] = None
    _write_all(root, changes)
    _prune_empty_dirs(root, [vendor.VENDORED_PACKAGE, str(Path(fork_test.PATH).parent)])
    return design_name, reports


def status(root: Path) -> TreeStatus:
    """The version, the design applied, and the files it touched, with their state."""
    version = tree.read_version(root)
    try:
        design_name = applied_design(root)
    except PatchError as error:
        return TreeStatus(root, version, None, [], str(error))
    if design_name is None:
        return TreeStatus(root, version, None, [])
    design = DESIGNS[design_name]
    files = [FileReport(fe.path, "changed") for fe in design.file_edits]
    files += [FileReport(path, "added") for path in _added_paths(root)]
    try:
        expected = design.added_files()
    except vendor.VendorError as error:
        files.append(FileReport(vendor.VENDORED_PACKAGE, "unknown", [str(error)]))
        return TreeStatus(root, version, design_name, files)
    present = {path: (root / path).read_bytes() for path in _added_paths(root)}
    if present != expected:
        stale = sorted(p for p in set(present) | set(expected) if present.get(p) != expected.get(p))
        files.append(
            FileReport(
                vendor.VENDORED_PACKAGE,
                "stale",
                [
                    f"differs from what runner_hooks produces now: {', '.join(stale)}",
                    "refresh it with: sr-prefetch revert PATH && sr-prefetch apply PATH",
                ],
            )
        )
    return TreeStatus(root, version, design_name, files)


def _is_applied(root: Path, design: Design) -> bool:
    for file_edits in design.file_edits:
        text = _read(root, file_edits.path)
        if text is None or unedit_text(text, file_edits) is None:
            return False
    return (root / fork_test.PATH).is_file() and (root / vendor.VENDORED_PACKAGE).is_dir()


def _leftovers(root: Path) -> list[str]:
    """Traces of any design in a tree where no whole design is applied."""
    found = []
    for path in _added_paths(root):
        found.append(f"{path} exists")
    seen: set[str] = set()
    for design in DESIGNS.values():
        for file_edits in design.file_edits:
            text = _read(root, file_edits.path) or ""
            for edit in file_edits.edits:
                if edit.replacement in text and file_edits.path not in seen:
                    seen.add(file_edits.path)
                    found.append(f"{file_edits.path} has edits ({edit.why})")
    return found


def _added_paths(root: Path) -> list[str]:
    """The files a design added that are in the tree now: the whole vendored
    package (whatever runner_hooks held when it was applied) and the fork test."""
    package = root / vendor.VENDORED_PACKAGE
    paths = sorted(
        path.relative_to(root).as_posix()
        for path in (package.rglob("*") if package.is_dir() else [])
        if path.is_file() and "__pycache__" not in path.parts
    )
    if (root / fork_test.PATH).is_file():
        paths.append(fork_test.PATH)
    return paths


def _bytecode(root: Path) -> list[str]:
    """Bytecode that running the added files left: it goes when they go."""
    test = Path(fork_test.PATH)
    caches = [
        *(root / vendor.VENDORED_PACKAGE).rglob("__pycache__/*"),
        *(root / test.parent / "__pycache__").glob(f"{test.stem}.*"),
    ]
    return sorted(path.relative_to(root).as_posix() for path in caches if path.is_file())


def _touched_paths(root: Path, design: Design) -> list[str]:
    return [fe.path for fe in design.file_edits] + _added_paths(root)


def _local_edits(root: Path, design: Design) -> list[str]:
    """The files the design changes that carry local edits.

    In a git work tree: uncommitted changes (committed fork changes are fine
    where the anchors still hold).  Outside git there is no history to tell
    local from committed, so any difference from v0.33.0 counts.
    """
    paths = [fe.path for fe in design.file_edits]
    if tree.is_git_worktree(root):
        return tree.dirty_paths(root, paths)
    return [
        path
        for path in paths
        if (root / path).is_file()
        and hashlib.sha256((root / path).read_bytes()).hexdigest() != PRISTINE_SHA256[path]
    ]


def _local_edit_reason(root: Path) -> str:
    if tree.is_git_worktree(root):
        return "has uncommitted changes: commit or stash them first"
    return f"differs from vLLM v{tree.SUPPORTED_VERSION}'s file (no git here to tell local edits)"


def _other_design_message(root: Path, current: str, wanted: str) -> str:
    return (
        f"{root} already has the {current} design applied; to switch to {wanted}, run\n"
        f"  sr-prefetch revert {root}\n  sr-prefetch apply {root} --design {wanted}"
    )


def _read(root: Path, path: str) -> str | None:
    """The file's text exactly as stored (no newline translation), or None."""
    file = root / path
    return file.read_bytes().decode("utf-8") if file.is_file() else None


def _write_all(root: Path, changes: dict[str, bytes | None]) -> None:
    """Writes (bytes) or removes (None) each path; undoes all of it if any step fails."""
    originals = {
        path: (root / path).read_bytes() if (root / path).is_file() else None for path in changes
    }
    created_dirs: list[Path] = []
    try:
        for path, data in changes.items():
            target = root / path
            if data is None:
                target.unlink()
                continue
            missing = [p for p in reversed(target.parents) if not p.exists()]
            target.parent.mkdir(parents=True, exist_ok=True)
            created_dirs.extend(missing)
            staged = target.with_name(f".{target.name}.sr-prefetch")
            staged.write_bytes(data)
            staged.replace(target)
    except BaseException:
        for path, data in originals.items():
            target = root / path
            target.with_name(f".{target.name}.sr-prefetch").unlink(missing_ok=True)
            if data is None:
                target.unlink(missing_ok=True)
            else:
                target.write_bytes(data)
        for directory in reversed(created_dirs):
            shutil.rmtree(directory, ignore_errors=True)
        raise


def _prune_empty_dirs(root: Path, relative_dirs: Iterable[str]) -> None:
    """Removes the empty directories in and above each of `relative_dirs`, up to `root`:
    those the added files alone had filled."""
    for relative in relative_dirs:
        top = root / relative
        if not top.is_dir():
            continue
        for directory in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()
        directory = top
        while directory != root and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
            directory = directory.parent


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
