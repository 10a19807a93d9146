"""Finding code in a Python file by its structure, and editing the text around it.

The patch never anchors on comments, indentation or surrounding lines.  A
site is a function found by its qualified name (`GPUModelRunner.execute_model`,
`ModelCudaGraphManager.capture.create_forward_fn.forward_fn`), then one
statement or expression inside it found by its syntax (the `with` statement
that calls `set_forward_context`, the call to `torch.randint`).  The stdlib
`ast` gives each node's exact span, and an edit splices new text there, so
every byte outside the edit is kept: comments, blank lines, formatting.

A file that is not Python (CMakeLists.txt) is edited the same way, at a line
found by the structure of its own language (`FindLine`, `InsertLines`).

Each operation below can also be taken back out of a file it was applied to:
`revert` finds what `apply` inserted, by the same structure, and removes it.
`revert_all` checks every revert by applying again: the result must be the
patched file byte for byte, or the file is not what the patch made.
"""

from __future__ import annotations

import ast
import functools
import io
import sys
import textwrap
import tokenize
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path


class SiteError(Exception):
    """A site is not where the patch expects it: the message names the function and what
    is missing.  patch.py adds the file and the release."""


class UnparsableError(SiteError):
    """The file is not Python that parses: the message says where it stops parsing."""


# --- the parsed file -----------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def parse(text: str) -> ast.Module:
    """`ast.parse(text)`, once per text: a command reads its texts many times (revert each
    twice), and 128 holds them all (tests/vllm_patch/test_cli.py counts).  Callers only
    read the tree, never change it."""
    return ast.parse(text)


class Source:
    """A file's text, its syntax tree, and the conversion from (line, column) to offsets.

    The tree is parsed when first asked for: the operations on a file that is not
    Python (CMakeLists.txt: `InsertLines`) read its lines only."""

    def __init__(self, text: str, path: str = "<source>") -> None:
        self.text = text
        self.path = path
        self._line_starts = [0]
        for line in text.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(line))
        self._lines = text.splitlines(keepends=True)

    @functools.cached_property
    def tree(self) -> ast.Module:
        try:
            return parse(self.text)
        except SyntaxError as error:
            raise UnparsableError(f"{error.msg}, line {error.lineno}") from None

    @property
    def lines(self) -> list[str]:
        """The text's lines, each with its line break."""
        return self._lines

    def offset(self, lineno: int, col_offset: int) -> int:
        """Text offset of an ast position (col_offset counts UTF-8 bytes)."""
        line = self._lines[lineno - 1] if lineno - 1 < len(self._lines) else ""
        return self._line_starts[lineno - 1] + len(line.encode()[:col_offset].decode())

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        return self.text[self.start(node) : self.end(node)]

    def line_start(self, lineno: int) -> int:
        return self._line_starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just past the newline of line `lineno`."""
        return self._line_starts[lineno]

    def indent_of(self, node: ast.AST) -> str:
        line = self._lines[node.lineno - 1]  # type: ignore[attr-defined]
        return line[: len(line) - len(line.lstrip())]


# --- finding things ---------------------------------------------------------------------

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef
Scope = ast.Module | ast.ClassDef | FunctionNode


def find_scope(source: Source, qualname: str) -> Scope:
    """The class or function at `qualname` ("" is the module), through nested defs."""
    scope: Scope = source.tree
    walked = []
    for name in qualname.split(".") if qualname else []:
        found = [
            node
            for node in _nodes_in(scope)
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name == name
        ]
        walked.append(name)
        if len(found) != 1:
            how = "is not defined" if not found else f"is defined {len(found)} times"
            raise SiteError(f"{'.'.join(walked)} {how}")
        scope = found[0]
    return scope


def _nodes_in(scope: Scope) -> Iterator[ast.AST]:
    """The statements of `scope`, nested blocks included, not those of nested defs."""
    stack = list(reversed(scope.body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for child in reversed(list(ast.iter_child_nodes(node))):
            if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                stack.append(child)


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def is_call(node: ast.AST, name: str) -> bool:
    """Whether `node` is a call of `name` (`set_forward_context`, `self._model_forward`)."""
    return isinstance(node, ast.Call) and dotted(node.func) == name


def contains_call(node: ast.AST, name: str) -> bool:
    return any(is_call(child, name) for child in ast.walk(node))


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


@dataclass(frozen=True)
class Find:
    """One node inside a scope: `qualname`'s statements (or expressions, with
    `expression=True`) for which `matches` holds; exactly one must.

    `what` says in words what is looked for; it is the failure message."""

    qualname: str
    what: str
    matches: Callable[[ast.AST], bool]
    expression: bool = False
    pick: str = "only"  # "only", "first" or "last" of the matches
    within: Callable[[ast.AST], bool] | None = None
    """Where set, only the direct body of the one statement it matches is searched."""
    direct: bool = False
    """Only the scope's own body, not the blocks nested in it."""

    def node(self, source: Source) -> ast.AST:
        scope = find_scope(source, self.qualname)
        statements = list(scope.body if self.direct else _nodes_in(scope))
        if self.within is not None:
            blocks = [node for node in statements if self.within(node)]
            if len(blocks) != 1:
                raise SiteError(f"{self.qualname or 'the module'}: the block for {self.what}")
            statements = list(blocks[0].body)  # type: ignore[attr-defined]
        candidates = (
            [n for stmt in statements for n in _expressions_of(stmt)]
            if self.expression
            else statements
        )
        found = [node for node in candidates if self.matches(node)]
        where = self.qualname or "the module"
        if not found:
            raise SiteError(f"{where}: no {self.what}")
        if self.pick == "only" and len(found) > 1:
            raise SiteError(f"{where}: {len(found)} of {self.what}, expected one")
        return found[-1] if self.pick == "last" else found[0]


