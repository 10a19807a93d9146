"""sr-prefetch: apply the seed-prefetch runner patch to a vLLM tree or an installed vLLM,
and take it back out.

Every command that takes a target (PATH or --installed) resolves it first (a vLLM
tree, and the supported release it is based on), and refuses with a message and
exit status 1 rather than change a target it cannot patch cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from . import designs, gitrepo, journal, patch, plugin, releases, sources, syntax, targets, tree
from .cache import CacheError, write_problem
from .designs import DESIGNS, commit_message
from .patch import FileState
from .releases import RELEASES, Design, Site
from .vendor import VendorError

_Handler = Callable[[int, FrameType | None], object] | int | None
"""A SIGINT handler, as signal.signal takes it."""


class ExportError(Exception):
    """`export` cannot write its output; the message says why and where else to."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit status (0 done or nothing to do, 1 refused,
    130 interrupted, 141 its output's reader gone).  Ctrl-C before the command's
    change is made undoes what it began; once made, the change stands: the command
    finishes its report and exits 130 saying so (_Interrupts)."""
    return _main(argv, signal.getsignal(signal.SIGINT))


def entry() -> NoReturn:
    """The `sr-prefetch` program (and `python -m vllm_patch`): main, after which Ctrl-C
    is ignored, so that it cannot turn the exit of a command that has said what it did
    into a silent death."""
    status = _main(None, signal.SIG_IGN)
    syntax.parse.cache_clear()  # most of the exit's time: the syntax trees it holds
    sys.exit(status)


def _main(argv: Sequence[str] | None, then: _Handler) -> int:
    """main, with `then` the SIGINT handler once the command ends."""
    args = _parser().parse_args(argv)
    with _Interrupts.installed(then) as interrupts:
        args.made = interrupts.made
        status = _run(args)
        if interrupts.kept is not None:
            print(
                f"sr-prefetch: interrupted once the {interrupts.kept} was made; it is kept, "
                "as reported above",
                file=sys.stderr,
            )
            return 130
    return status


def _run(args: argparse.Namespace) -> int:
    try:
        return args.run(args)
    except KeyboardInterrupt:
        # Ctrl-C before the change was made: a transaction it cut short was undone
        # (journal.replace_files).
        print("sr-prefetch: interrupted; nothing was changed", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`sr-prefetch ... | head`); the command
        # itself ran to its end or was refused before writing.
        return 141
    except (
        tree.TreeError,
        patch.PatchError,
        releases.UnsupportedRelease,
        VendorError,
        journal.JournalError,
        gitrepo.GitError,
        CacheError,
        sources.FetchError,
        ExportError,
    ) as error:
        print(f"sr-prefetch: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        # Writes are one transaction (journal.replace_files), so an OSError while
        # writing leaves the target as it was.
        print(f"sr-prefetch: {_os_error_line(error)}", file=sys.stderr)
        return 1


_FIXES = {
    "full": "free space on that disk, then run the command again",
    "access": "make it writable (its mode or owner, or chattr -i where a file is "
    "immutable), then run the command again",
    "file": "move that file away, then run the command again",
}


def _os_error_line(error: OSError) -> str:
    """An OSError in one line: the file it names (the one a staged write stood in for),
    what stopped it, and what to do."""
    if not error.filename:
        return str(error)
    path = Path(os.fsdecode(error.filename))
    if path.name.startswith(".") and path.name.endswith(".sr-prefetch"):
        path = path.with_name(path.name[1 : -len(".sr-prefetch")])
    problem, kind = write_problem(error, path)
    fix = _FIXES.get(kind, "fix that, then run the command again")
    return f"cannot change {path}: {problem}: {fix}"


class _Interrupts:
    """Ctrl-C during one command: KeyboardInterrupt until its change is made (`made`,
    called by journal.replace_files inside its transaction), which undoes it; after,
    noted in `kept` and otherwise ignored, so that the command reports the change it
    made and main says it was kept.  Only the main thread can take signals: elsewhere
    Python's own handling stands."""

    def __init__(self) -> None:
        self.changed: str | None = None
        self.kept: str | None = None

    def made(self, what: str) -> None:
        self.changed = what

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.changed is None:
            raise KeyboardInterrupt
        self.kept = self.changed

    @classmethod
    @contextlib.contextmanager
    def installed(cls, then: _Handler) -> Iterator[_Interrupts]:
        """An _Interrupts as the SIGINT handler for the block, `then` after it."""
        interrupts = cls()
        if threading.current_thread() is not threading.main_thread():
            yield interrupts
            return
        signal.signal(signal.SIGINT, interrupts)
        try:
            yield interrupts
        finally:
            signal.signal(signal.SIGINT, then)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sr-prefetch",
        description="Apply the Mamba stochastic-rounding seed prefetch to a vLLM tree or an "
        f"installed vLLM (releases {releases.supported()}), in either design, and take it "
        "back out.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def design_option(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--design",
            type=Design,
            choices=list(Design),
            default=Design.RESET,
            help="reset (the model runners delimit forwards; default) or "
            "forward-context (forwards told apart by vLLM's ForwardContext, no runner edits)",
        )

    def base_option(command: argparse.ArgumentParser, without_path: str = "") -> None:
        command.add_argument(
            "--base",
            metavar="RELEASE",
            help="the vLLM release the target is based on, where its version does not say "
            f"(a fork){'; ' + without_path if without_path else ''}.",
        )

    def target_arguments(command: argparse.ArgumentParser, usage: str | None = None) -> None:
        """PATH or --installed.  With `usage` (the other options), one of them is required:
        argparse's own usage line would show both as optional."""
        if usage is not None:
            command.usage = f"%(prog)s [-h] (PATH | --installed) {usage}"
        command.add_argument(
            "path",
            nargs="?",
            type=Path,
            metavar="PATH",
            help="a vLLM tree (a git checkout, or a directory holding the vllm package, "
            "such as a site-packages directory)",
        )
        command.add_argument(
            "--installed",
            action="store_true",
            help="the vLLM that this Python imports (instead of PATH)",
        )

    apply = commands.add_parser(
        "apply",
        help="apply the patch (no PATH: to a pristine tree in the cache)",
        description="Apply the patch to the vLLM at PATH, or the installed one. Without "
        "either, prepare a pristine tree of the newest supported release (or --base) as a "
        "git repository in the cache ($SR_PREFETCH_CACHE or ~/.cache/sr-prefetch; its "
        "sources are read from the PyPI wheel once) and apply it there.",
    )
    target_arguments(apply)
    design_option(apply)
    base_option(apply, "without PATH, the release of the pristine tree")
    apply.set_defaults(run=_apply)

    check = commands.add_parser("check", help="dry run: what apply would do, file by file")
    target_arguments(check, "[--design {reset,forward-context}] [--base RELEASE]")
    design_option(check)
    base_option(check)
    check.set_defaults(run=_check)

    revert = commands.add_parser("revert", help="take the applied design back out")
    target_arguments(revert, "[--base RELEASE]")
    base_option(revert)
    revert.set_defaults(run=_revert)

    status = commands.add_parser("status", help="vLLM version, design applied, files touched")
    target_arguments(status, "[--base RELEASE]")
    base_option(status)
    status.set_defaults(run=_status)

    export = commands.add_parser(
        "export", help="write a git am-able patch against a supported release"
    )
    design_option(export)
    base_option(export, "the release to write the patch against (default: the newest)")
    export.add_argument(
        "-o", "--output", type=Path, required=True, metavar="FILE", help="the file, or - for stdout"
    )
    export.add_argument(
        "--force", action="store_true", help="replace FILE where it exists (refused without)"
    )
    export.add_argument(
        "--signoff",
        action="store_true",
        help="end the message with 'Signed-off-by: NAME <EMAIL>' (vLLM's DCO check), NAME "
        "and EMAIL being your git identity as git resolves it in the current directory "
        "(GIT_AUTHOR_NAME/GIT_AUTHOR_EMAIL, else user.name/user.email); refused, writing "
        "nothing, where git has none configured. With or without it, the patch's author is "
        f"that identity; only without --signoff and with none configured is it "
        f"{gitrepo.OWN_IDENTITY}",
    )
    export.set_defaults(run=_export)

    versions = commands.add_parser(
        "versions", help="the supported releases: the call sites each has, the torch it pins"
    )
    versions.add_argument(
        "--files",
        action="store_true",
        help="also locate every site in each release's files (read from its wheel, cached)",
    )
    versions.set_defaults(run=_versions)
    return parser


