"""setup.py: the vendored CUDA source listed in `package_data["vllm"]`, so a fork's wheel has it.

vLLM ships the sources it compiles on first use by pattern there (the hf3fs
utils' `*.cpp`); the pattern (landing/setup_package_data.py) goes after that
one, or last where a release has none.  Only a source tree has setup.py; an
installed vLLM already holds the vendored source, where its JIT build or
`sr-prefetch build-op` finds it.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from ..syntax import FileOperations, Find, InsertStatements, SiteError, Source, landing, parse
from ..vendor import VENDORED_PACKAGE

PATH = "setup.py"
ANCHOR = "distributed/kv_transfer/kv_connector/v1/hf3fs/utils/*.cpp"
CUDA_SOURCES = f"{VENDORED_PACKAGE}/csrc/*.cu"
"""The vendored files that a wheel must carry: the edit is made only where there are some."""


def needed(vendored: Iterable[str]) -> bool:
    """Whether the vendored files (tree-relative paths) include CUDA sources."""
    return any(fnmatch.fnmatchcase(path, CUDA_SOURCES) for path in vendored)


def vllm_patterns(tree: ast.Module) -> ast.List:
    """The list of the module-level `package_data = {"vllm": [...]}` assignment."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [ast.unparse(t) for t in node.targets] == ["package_data"]
            and isinstance(node.value, ast.Dict)
        ):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value == "vllm"
                    and isinstance(value, ast.List)
                ):
                    return value
    raise SiteError('no `package_data = {"vllm": [...]}` assignment at module level')


@dataclass(frozen=True)
class AnchorPattern(Find):
    """The hf3fs pattern of `package_data["vllm"]`, or its last one the patch did not add."""

    def node(self, source: Source) -> ast.AST:
        ours = {_pattern()}
        elements = [
            e
            for e in vllm_patterns(source.tree).elts
            if not (isinstance(e, ast.Constant) and e.value in ours)
        ]
        if not elements:
            raise SiteError('`package_data["vllm"]` is empty')
        return next(
            (e for e in elements if isinstance(e, ast.Constant) and e.value == ANCHOR),
            elements[-1],
        )


def _pattern() -> str:
    """The pattern the landing fragment adds."""
    expression = parse(landing("setup_package_data.py")).body[0]
    assert isinstance(expression, ast.Expr) and isinstance(expression.value, ast.Tuple)
    element = expression.value.elts[0]
    assert isinstance(element, ast.Constant) and isinstance(element.value, str)
    return element.value


def operations() -> FileOperations:
    return FileOperations(
        PATH,
        (
            InsertStatements(
                why="ship the vendored CUDA source in vLLM's wheel (package_data)",
                at=AnchorPattern("", 'pattern of `package_data["vllm"]`', lambda n: False),
                code=landing("setup_package_data.py"),
            ),
        ),
    )