def _expressions_of(stmt: ast.AST) -> Iterator[ast.AST]:
    """The expressions of one statement, not those of the statements nested in it."""
    stack = [c for c in ast.iter_child_nodes(stmt) if not isinstance(c, ast.stmt)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(
            c
            for c in ast.iter_child_nodes(node)
            if not isinstance(c, ast.stmt | ast.excepthandler | ast.match_case)
        )


# --- the code that lands ----------------------------------------------------------------

LANDING_DIR = Path(__file__).with_name("landing")


def landing(name: str) -> str:
    """The text of landing/`name`: code that lands in vLLM, kept as a file a reader can
    open.  Its header comment (the lines before the first blank line) says where it goes
    and is not part of what lands."""
    text = (LANDING_DIR / name).read_text(encoding="utf-8")
    head, _, body = text.partition("\n\n")
    if not all(line.startswith("#") for line in head.splitlines()):
        raise ValueError(f"landing/{name} must open with a comment block, then a blank line")
    return body.strip("\n") + "\n"


def substitute(code: str, names: Mapping[str, str]) -> str:
    """`code` with each placeholder NAME token replaced by its text (a refactoring
    rename: names inside strings and comments are left alone)."""
    if not names:
        return code
    tokens = tokenize.generate_tokens(io.StringIO(code).readline)
    pieces: list[str] = []
    lines = code.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    last = 0
    for token in tokens:
        if token.type == tokenize.NAME and token.string in names:
            start = starts[token.start[0] - 1] + token.start[1]
            end = starts[token.end[0] - 1] + token.end[1]
            pieces += [code[last:start], names[token.string]]
            last = end
    pieces.append(code[last:])
    return "".join(pieces)


def indent(code: str, prefix: str) -> str:
    return textwrap.indent(code, prefix, lambda line: line.strip() != "")


# --- operations -------------------------------------------------------------------------

Names = Callable[[Source], dict[str, str]]
"""Placeholder -> text, read off the file being patched (e.g. the attention metadata's
variable name, from the `set_forward_context` call beside the site)."""


def _no_names(source: Source) -> dict[str, str]:
    return {}


@dataclass(frozen=True, kw_only=True)
class Operation:
    """One structural edit at the node `at`.  `why` is what a reviewer reads in `check`'s
    report; `site` names the runner call site it hooks, if it is one."""

    why: str
    at: Find
    """The node the edit is made at."""
    site: str | None = None

    def apply(self, source: Source) -> str:
        raise NotImplementedError

    def revert(self, source: Source) -> str:
        raise NotImplementedError

    def located(self, source: Source) -> str:
        """Where the edit lands, for check and `sr-prefetch versions`."""
        return f"line {self.at.node(source).lineno}"  # type: ignore[attr-defined]


def _join_if_it_fits(code: str, columns: int = 88) -> str:
    """`f(\n    a, b\n)` as `f(a, b)` where that fits in `columns` (blank lines kept)."""
    lead = code[: len(code) - len(code.lstrip("\n"))]
    body = code.strip("\n")
    lines = body.splitlines()
    if len(lines) != 3 or not lines[0].endswith("(") or lines[2].strip() != ")":
        return code
    joined = lines[0] + lines[1].strip() + ")"
    return lead + joined + "\n" if len(joined) <= columns else code


def _splice(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _expect(source: Source, start: int, expected: str, what: str) -> None:
    if source.text[start : start + len(expected)] != expected:
        raise SiteError(f"{what}: the inserted code is not where the patch puts it")


@dataclass(frozen=True, kw_only=True)
class InsertStatements(Operation):
    """Whole lines of `code` (a landing file's text, placeholders filled) inserted
    before or after the statement `at`, at its indentation."""

    code: str | Callable[[Source], str]
    """The code, or a function of the file that picks it (a release's variant)."""
    after: bool = True
    names: Names = _no_names
    join_if_it_fits: bool = False
    """For a one-statement call wrapped as `f(\n    args\n)`: written on one line where
    that fits vLLM's 88 columns, as ruff would (the arguments may vary by release)."""

    def _render(self, source: Source) -> tuple[int, str]:
        stmt = self.at.node(source)
        if self.after:
            position = source.line_end(stmt.end_lineno or stmt.lineno)
        else:
            first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", []))])
            position = source.line_start(first)
        chosen = self.code(source) if callable(self.code) else self.code
        code = indent(substitute(chosen, self.names(source)), source.indent_of(stmt))
        return position, _join_if_it_fits(code) if self.join_if_it_fits else code

    def apply(self, source: Source) -> str:
        position, new = self._render(source)
        return _splice(source.text, position, position, new)

    def revert(self, source: Source) -> str:
        position, new = self._render(source)
        if not self.after:
            # The anchor moved down by what was inserted before it.
            position -= len(new)
        _expect(source, position, new, self.why)
        return _splice(source.text, position, position + len(new), "")

    def located(self, source: Source) -> str:
        stmt = self.at.node(source)
        return f"{'after' if self.after else 'before'} line {stmt.lineno}"  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class AddWithItem(Operation):
    """A context manager `code` added to the `with` statement `at`, after its item for
    which `after_item` holds, on a line of its own.  A `with` that is not parenthesized
    yet becomes `with (...)`, one item a line, as ruff formats a `with` of several
    items: its items' lines are the only existing lines re-indented."""

    after_item: Callable[[ast.withitem], bool]
    code: str | Callable[[Source], str]
    """The item's code, or a function of the file that picks it (a release's variant)."""
    names: Names = _no_names
    step: str = "    "

    def _with(self, source: Source) -> tuple[ast.With, ast.withitem]:
        stmt = self.at.node(source)
        assert isinstance(stmt, ast.With), self.at.what
        items = [i for i in stmt.items if self.after_item(i)]
        if len(items) != 1:
            raise SiteError(f"{self.at.qualname}: the {self.at.what} has no such item")
        return stmt, items[0]

    @staticmethod
    def _parenthesized(source: Source, stmt: ast.With) -> bool:
        return "(" in source.text[source.start(stmt) : source.start(stmt.items[0].context_expr)]

    @staticmethod
    def _item_end(source: Source, item: ast.withitem) -> int:
        return source.end(item.optional_vars or item.context_expr)

    def _insertion(self, source: Source) -> tuple[int, str]:
        """Where, in a parenthesized `with`, the new item's lines go, and the lines."""
        stmt, item = self._with(source)
        chosen = self.code(source) if callable(self.code) else self.code
        code = substitute(chosen, self.names(source)).rstrip("\n")
        last = item.optional_vars or item.context_expr
        line = last.end_lineno or stmt.lineno
        if (
            not source.text[self._item_end(source, item) : source.line_end(line)]
            .strip()
            .startswith(",")
        ):
            raise SiteError(f"{self.at.qualname}: {self.at.what}: item not comma-ended")
        return source.line_end(line), indent(code, source.indent_of(item.context_expr)) + ",\n"

    def _parenthesize(self, source: Source) -> str:
        """The text with the `with` at `at` written `with (\n    a,\n    b,\n):`."""
        stmt, _ = self._with(source)
        outer = source.indent_of(stmt)
        colon = source.text.index(":", self._item_end(source, stmt.items[-1]))
        lines = []
        for item in stmt.items:
            text = source.text[source.start(item.context_expr) : self._item_end(source, item)]
            first, _, rest = text.partition("\n")
            continuation = "\n" + indent(rest, self.step) if rest else ""
            lines.append(outer + self.step + first + continuation)
        header = "with (\n" + ",\n".join(lines) + ",\n" + outer + "):"
        return _splice(source.text, source.start(stmt), colon + 1, header)

    def apply(self, source: Source) -> str:
        stmt, _ = self._with(source)
        if not self._parenthesized(source, stmt):
            source = Source(self._parenthesize(source), source.path)
        position, new = self._insertion(source)
        return _splice(source.text, position, position, new)

    def revert(self, source: Source) -> str:
        position, new = self._insertion(source)
        _expect(source, position, new, self.why)
        kept = Source(_splice(source.text, position, position + len(new), ""), source.path)
        # Both ways of writing the `with` before turn into this text: take the one ruff
        # writes, without parentheses for a single item (a parenthesized single item
        # would come back without them; the check after revert_all cannot tell).
        stmt, _ = self._with(kept)
        single = len(stmt.items) == 1
        candidate = self._unparenthesize(kept) if single else kept.text
        if candidate is None or self.apply(Source(candidate, source.path)) != source.text:
            raise SiteError(f"{self.why}: the `with` is not written as the patch writes it")
        return candidate

    def _unparenthesize(self, source: Source) -> str | None:
        stmt, _ = self._with(source)
        texts = []
        for item in stmt.items:
            text = source.text[source.start(item.context_expr) : self._item_end(source, item)]
            first, _, rest = text.partition("\n")
            if rest and not all(
                line.startswith(self.step) or not line.strip() for line in rest.splitlines()
            ):
                return None
            dedented = "\n".join(
                line[len(self.step) :] if line.strip() else line for line in rest.splitlines()
            )
            texts.append(first + ("\n" + dedented if rest else ""))
        colon = source.text.index(":", self._item_end(source, stmt.items[-1]))
        header = "with " + ", ".join(texts) + ":"
        return _splice(source.text, source.start(stmt), colon + 1, header)


@dataclass(frozen=True, kw_only=True)
class WrapInIf(Operation):
    """The one statement `at` put inside `if <code>:` (no else), one level deeper; its
    own lines are the only ones re-indented."""

    code: str
    names: Names = _no_names
    step: str = "    "

    def _header(self, source: Source, stmt: ast.stmt) -> str:
        code = substitute(self.code, self.names(source)).rstrip("\n")
        return indent(f"if {code}:\n", source.indent_of(stmt))

    def apply(self, source: Source) -> str:
        stmt = self.at.node(source)
        assert isinstance(stmt, ast.stmt)
        start, end = source.line_start(stmt.lineno), source.line_end(stmt.end_lineno or 0)
        body = indent(source.text[start:end], self.step)
        return _splice(source.text, start, end, self._header(source, stmt) + body)

    def revert(self, source: Source) -> str:
        inner = self.at.node(source)
        assert isinstance(inner, ast.stmt)
        wrapper = Find(
            self.at.qualname,
            f"if statement around the {self.at.what}",
            lambda node: isinstance(node, ast.If) and node.body == [inner] and not node.orelse,
        ).node(source)
        assert isinstance(wrapper, ast.If)
        start, end = source.line_start(wrapper.lineno), source.line_end(wrapper.end_lineno or 0)
        header = self._header(source, wrapper)
        _expect(source, start, header, self.why)
        body = source.text[start + len(header) : end]
        lines = body.splitlines(keepends=True)
        if not all(line.startswith(self.step) or not line.strip() for line in lines):
            raise SiteError(f"{self.why}: the wrapped statement is not indented by the patch")
        original = "".join(line[len(self.step) :] if line.strip() else line for line in lines)
        return _splice(source.text, start, end, original)


@dataclass(frozen=True, kw_only=True)
class ReplaceExpression(Operation):
    """The expression `at` replaced by `code`; `patched` finds `code` again to revert,
    where the expression `at` found is put back as `original` (placeholders filled)."""

    code: str
    patched: Find
    original: str
    names: Names = _no_names

    def apply(self, source: Source) -> str:
        node = self.at.node(source)
        new = substitute(self.code, self.names(source))
        return _splice(source.text, source.start(node), source.end(node), new)

    def revert(self, source: Source) -> str:
        node = self.patched.node(source)
        _expect(source, source.start(node), substitute(self.code, self.names(source)), self.why)
        old = substitute(self.original, self.names(source))
        return _splice(source.text, source.start(node), source.end(node), old)


@dataclass(frozen=True, kw_only=True)
class AddArgument(Operation):
    """`code` added as the last argument of the call `at` (a keyword, `name=value`), or as
    the last parameter of the function `at` (keyword-only: after `*,` where there is
    none).  Both must be written one per line with a trailing comma, as ruff formats them
    once they overflow a line."""

    code: str
    keyword_only: bool = False

    def _render(self, source: Source) -> tuple[int, str]:
        node = self.at.node(source)
        if isinstance(node, ast.Call):
            parts: list[ast.AST] = [*node.args, *(k for k in node.keywords)]
            extra = ""
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            parts = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs]
            needs_star = self.keyword_only and not a.kwonlyargs and a.vararg is None
            extra = "*,\n" if needs_star else ""
        else:
            raise SiteError(f"{self.at.qualname}: {self.at.what} is not a call or a def")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # A parameter's node ends at its annotation; its default comes after.
            defaults = [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
            parts = [*parts, *defaults]
        if not parts:
            raise SiteError(f"{self.at.qualname}: {self.at.what} has no arguments to follow")
        last = max(parts, key=lambda p: (p.end_lineno, p.end_col_offset))  # type: ignore[attr-defined]
        last_line = last.end_lineno or 0  # type: ignore[attr-defined]
        tail = source.text[source.end(last) : source.line_end(last_line)]
        if not tail.strip().startswith(","):
            raise SiteError(
                f"{self.at.qualname}: {self.at.what} is not one argument per line with a "
                "trailing comma"
            )
        prefix = source.indent_of(last)
        return source.line_end(last_line), indent(extra + self.code.rstrip("\n") + ",\n", prefix)

    def apply(self, source: Source) -> str:
        position, new = self._render(source)
        return _splice(source.text, position, position, new)

    def revert(self, source: Source) -> str:
        # In the patched file the added argument is the last one: its lines go, and
        # the `*,` the patch put before it, where it was the only keyword-only one.
        node = self.at.node(source)
        parts = (
            [*node.args, *node.keywords]
            if isinstance(node, ast.Call)
            else [*node.args.args, *node.args.kwonlyargs]  # type: ignore[attr-defined]
        )
        if not parts:
            raise SiteError(f"{self.why}: the added argument is not there")
        last = parts[-1]
        first_line = last.lineno  # type: ignore[attr-defined]
        defaults = node.args.kw_defaults if not isinstance(node, ast.Call) else []  # type: ignore[attr-defined]
        ends = [last, *(d for d in defaults[-1:] if d is not None)]
        last_line = max(e.end_lineno or e.lineno for e in ends)  # type: ignore[attr-defined]
        start, end = source.line_start(first_line), source.line_end(last_line)
        if source.text[start:end].strip() != self.code.strip() + ",":
            raise SiteError(f"{self.why}: the added argument is not there")
        if (
            self.keyword_only
            and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and len(node.args.kwonlyargs) == 1
            and source.text[source.line_start(first_line - 1) : start].strip() == "*,"
        ):
            start = source.line_start(first_line - 1)
        return _splice(source.text, start, end, "")


@dataclass(frozen=True, kw_only=True)
class AddImportedNames(Operation):
    """`names` added to the `from ... import` statement `at`, sorted as ruff's isort
    sorts them (constants, classes, then functions), and the statement written as ruff
    writes it: on one line where it fits, else one name per line."""

    names: tuple[str, ...]
    line_length: int = 88

    def _statement(self, source: Source) -> ast.ImportFrom:
        node = self.at.node(source)
        if not isinstance(node, ast.ImportFrom) or any(a.asname for a in node.names):
            raise SiteError(f"{self.at.what} is not a plain `from ... import` statement")
        return node

    def _render(self, node: ast.ImportFrom, names: list[str], exploded: bool, prefix: str) -> str:
        names = sorted(set(names), key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
        line = f"{prefix}from {node.module} import {', '.join(names)}\n"
        if not exploded and len(line) - 1 <= self.line_length:
            return line
        body = "".join(f"{prefix}    {name},\n" for name in names)
        return f"{prefix}from {node.module} import (\n{body}{prefix})\n"

    def _replace(self, source: Source, names: list[str], exploded: bool) -> str:
        node = self._statement(source)
        start, end = source.line_start(node.lineno), source.line_end(node.end_lineno or 0)
        new = self._render(node, names, exploded, source.indent_of(node))
        return _splice(source.text, start, end, new)

    def apply(self, source: Source) -> str:
        node = self._statement(source)
        present = [a.name for a in node.names]
        if set(self.names) & set(present):
            raise SiteError(f"{self.at.what} imports {', '.join(self.names)} already")
        exploded = "(" in source.segment(node)
        return self._replace(source, present + list(self.names), exploded)

    def revert(self, source: Source) -> str:
        present = [a.name for a in self._statement(source).names]
        if not set(self.names) <= set(present):
            raise SiteError(f"{self.why}: the added names are not imported")
        kept = [name for name in present if name not in self.names]
        for exploded in (False, True):
            candidate = self._replace(source, kept, exploded)
            try:
                if self.apply(Source(candidate)) == source.text:
                    return candidate
            except SiteError:
                continue
        raise SiteError(f"{self.why}: the import is not written as the patch writes it")


@dataclass(frozen=True, kw_only=True)
class OnlyWhere(Operation):
    """`operation`, in a file where `holds` (read off the code: a release that has
    the function it edits); elsewhere nothing.  Build it with `only_where`."""

    operation: Operation
    holds: Callable[[Source], bool]

    def apply(self, source: Source) -> str:
        return self.operation.apply(source) if self.holds(source) else source.text

    def revert(self, source: Source) -> str:
        return self.operation.revert(source) if self.holds(source) else source.text

    def located(self, source: Source) -> str:
        return self.operation.located(source) if self.holds(source) else "not in this release"


def only_where(holds: Callable[[Source], bool], operation: Operation) -> OnlyWhere:
    return OnlyWhere(why=operation.why, at=operation.at, operation=operation, holds=holds)


# --- files that are not Python ---------------------------------------------------------


@dataclass(frozen=True)
class FindLine:
    """One line of a file that is not Python (CMakeLists.txt), found by the structure of
    its text: `index` takes the file's lines (each with its line break) and returns the
    index of the line, or raises SiteError.  `what` says in words what is looked for."""

    what: str
    index: Callable[[list[str]], int]

    def lineno(self, source: Source) -> int:
        return self.index(source.lines) + 1


@dataclass(frozen=True, kw_only=True)
class InsertLines(Operation):
    """Whole lines of `code` inserted before the line `at` finds, in a file that is not
    Python: only its lines are read.  Revert finds that line again, below the inserted
    lines, and takes out exactly those."""

    at: FindLine  # type: ignore[assignment]
    code: str

    def apply(self, source: Source) -> str:
        position = source.line_start(self.at.lineno(source))
        return _splice(source.text, position, position, self.code)

    def revert(self, source: Source) -> str:
        position = source.line_start(self.at.lineno(source)) - len(self.code)
        if position < 0:
            raise SiteError(f"{self.why}: the inserted lines are not where the patch puts them")
        _expect(source, position, self.code, self.why)
        return _splice(source.text, position, position + len(self.code), "")

    def located(self, source: Source) -> str:
        return f"before line {self.at.lineno(source)}"


# --- a file's operations, applied in order ---------------------------------------------


@dataclass(frozen=True)
class FileOperations:
    """The operations on one existing vLLM file, applied in order."""

    path: str
    operations: tuple[Operation, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Edit:
    """One operation of a file's, applied by each_edit: the text it was applied to, the
    text it made, where it landed (asked for with `located`), or the SiteError that
    stopped it, in which case `text` is the text it was given."""

    operation: Operation
    source: Source
    text: str
    where: str | None = None
    error: SiteError | None = None


def each_edit(text: str, operations: FileOperations, *, located: bool = False) -> Iterator[Edit]:
    """Every operation of `operations`, applied in order from `text`: an Edit each.  One
    that fails leaves the text as it was for the next; the caller stops or goes on."""
    for operation in operations.operations:
        source = Source(text, operations.path)
        try:
            where = operation.located(source) if located else None
            text = operation.apply(source)
        except SiteError as error:
            yield Edit(operation, source, text, error=error)
            continue
        yield Edit(operation, source, text, where)


def apply_all(text: str, operations: FileOperations) -> str:
    """`text` with every operation applied, or SiteError naming the first that fails."""
    for edit in each_edit(text, operations):
        if edit.error is not None:
            raise SiteError(f"{edit.operation.why}: {edit.error}")
        text = edit.text
    return text


def revert_all(text: str, operations: FileOperations) -> str:
    """The text `operations` were applied to, checked by applying them again; SiteError
    when `text` is not exactly that, patched."""
    original = text
    for operation in reversed(operations.operations):
        try:
            original = operation.revert(Source(original, operations.path))
        except SiteError as error:
            raise SiteError(f"{operation.why}: {error}") from None
    if apply_all(original, operations) != text:
        raise SiteError("the file differs from what the patch makes of its original")
    return original


def stdlib_import(node: ast.AST) -> bool:
    """A top-level import of the standard library."""
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] in sys.stdlib_module_names
    return False


def same_syntax(code: str) -> Callable[[ast.AST], bool]:
    """Matches a node written as `code`, one statement or expression, whatever its
    layout: the same syntax tree (ast.dump, which leaves positions out)."""
    (statement,) = parse(code.strip()).body
    expected = statement.value if isinstance(statement, ast.Expr) else statement
    dump = ast.dump(expected)
    return lambda node: isinstance(node, type(expected)) and ast.dump(node) == dump


def imports_from(module: str) -> Callable[[ast.AST], bool]:
    return lambda node: isinstance(node, ast.ImportFrom) and node.module == module