def _target(args: argparse.Namespace) -> tree.Target:
    if args.installed and args.path is not None:
        raise tree.TreeError("give PATH or --installed, not both")
    if args.installed:
        path = tree.installed_root()
    elif args.path is not None:
        path = args.path
    else:
        raise tree.TreeError(f"sr-prefetch {args.command} needs PATH or --installed")
    return _settled(tree.resolve(path, args.base))


def _settled(target: tree.Target) -> tree.Target:
    """`target`, once a command on it that was cut short is finished or undone
    (journal.settle) and its layout is checked against its release (check_base): what
    every command does first, and once."""
    if target.note:
        print(f"Note: {target.note}.")
    settled = journal.settle(target.root)
    if settled:
        print(f"Note: {settled}.")
    targets.check_base(target.root, target.release)
    return target


def _describe(target: tree.Target) -> str:
    if target.version is None:
        named = f"vLLM based on {target.release.version}"
    elif target.version == target.release.version:
        named = f"vLLM {target.version}"
    else:
        named = f"vLLM {target.version}, based on {target.release.version}"
    return f"{named} ({target.kind}) at {target.root}"


def _stated(version: str | None) -> str:
    return version or "not stated"


def _apply(args: argparse.Namespace) -> int:
    pristine = args.path is None and not args.installed
    if pristine:
        release = releases.get(args.base) if args.base else releases.NEWEST
        target = _settled(tree.resolve(sources.pristine_tree(release)))
    else:
        target = _target(args)
    changed, reports = patch.apply(target, args.design, args.made)
    if not changed:
        print(f"The {args.design} design is already applied to {target.root}; nothing to do.")
        status = patch.status(target).files
        _print_reports([report for report in status if report.state == FileState.STALE])
        return 0
    print(f"Applied the {args.design} design to {_describe(target)}:")
    _print_reports(reports)
    if pristine:
        root = shlex.quote(str(target.root))
        print(
            "\nThe pristine tree is its git HEAD; see the change (the added files too) with:\n"
            f"  git -C {root} status --short -uall\n  git -C {root} diff"
        )
    return 0


