"""The test files the patch adds to a source tree, each for the release it lands in.

- `PATH`, landing/test_sr_seed_prefetch.py (CUDA): every seed the SSU hands its
  kernel against stock's `torch.randint` draws.  The designs differ only in how a
  test opens a forward and replays a graph: the forward-context design takes the
  `open_forward` and `replay` fixtures of
  landing/test_sr_seed_prefetch_forward_context.py.  Where the release
  has FlashInfer's ReplaySSM call, landing/test_sr_seed_prefetch_replayssm.py adds
  that path.
- The reset design's: `PREFETCHER_PATH`, landing/test_sr_seed_prefetcher.py (CPU),
  the prefetcher's forward logic; `ENGINE_PATH`,
  landing/test_mamba_sr_seed_prefetch_engine.py (CUDA), a small engine's outputs
  with and without the variable.

A part's top-level statements replace the file's of the same name, or go before
its first test; its imports go where isort puts them; a keyword argument of its
`ssu_dispatch` calls that the release's function lacks is dropped; all located by
syntax.
"""

from __future__ import annotations

import ast

from .releases import Design
from .syntax import Source, landing

PATH = "tests/kernels/mamba/test_sr_seed_prefetch.py"
PREFETCHER_PATH = "tests/kernels/mamba/test_sr_seed_prefetcher.py"
ENGINE_PATH = "tests/v1/e2e/general/test_mamba_sr_seed_prefetch.py"
PATHS = (PATH, PREFETCHER_PATH, ENGINE_PATH)

FORWARD_CONTEXT_PART = "test_sr_seed_prefetch_forward_context.py"
REPLAYSSM_PART = "test_sr_seed_prefetch_replayssm.py"
FLASHINFER_REPLAYSSM = "def selective_state_update_replayssm_flashinfer("
"""How a release's ssu_dispatch.py has FlashInfer's ReplaySSM call."""


def files(design: Design, ssu_dispatch: str) -> dict[str, str]:
    """The test files (path -> text) for `design` in a tree whose
    vllm/model_executor/layers/mamba/ops/ssu_dispatch.py reads `ssu_dispatch`."""
    parts = [FORWARD_CONTEXT_PART] if design is Design.FORWARD_CONTEXT else []
    if FLASHINFER_REPLAYSSM in ssu_dispatch:
        parts.append(REPLAYSSM_PART)
    text = landing("test_sr_seed_prefetch.py")
    for part in parts:
        fitted = _fitted_calls(Source(landing(part), part), Source(ssu_dispatch))
        text = _merged(Source(text, PATH), Source(fitted, part))
    found = {PATH: text}
    if design is Design.RESET:
        found[PREFETCHER_PATH] = landing("test_sr_seed_prefetcher.py")
        found[ENGINE_PATH] = landing("test_mamba_sr_seed_prefetch_engine.py")
    return found


def _fitted_calls(part: Source, ssu_dispatch: Source) -> str:
    """The part with each keyword argument of its `ssu_dispatch.<function>(...)` calls
    that the release's function does not take dropped, its whole line."""
    functions = {
        node.name: {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}
        for node in ssu_dispatch.tree.body
        if isinstance(node, ast.FunctionDef)
    }
    dropped = [
        keyword
        for node in ast.walk(part.tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "ssu_dispatch"
        and node.func.attr in functions
        for keyword in node.keywords
        if keyword.arg is not None and keyword.arg not in functions[node.func.attr]
    ]
    text = part.text
    for keyword in sorted(dropped, key=lambda k: k.lineno, reverse=True):
        text = text[: part.line_start(keyword.lineno)] + text[part.line_end(keyword.lineno) :]
    return text


def _name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Name):
            return targets[0].id
    return None


def _merged(base: Source, part: Source) -> str:
    named = {_name(node): node for node in base.tree.body if _name(node) is not None}
    first_test = next(
        node
        for node in base.tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    )
    edits = []
    for node in part.tree.body:
        if isinstance(node, ast.ImportFrom):
            position = _sorted_position(base, node.module or "")
            edits.append((position, position, part.segment(node) + "\n"))
            continue
        name = _name(node)
        if name is None:
            raise ValueError(f"landing/{part.path}: a top-level statement with no name")
        code = _text(part, node)
        if name in named:
            edits.append((*_lines(base, named[name]), code))
        else:
            start = _lines(base, first_test)[0]
            edits.append((start, start, code + "\n\n"))
    text = base.text
    for start, end, new in sorted(edits, key=lambda edit: edit[:2], reverse=True):
        text = text[:start] + new + text[end:]
    return text


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
