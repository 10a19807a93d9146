"""The test file the patch adds to a source tree: tests/kernels/mamba/test_sr_seed_prefetch.py.

It runs on a CUDA device in the fork's CI and checks every seed against
stock's `torch.randint` draws.  It is landing/test_sr_seed_prefetch.py, the
reset design's.  The designs differ only in how a test opens a forward (as the
model runners do under each): for the forward-context design, the
`open_forward` fixture is replaced by that of
landing/test_sr_seed_prefetch_forward_context.py, and its import put where
isort puts it, all located by syntax.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from .releases import Design
from .syntax import Source, landing

PATH = "tests/kernels/mamba/test_sr_seed_prefetch.py"
TEST = "test_sr_seed_prefetch.py"
FORWARD_CONTEXT_PART = "test_sr_seed_prefetch_forward_context.py"
FIXTURE = "open_forward"


def render(design: str) -> str:
    """The test file's text for `design` ("reset" or "forward-context")."""
    text = landing(TEST)
    if Design(design) is Design.RESET:
        return text
    base, part = Source(text, TEST), Source(landing(FORWARD_CONTEXT_PART), FORWARD_CONTEXT_PART)
    (new_import,) = [node for node in part.tree.body if isinstance(node, ast.ImportFrom)]
    fixture, new_fixture = (_only(s, f"def {FIXTURE}", _defines(FIXTURE)) for s in (base, part))
    position = _sorted_position(base, new_import.module or "")
    edits = [
        (*_lines(base, fixture), _text(part, new_fixture)),
        (position, position, part.segment(new_import) + "\n"),
    ]
    for start, end, new in sorted(edits, key=lambda edit: edit[:2], reverse=True):
        text = text[:start] + new + text[end:]
    return text


Matches = Callable[[ast.stmt], bool]


def _defines(name: str) -> Matches:
    return lambda node: isinstance(node, ast.FunctionDef) and node.name == name


def _only(source: Source, what: str, matches: Matches) -> ast.stmt:
    found = [node for node in source.tree.body if matches(node)]
    if len(found) != 1:
        raise ValueError(f"landing/{source.path}: expected one {what}, found {len(found)}")
    return found[0]


def _first_line(node: ast.stmt) -> int:
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


def _lines(source: Source, node: ast.stmt) -> tuple[int, int]:
    """The offsets of `node`'s whole lines, its decorators included."""
    return source.line_start(_first_line(node)), source.line_end(node.end_lineno or node.lineno)


def _text(source: Source, node: ast.stmt) -> str:
    start, end = _lines(source, node)
    return source.text[start:end]


def _sorted_position(source: Source, module: str) -> int:
    """Where isort puts `from module import ...` among the file's `from vllm...` imports."""
    vllm_imports = [
        node
        for node in source.tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm"
    ]
    after = [node for node in vllm_imports if (node.module or "") > module]
    if after:
        return source.line_start(after[0].lineno)
    return source.line_end(vllm_imports[-1].end_lineno or vllm_imports[-1].lineno)