def _check(args: argparse.Namespace) -> int:
    target = _target(args)
    ok, reports = patch.check(target, args.design)
    if all(report.state == FileState.APPLIED for report in reports):
        print(f"The {args.design} design is already applied to {target.root}.")
        return 0
    verdict = "would apply cleanly" if ok else "would NOT apply"
    print(f"The {args.design} design {verdict} to {_describe(target)}:")
    _print_reports(reports)
    return 0 if ok else 1


def _revert(args: argparse.Namespace) -> int:
    target = _target(args)
    design, reports = patch.revert(target, args.made)
    if design is None:
        print(f"No sr-prefetch design is applied to {target.root}; nothing to revert.")
        return 0
    print(f"Reverted the {design} design from {_describe(target)}:")
    _print_reports(reports)
    return 0


def _status(args: argparse.Namespace) -> int:
    if args.installed or args.path is None:
        target = _target(args)
    else:
        root = tree.find_tree(args.path)
        try:
            target = _target(args)
        except tree.TreeError as error:
            print(f"vLLM tree: {root}\nvLLM version: {_stated(tree.read_version(root))}")
            print(error)
            return 1
    print(f"vLLM tree: {target.root} ({target.kind})\nvLLM version: {_stated(target.version)}")
    print(f"Based on release: {target.release.version}")
    if _imported_here(target):
        print(f"Plugin: {plugin.describe(target.root)}")
    report = patch.status(target)
    if report.problem is not None:
        print(f"Design applied: none whole\n{report.problem}")
        return 1
    if report.design is None:
        print("Design applied: none")
        return 0
    print(f"Design applied: {report.design} ({DESIGNS[report.design].summary})")
    print("Files touched:")
    _print_reports(report.files)
    return 0


def _imported_here(target: tree.Target) -> bool:
    """Whether `target` is the vLLM this Python imports: the one the plugin serves."""
    try:
        return tree.installed_root() == target.root
    except tree.TreeError:
        return False


