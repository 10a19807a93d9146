"""The two designs, as `sr-prefetch` presents them: a summary, and the commit message
of a release's patch.

The message is derived from what makes the patch: the operations of targets/
(each one's `why`, and the call site it hooks), the variables that
landing/envs.py declares, and the files the patch adds, with their own
docstrings.  Only the motivation paragraph is written by hand, and it says
nothing that an edit decides.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

from . import targets
from .releases import Design, Release
from .syntax import AddImportedNames, FileOperations, InsertStatements, Operation, Source
from .targets import envs


@dataclass(frozen=True)
class DesignSpec:
    """How a design is described to its users."""

    design: Design
    summary: str


DESIGNS: dict[Design, DesignSpec] = {
    Design.RESET: DesignSpec(
        Design.RESET,
        "explicit reset: the model runners tell the seed prefetcher where each forward "
        "begins and ends, through their ForwardHooks",
    ),
    Design.FORWARD_CONTEXT: DesignSpec(
        Design.FORWARD_CONTEXT,
        "forward-context identity (the baseline): no runner edits",
    ),
}

SUBJECT = "[Mamba] Draw a forward's stochastic-rounding seeds up front"

MOTIVATION = """\
With Mamba cache stochastic rounding on, every Mamba SSU call draws its
seed with torch.randint(0, 2**32, (1,)): one tiny RNG kernel per Mamba-2
layer on the critical path of every decode step, about 40 per step on
Nemotron-H. With VLLM_MAMBA_SR_SEED_PREFETCH=1 (default off), a forward's
seeds are drawn up front, with the same generator advances in the same
order, and the k-th SSU call of the forward takes seed k: the same values
as stock, off the critical path.
"""
"""The only hand-written paragraph: why, in terms no edit decides."""

_WIDTH = 72


def commit_message(
    design: Design,
    release: Release,
    originals: Mapping[str, str],
    added: Mapping[str, bytes],
) -> str:
    """The commit message of `design`'s patch on `release`.

    originals: the release's text of each file the design's operations change
    (setup.py among them where the tree has one); added: the files the patch adds
    (path -> content), as patch.py makes them.
    """
    blocks = [MOTIVATION, f"Design: {DESIGNS[design].summary}."]
    blocks.append(
        "Environment variables (vllm/envs.py):\n"
        + "\n".join(f"- {declaration}" for declaration in envs.declarations(design))
    )
    changed: list[str] = []
    sites: dict[str, None] = {}  # in order, once each
    setup_py_present = "setup.py" in originals
    for file_ops in targets.file_operations(design, release, setup_py_present=setup_py_present):
        effective = effective_operations(originals[file_ops.path], file_ops)
        if not effective:
            continue
        whys = [op.why for op in effective if not _only_imports(op)]
        changed.append(f"- {file_ops.path}: {'; '.join(whys or [op.why for op in effective])}.")
        sites.update((str(op.site), None) for op in effective if op.site is not None)
    blocks.append("Changed:\n" + "\n".join(changed))
    if sites:
        blocks.append("Call sites the model runners hook:\n" + "\n".join(f"- {s}" for s in sites))
    blocks.append(
        "Added:\n" + "\n".join(_added_item(path, data) for path, data in sorted(added.items()))
    )
    return f"{SUBJECT}\n\n" + "\n\n".join(_refill(block) for block in blocks) + "\n"


def effective_operations(text: str, file_ops: FileOperations) -> list[Operation]:
    """The operations of `file_ops` that change `text`, applied in order (an operation
    that holds only in some releases, syntax.OnlyWhere, changes nothing in the others)."""
    effective = []
    for operation in file_ops.operations:
        patched = operation.apply(Source(text, file_ops.path))
        if patched != text:
            effective.append(operation)
        text = patched
    return effective


def _only_imports(operation: Operation) -> bool:
    """Whether `operation` only imports names (left out of the message's lines)."""
    if isinstance(operation, AddImportedNames):
        return True
    if not isinstance(operation, InsertStatements) or callable(operation.code):
        return False
    try:
        body = ast.parse(textwrap.dedent(operation.code)).body
    except SyntaxError:  # a fragment, such as a dict's entries
        return False
    return bool(body) and all(isinstance(node, ast.Import | ast.ImportFrom) for node in body)


def _added_item(path: str, data: bytes) -> str:
    """`- path`, with the first paragraph of its docstring where it is a Python module,
    the first sentence of its opening comment where it is a CUDA source."""
    if path.endswith(".cu"):
        summary = _comment_sentence(data.decode("utf-8"))
    elif path.endswith(".py"):
        docstring = ast.get_docstring(ast.parse(data.decode("utf-8")))
        summary = " ".join(docstring.split("\n\n")[0].split()) if docstring else ""
    else:
        summary = ""
    return f"- {path}: {summary}" if summary else f"- {path}"


def _comment_sentence(text: str) -> str:
    """The first sentence of the `//` comment a C++ or CUDA file opens with (after its
    SPDX lines)."""
    words: list[str] = []
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        comment = line.removeprefix("//").strip()
        if comment.startswith("SPDX-") or (not comment and not words):
            continue
        if not comment:
            break
        words += comment.split()
    paragraph = " ".join(words)
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]


def _refill(block: str) -> str:
    """A paragraph, or a heading line and its "- " items, refilled to 72 columns."""

    def fill(text: str, bullet: bool) -> str:
        indents = {"initial_indent": "- ", "subsequent_indent": "  "} if bullet else {}
        return textwrap.fill(
            " ".join(text.split()),
            _WIDTH,
            break_on_hyphens=False,
            break_long_words=False,
            **indents,
        )

    head, *items = block.strip().split("\n- ")
    if items and "\n" not in head:
        return "\n".join([head, *(fill(item, True) for item in items)])
    return "\n".join([fill(head, False), *(fill(item, True) for item in items)])
