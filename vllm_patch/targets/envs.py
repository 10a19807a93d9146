"""vllm/envs.py: the variables a design reads, declared for type checkers, defined, and
kept out of the compile cache hash.

landing/envs.py holds all three, shaped as envs.py is; each design takes the
variables it reads from there.  The variable only decides, at run time, where the
SSU's seeds are drawn (inside the mamba_mixer2 custom op and the model runners, which
torch.compile does not trace), so it joins compile_factors' `ignored_factors`:
turning it on or off keeps the compile cache.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass

from ..releases import Design
from ..syntax import FileOperations, Find, InsertStatements, SiteError, Source, landing

PATH = "vllm/envs.py"
PREFIX = "VLLM_MAMBA_SR_SEED_"

VARIABLES: dict[Design, tuple[str, ...]] = {
    Design.RESET: ("VLLM_MAMBA_SR_SEED_PREFETCH",),
    Design.FORWARD_CONTEXT: ("VLLM_MAMBA_SR_SEED_PREFETCH",),
}


def _is_type_checking_block(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and (node.test.id == "TYPE_CHECKING")
    )


def _is_ours(name: str | None) -> bool:
    return name is not None and name.startswith(PREFIX)


@dataclass(frozen=True)
class LastDefinition(Find):
    """The value of the last entry of the `environment_variables` dict that the patch
    did not add."""

    def node(self, source: Source) -> ast.AST:
        table = Find(
            "",
            "`environment_variables` dict",
            lambda n: (
                isinstance(n, ast.AnnAssign | ast.Assign)
                and isinstance(n.value, ast.Dict)
                and "environment_variables"
                in [
                    ast.unparse(t) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                ]
            ),
            direct=True,
        ).node(source)
        assert isinstance(table, ast.AnnAssign | ast.Assign)
        assert isinstance(table.value, ast.Dict)
        entries = [
            value
            for key, value in zip(table.value.keys, table.value.values, strict=True)
            if not (isinstance(key, ast.Constant) and _is_ours(str(key.value)))
        ]
        if not entries:
            raise SiteError("the `environment_variables` dict is empty")
        return entries[-1]


def _ignored_factors(node: ast.AST) -> bool:
    """Whether `node` is compile_factors' `ignored_factors: set[str] = {...}`."""
    return (
        isinstance(node, ast.AnnAssign)
        and ast.unparse(node.target) == "ignored_factors"
        and isinstance(node.value, ast.Set)
    )


@dataclass(frozen=True)
class LastIgnoredFactor(Find):
    """The last element of compile_factors' `ignored_factors` set that the patch did not
    add."""

    def node(self, source: Source) -> ast.AST:
        table = Find("compile_factors", "`ignored_factors` set", _ignored_factors).node(source)
        assert isinstance(table, ast.AnnAssign) and isinstance(table.value, ast.Set)
        elements = [
            element
            for element in table.value.elts
            if not (isinstance(element, ast.Constant) and _is_ours(str(element.value)))
        ]
        if not elements:
            raise SiteError("compile_factors: the `ignored_factors` set is empty")
        return elements[-1]


def _landing_ignored(names: tuple[str, ...]) -> str:
    """The entries of `names` in landing/envs.py's `ignored_factors`, each with the
    comment lines above it."""
    text = landing("envs.py")
    source = Source(text, "landing/envs.py")
    lines = text.splitlines(keepends=True)
    table = Find("compile_factors", "`ignored_factors` set", _ignored_factors).node(source)
    assert isinstance(table, ast.AnnAssign) and isinstance(table.value, ast.Set)
    entries = []
    previous_end = table.lineno
    for element in table.value.elts:
        assert isinstance(element, ast.Constant) and element.end_lineno is not None
        entry = "".join(lines[previous_end : element.end_lineno])
        previous_end = element.end_lineno
        if element.value in names:
            entries.append(entry)
    return textwrap.dedent("".join(entries))


def _landing_parts(names: tuple[str, ...]) -> tuple[str, str]:
    """The declarations and the definitions of `names`, from landing/envs.py."""
    text = landing("envs.py")
    source = Source(text, "landing/envs.py")
    lines = text.splitlines(keepends=True)
    block = next(n for n in source.tree.body if _is_type_checking_block(n))
    assert isinstance(block, ast.If)
    declarations = "".join(
        source.segment(stmt) + "\n"
        for stmt in block.body
        if isinstance(stmt, ast.AnnAssign) and ast.unparse(stmt.target) in names
    )
    table = next(n for n in source.tree.body if isinstance(n, ast.AnnAssign))
    assert isinstance(table.value, ast.Dict)
    definitions = []
    previous_end = table.lineno  # the line that opens the dict
    for key, value in zip(table.value.keys, table.value.values, strict=True):
        assert isinstance(key, ast.Constant) and value.end_lineno is not None
        # An entry is its comment lines and its key-value lines.
        entry = "".join(lines[previous_end : value.end_lineno])
        previous_end = value.end_lineno
        if key.value in names:
            definitions.append(entry)
    return textwrap.dedent(declarations), textwrap.dedent("".join(definitions))


def declarations(design: Design) -> list[str]:
    """The design's variables as landing/envs.py declares them, one `NAME: type = default`
    each (for the commit message)."""
    code = _landing_parts(VARIABLES[design])[0]
    source = Source(code)
    return [source.segment(node) for node in source.tree.body]


def definitions(design: Design) -> str:
    """The design's entries of `environment_variables` as landing/envs.py writes them,
    each with its comment lines (the plugin evaluates them: plugin.py)."""
    return _landing_parts(VARIABLES[design])[1]


def operations(design: Design) -> FileOperations:
    declarations, definitions = _landing_parts(VARIABLES[design])
    return FileOperations(
        PATH,
        (
            InsertStatements(
                why="declare the variable for type checkers",
                at=Find(
                    "",
                    "declaration in the `if TYPE_CHECKING:` block",
                    lambda n: isinstance(n, ast.AnnAssign) and not _is_ours(ast.unparse(n.target)),
                    pick="last",
                    within=_is_type_checking_block,
                ),
                code=declarations,
            ),
            InsertStatements(
                why="define it (default 0)",
                at=LastDefinition("", "entry of `environment_variables`", lambda n: False),
                code=definitions,
            ),
            InsertStatements(
                why="compile_factors leaves it out of the compile cache hash: it "
                "changes nothing torch.compile traces, so toggling it keeps the cache",
                at=LastIgnoredFactor(
                    "compile_factors", "element of `ignored_factors`", lambda n: False
                ),
                code=_landing_ignored(VARIABLES[design]),
            ),
        ),
    )