def _export(args: argparse.Namespace) -> int:
    identity = gitrepo.user_identity()
    if identity is None and args.signoff:
        raise gitrepo.GitError(gitrepo.NO_IDENTITY)
    to_stdout = str(args.output) == "-"
    if not to_stdout:
        _check_output(args.output, args.force)
    release = releases.get(args.base) if args.base else releases.NEWEST
    pristine = sources.pristine_tree(release)
    workdir = Path(tempfile.mkdtemp(prefix="sr-prefetch-export-"))
    try:
        clone = gitrepo.clone(pristine, workdir / "vllm")
        target = tree.resolve(clone)
        originals = {
            fo.path: (clone / fo.path).read_text(encoding="utf-8")
            for fo in patch.operations(args.design, target)
        }
        _, reports = patch.apply(target, args.design)
        added = {
            r.path: (clone / r.path).read_bytes() for r in reports if r.state == FileState.ADDED
        }
        message = commit_message(args.design, release, originals, added)
        gitrepo.commit_all(clone, message, identity, signoff=args.signoff)
        mail = gitrepo.format_patch(clone)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if to_stdout:
        sys.stdout.write(mail)
        written, name, note = "stdout", "FILE", sys.stderr
    else:
        _write_output(args.output, mail.encode("utf-8"))
        written, name, note = str(args.output), shlex.quote(str(args.output)), sys.stdout
    print(
        f"Wrote the {args.design} design as a patch against vLLM v{release.version} to "
        f"{written}; apply it in the fork with: git am --keep-non-patch {name}\n"
        f"(--keep-non-patch keeps the {designs.subject_tag(args.design)} tag of the subject; "
        "plain git am drops it)",
        file=note,
    )
    if identity is None:
        print(
            f"Note: git has no identity configured here, so the patch's author is "
            f"{gitrepo.OWN_IDENTITY}; set yours with git config --global user.name/user.email "
            "(git am keeps the patch's author).",
            file=note,
        )
    return 0


def _check_output(output: Path, force: bool) -> None:
    """Refuses, before any work, an export destination that cannot be written, or one
    that exists, unless `force`."""
    if output.is_dir():
        raise ExportError(
            f"cannot write the patch to {output}: it is a folder: give a file name "
            f"(-o {output / 'sr-prefetch.patch'}), or - for stdout; nothing was written"
        )
    if os.path.lexists(output) and not force:
        raise ExportError(
            f"{output} exists: add --force to replace it, or give another file; nothing was written"
        )
    folder = output.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        _refuse_output(output, NotADirectoryError(20, "Not a directory", str(folder)))
    if not os.access(folder, os.W_OK | os.X_OK):
        _refuse_output(output, PermissionError(13, "Permission denied", str(folder)))


def _write_output(output: Path, data: bytes) -> None:
    """`data` as the file `output`, whole or not at all (written beside it, then renamed)."""
    staged = output.with_name(f".{output.name}.sr-prefetch")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(data)
        staged.replace(output)
    except OSError as error:
        staged.unlink(missing_ok=True)
        _refuse_output(output, error)


def _refuse_output(output: Path, error: OSError) -> NoReturn:
    problem, _ = write_problem(error, output.parent)
    raise ExportError(
        f"cannot write the patch to {output}: {problem}: give a path you may write, or - "
        "for stdout; nothing was written"
    )


def _versions(args: argparse.Namespace) -> int:
    width = max(len(str(site)) for site in Site)
    print(f"Supported vLLM releases ({releases.supported()}); the reset design's call sites:")
    for release in RELEASES:
        print(
            f"\n{release.version}  torch=={release.torch}  flashinfer-python=={release.flashinfer}"
        )
        located = _locate_sites(release) if args.files else {}
        for site in Site:
            print(f"  {site!s:<{width}}  {located.get(site, '')}".rstrip())
    return 0


def _locate_sites(release: releases.Release) -> dict[Site, str]:
    """Each site's file and line in `release`, or why it was not found."""
    found: dict[Site, list[str]] = {}
    file_ops = targets.file_operations(Design.RESET, release)
    texts = sources.release_files(release, tuple(fo.path for fo in file_ops))
    for fo in file_ops:
        for edit in syntax.each_edit(texts[fo.path].decode(), fo, located=True):
            if edit.operation.site is not None:
                where = (
                    f"NOT FOUND: {edit.error}"
                    if edit.error is not None
                    else f"{Path(fo.path).name} {edit.where}"
                )
                found.setdefault(Site(edit.operation.site), []).append(where)
    return {site: "; ".join(places) for site, places in found.items()}


def _print_reports(reports: Sequence[patch.FileReport]) -> None:
    for report in reports:
        print("\n".join(report.lines()))
