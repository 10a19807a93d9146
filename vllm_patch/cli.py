"""sr-prefetch: apply the seed-prefetch runner patch to a vLLM v0.33.0 tree, and back out.

Every command checks the tree (a vLLM tree, the supported version) before it
reads anything else, and refuses with a message and exit status 1 rather than
change a tree it cannot patch cleanly.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import patch, tree
from .edits import DESIGNS, RESET
from .vendor import VendorError


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit status (0 done or nothing to do, 1 refused)."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (tree.TreeError, patch.PatchError, VendorError, OSError) as error:
        # Writes are undone on failure (patch._write_all), so an OSError too
        # leaves the tree as it was.
        print(f"sr-prefetch: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sr-prefetch",
        description="Apply the Mamba stochastic-rounding seed prefetch to a vLLM "
        f"v{tree.SUPPORTED_VERSION} tree, in either design, and take it back out.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def design_option(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--design",
            choices=sorted(DESIGNS),
            default=RESET,
            help="reset (ours: the model runners delimit forwards; default) or "
            "forward-context (the seed document's baseline: no runner edits)",
        )

    apply = commands.add_parser(
        "apply",
        help="apply the patch (no PATH: to a pristine v0.33.0 tree in the cache)",
        description="Apply the patch to the vLLM tree at PATH. Without PATH, prepare a "
        "pristine vLLM v0.33.0 tree as a git repository in the cache "
        "($SR_PREFETCH_CACHE or ~/.cache/sr-prefetch; the PyPI release is fetched "
        "once) and apply it there.",
    )
    apply.add_argument("path", nargs="?", type=Path, metavar="PATH")
    design_option(apply)
    apply.set_defaults(run=_apply)

    check = commands.add_parser("check", help="dry run: what apply would do, file by file")
    check.add_argument("path", type=Path, metavar="PATH")
    design_option(check)
    check.set_defaults(run=_check)

    revert = commands.add_parser("revert", help="take the applied design back out")
    revert.add_argument("path", type=Path, metavar="PATH")
    revert.set_defaults(run=_revert)

    status = commands.add_parser("status", help="vLLM version, design applied, files touched")
    status.add_argument("path", type=Path, metavar="PATH")
    status.set_defaults(run=_status)

    export = commands.add_parser(
        "export", help=f"write a git am-able patch against v{tree.SUPPORTED_VERSION}"
    )
    design_option(export)
    export.add_argument("-o", "--output", type=Path, required=True, metavar="FILE")
    export.set_defaults(run=_export)
    return parser


def _checked_tree(path: Path) -> tuple[Path, str]:
    root = tree.find_tree(path)
    return root, tree.check_version(root)


def _apply(args: argparse.Namespace) -> int:
    root, version = _checked_tree(args.path if args.path is not None else tree.pristine_tree())
    changed, reports = patch.apply(root, args.design)
    if not changed:
        print(f"The {args.design} design is already applied to {root}; nothing to do.")
        stale = [report for report in patch.status(root).files if report.state == "stale"]
        _print_reports(stale)
        return 0
    print(f"Applied the {args.design} design to vLLM {version} at {root}:")
    _print_reports(reports)
    if args.path is None:
        print(f"\nThe pristine tree is its git HEAD: see the change with git -C {root} diff")
    return 0


def _check(args: argparse.Namespace) -> int:
    root, version = _checked_tree(args.path)
    ok, reports = patch.check(root, args.design)
    if all(report.state == "applied" for report in reports):
        print(f"The {args.design} design is already applied to {root}.")
        return 0
    verdict = "would apply cleanly" if ok else "would NOT apply"
    print(f"The {args.design} design {verdict} to vLLM {version} at {root}:")
    _print_reports(reports)
    return 0 if ok else 1


def _revert(args: argparse.Namespace) -> int:
    root, _ = _checked_tree(args.path)
    design, reports = patch.revert(root)
    if design is None:
        print(f"No sr-prefetch design is applied to {root}; nothing to revert.")
        return 0
    print(f"Reverted the {design} design from {root}:")
    _print_reports(reports)
    return 0


def _status(args: argparse.Namespace) -> int:
    root = tree.find_tree(args.path)
    report = patch.status(root)
    supported = report.version.split("+", 1)[0] == tree.SUPPORTED_VERSION
    note = "" if supported else f" (not supported: sr-prefetch supports {tree.SUPPORTED_VERSION})"
    print(f"vLLM tree: {root}\nvLLM version: {report.version}{note}")
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


def _export(args: argparse.Namespace) -> int:
    design = DESIGNS[args.design]
    pristine = tree.pristine_tree()
    workdir = Path(tempfile.mkdtemp(prefix="sr-prefetch-export-"))
    try:
        clone = tree.clone(pristine, workdir / "vllm")
        patch.apply(clone, design.name)
        tree.commit_all(clone, design.commit_message)
        mail = tree.format_patch(clone)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(mail, encoding="utf-8")
    print(
        f"Wrote the {design.name} design as a patch against vLLM v{tree.SUPPORTED_VERSION} to "
        f"{args.output}; apply it in the fork with: git am --keep-non-patch {args.output}\n"
        "(--keep-non-patch keeps the [Mamba] tag of the subject)"
    )
    return 0


def _print_reports(reports: Sequence[patch.FileReport]) -> None:
    for report in reports:
        print("\n".join(report.lines()))
