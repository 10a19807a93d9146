"""Applying a design to a vLLM target, checking it, reading it back, taking it out.

Nothing is written until every file's new content is known: the operations
run in memory, and the writes are undone if one of them fails, so a refused
or failed command leaves the target exactly as it was.

What is applied is read from the files themselves, not from a record kept
beside them: a design is applied when each of its files, taken back out
structurally (syntax.revert_all), gives a text that the design turns into
that file again, byte for byte.  That holds as well for a tree patched by
`git am` as for one patched by `apply`.  An installed vLLM also keeps the
files `apply` replaced (ORIGINALS), and `revert` gives those back as they were.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from . import fork_test, targets, vendor
from .releases import SITES_SINCE, Design, Release, Site, pristine_sha256
from .syntax import FileOperations, SiteError, Source, apply_all, revert_all
from .tree import Kind, Target, dirty_paths

ORIGINALS = "vllm/.sr-prefetch-originals"
"""Where `apply` keeps an installed vLLM's replaced files (inside the package, so that
they go wherever it goes); `revert` restores them and removes the folder."""


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

    target: Target
    design: Design | None
    files: list[FileReport]
    problem: str | None = None


def operations(design: Design, target: Target) -> tuple[FileOperations, ...]:
    """The operations of `design` on `target`'s files (setup.py's where it has one)."""
    return targets.file_operations(
        design, target.release, setup_py_present=(target.root / "setup.py").is_file()
    )


def absent_sites(design: Design, release: Release) -> list[str]:
    """The call sites of `design` that `release` does not have, in words."""
    if design is not Design.RESET:
        return []
    return [
        f"{site} (not in vLLM {release.version}; added in {SITES_SINCE[site]})"
        for site in Site
        if not release.has(site)
    ]


def patched_text(target: Target, text: str, file_ops: FileOperations) -> str:
    """`text` with the operations applied, or PatchError naming file, function and release."""
    try:
        return apply_all(text, file_ops)
    except SiteError as error:
        raise PatchError(_moved(target.release, file_ops.path, error)) from None


def _moved(release: Release, path: str, error: SiteError) -> str:
    return (
        f"{path}: {error} (vLLM {release.version}); the code moved from where the patch "
        "expects it for this release"
    )


def applied_design(target: Target) -> Design | None:
    """The design applied to the target, or None; PatchError for half states."""
    for design in Design:
        if _is_applied(target, design):
            return design
    leftovers = _leftovers(target)
    if leftovers:
        raise PatchError(
            f"{target.root} is partly patched ({'; '.join(leftovers)}), neither clean nor a "
            "whole design: restore those files (git checkout -- <file>, or reinstall vLLM), "
            "remove the added files, then apply again"
        )
    return None


def check(target: Target, design: Design) -> tuple[bool, list[FileReport]]:
    """Dry run of `apply`: whether it would succeed, and what it would do per file."""
    current = applied_design(target)
    if current is design:
        return True, [FileReport(path, "applied") for path in _touched_paths(target, design)]
    if current is not None:
        raise PatchError(_other_design_message(target.root, current, design))
    reports = []
    dirty = set(_local_edits(target, design))
    for file_ops in operations(design, target):
        text = _read(target.root, file_ops.path)
        if text is None:
            reports.append(FileReport(file_ops.path, "missing", ["the file does not exist"]))
            continue
        problems = [_local_edit_reason(target)] if file_ops.path in dirty else []
        details = []
        for operation in file_ops.operations:
            try:
                where = operation.located(Source(text, file_ops.path))
                text = operation.apply(Source(text, file_ops.path))
                details.append(f"{operation.why} ({where})")
            except SiteError as error:
                problems.append(_moved(target.release, file_ops.path, error))
                break
        if problems:
            reports.append(FileReport(file_ops.path, "conflict", problems))
        else:
            reports.append(FileReport(file_ops.path, "would change", details))
    for path in sorted(_added_files(target, design)):
        exists = (target.root / path).exists()
        reports.append(
            FileReport(
                path, "exists" if exists else "would add", ["already there"] if exists else []
            )
        )
    ok = all(report.state in ("would change", "would add") for report in reports)
    return ok, reports


def apply(target: Target, design: Design) -> tuple[bool, list[FileReport]]:
    """Applies `design`; returns (changed, per-file report).  Refuses with PatchError."""
    ok, reports = check(target, design)
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
            f"cannot apply the {design} design to {target.root}; nothing was changed:\n"
            + "\n".join(failing)
        )
    changes: dict[str, bytes | None] = {}
    for file_ops in operations(design, target):
        original = (target.root / file_ops.path).read_bytes()
        changes[file_ops.path] = patched_text(target, original.decode(), file_ops).encode()
        if target.kind is Kind.INSTALLED:
            changes[f"{ORIGINALS}/{file_ops.path}"] = original
    changes.update(_added_files(target, design))
    _write_all(target.root, changes)
    done = {"would change": "changed", "would add": "added"}
    return True, [FileReport(r.path, done[r.state], r.details) for r in reports]


def revert(target: Target) -> tuple[Design | None, list[FileReport]]:
    """Takes the applied design back out; returns (design, per-file report) or (None, [])."""
    design = applied_design(target)
    if design is None:
        return None, []
    changes: dict[str, bytes | None] = {}
    reports = []
    for file_ops in operations(design, target):
        kept = target.root / ORIGINALS / file_ops.path
        if kept.is_file():
            current = (target.root / file_ops.path).read_bytes()
            if patched_text(target, kept.read_bytes().decode(), file_ops).encode() != current:
                raise PatchError(
                    f"{file_ops.path} was changed after the patch was applied; nothing was "
                    f"reverted (the file apply replaced is {kept})"
                )
            changes[file_ops.path] = kept.read_bytes()
            reports.append(FileReport(file_ops.path, "restored", ["the file apply replaced"]))
        else:
            text = _read(target.root, file_ops.path)
            assert text is not None
            changes[file_ops.path] = revert_all(text, file_ops).encode()
            reports.append(FileReport(file_ops.path, "restored"))
    for path in _added_paths(target.root):
        changes[path] = None
        reports.append(FileReport(path, "removed"))
    for path in _bytecode(target.root):
        changes[path] = None
    _write_all(target.root, changes)
    _prune_empty_dirs(
        target.root,
        [vendor.VENDORED_PACKAGE, str(Path(fork_test.PATH).parent), ORIGINALS],
    )
    return design, reports


def status(target: Target) -> TreeStatus:
    """The design applied, and the files it touched, with their state."""
    try:
        design = applied_design(target)
    except PatchError as error:
        return TreeStatus(target, None, [], str(error))
    if design is None:
        return TreeStatus(target, None, [])
    files = [FileReport(fo.path, "changed") for fo in operations(design, target)]
    files += [
        FileReport(path, "kept" if path.startswith(ORIGINALS) else "added")
        for path in _added_paths(target.root)
    ]
    try:
        expected = _added_files(target, design)
    except vendor.VendorError as error:
        files.append(FileReport(vendor.VENDORED_PACKAGE, "unknown", [str(error)]))
        return TreeStatus(target, design, files)
    present = {path: (target.root / path).read_bytes() for path in _added_paths(target.root)}
    present = {p: d for p, d in present.items() if not p.startswith(ORIGINALS)}
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
    return TreeStatus(target, design, files)


def _added_files(target: Target, design: Design) -> dict[str, bytes]:
    """What the design adds: the vendored package, and the fork's test where the target
    has a tests/ tree to put it in (not an installed vLLM)."""
    files = vendor.vendored_files()
    if target.kind is not Kind.INSTALLED:
        files[fork_test.PATH] = fork_test.render(design.value).encode("utf-8")
    return files


def _is_applied(target: Target, design: Design) -> bool:
    for file_ops in operations(design, target):
        text = _read(target.root, file_ops.path)
        if text is None:
            return False
        try:
            revert_all(text, file_ops)
        except SiteError:
            return False
    return (target.root / vendor.VENDORED_PACKAGE).is_dir()


def _leftovers(target: Target) -> list[str]:
    """Traces of any design in a target where no whole design is applied."""
    rendered = {fork_test.render(design.value) for design in Design}
    found = [
        f"{path} exists"
        for path in _added_paths(target.root)
        if path != fork_test.PATH or _read(target.root, path) in rendered
    ]
    for path in targets.PATHS:
        text = _read(target.root, path) or ""
        if "sr_seed_prefetch" in text or "VLLM_MAMBA_SR_SEED_" in text:
            found.append(f"{path} has edits")
    return found


def _added_paths(root: Path) -> list[str]:
    """The files a design added that are in the tree now: the whole vendored
    package (whatever runner_hooks held when it was applied), the fork test, and
    an installed vLLM's kept originals."""
    paths = []
    for folder in (vendor.VENDORED_PACKAGE, ORIGINALS):
        top = root / folder
        paths += sorted(
            path.relative_to(root).as_posix()
            for path in (top.rglob("*") if top.is_dir() else [])
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


def _touched_paths(target: Target, design: Design) -> list[str]:
    return [fo.path for fo in operations(design, target)] + _added_paths(target.root)


def _local_edits(target: Target, design: Design) -> list[str]:
    """The files the design changes that carry local edits.

    In a git work tree: uncommitted changes (committed fork changes are fine
    where the sites are still found).  Outside git there is no history to tell
    local from committed, so any difference from the release's file counts.
    """
    paths = [fo.path for fo in operations(design, target)]
    if target.kind is Kind.GIT:
        return dirty_paths(target.root, paths)
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
