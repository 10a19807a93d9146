"""CMakeLists.txt: the seed op built by vLLM's own CMake, as the `_mamba_sr_C` extension.

A source tree only (the reset design): its setup.py asks for the extension
(targets/setup_py.py), and the patch adds the source as csrc/mamba/stock_seeds.cu
(patch.py).  The target (landing/cmake_mamba_sr_target.cmake) goes before the
top-level block that includes the first of `cmake/external_projects/`: by then
every extension target of vLLM's own is defined with the CUDA architectures and
flags it uses (`CUDA_ARCHS`, `VLLM_GPU_FLAGS`, `VLLM_GPU_ARCHES`), and the
external projects follow, vllm_flash_attn.cmake last as it overrides CMake
functions.  The site is found in CMake's own grammar, commands and their blocks
(`commands` below), not by the text of a line: in every supported release it is
the `if(VLLM_GPU_LANG STREQUAL "CUDA" OR VLLM_GPU_LANG STREQUAL "HIP")` block
that includes triton_kernels.cmake, with the comment line above it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..syntax import FileOperations, FindLine, InsertLines, SiteError, landing

PATH = "CMakeLists.txt"
EXTENSION = "_mamba_sr_C"
SOURCE = "csrc/mamba/stock_seeds.cu"
"""Where the patch adds the op's source in a source tree (the target builds it)."""
ORIGIN = "core/csrc/stock_seeds.cu"
"""The source it adds: runner_hooks' (this path inside the package), byte for byte."""
EXTERNAL_PROJECTS = "cmake/external_projects/"
REQUIRED_BEFORE = ("override_gpu_arches", "set_gencode_flags_for_srcs")
"""Commands that must come before the site: the one that sets VLLM_GPU_ARCHES, and a use
of the macro the target calls (defined by cmake/utils.cmake, included early)."""

_OPENS = {"if", "foreach", "while", "function", "macro", "block"}
_CLOSES = {"endif", "endforeach", "endwhile", "endfunction", "endmacro", "endblock"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET_OPEN = re.compile(r"\[(=*)\[")


@dataclass(frozen=True)
class Command:
    """One command invocation: its name (lower case, as CMake compares them), the text
    of its arguments, and the indices of its first and last lines."""

    name: str
    arguments: str
    first: int
    last: int


def commands(lines: list[str]) -> tuple[list[Command], set[int]]:
    """The file's command invocations in order, and the indices of its lines that hold
    a comment only.  CMake's grammar, as far as finding commands needs it: `name(...)`
    with nested parentheses, quoted arguments (with escapes), bracket arguments and
    comments (`[==[ ... ]==]`, `#[[ ... ]]`) and line comments, over any lines."""
    text = "".join(lines)
    line_of = [index for index, line in enumerate(lines) for _ in line]
    found: list[Command] = []
    comment_only: set[int] = set()
    position, end = 0, len(text)
    while position < end:
        char = text[position]
        if char.isspace():
            position += 1
        elif char == "#":
            start = position
            position = _skip_comment(text, position)
            first, last = line_of[start], line_of[max(start, position - 1)]
            if not text[text.rfind("\n", 0, start) + 1 : start].strip():
                comment_only.update(range(first, last + 1))
        else:
            match = _NAME.match(text, position)
            if match is None:
                raise SiteError(f"line {line_of[position] + 1}: not a CMake command")
            opening = match.end()
            while opening < end and text[opening] in " \t":
                opening += 1
            if opening >= end or text[opening] != "(":
                raise SiteError(f"line {line_of[position] + 1}: {match.group()} without '('")
            closing = _skip_arguments(text, opening)
            found.append(
                Command(
                    match.group().lower(),
                    text[opening + 1 : closing - 1],
                    line_of[position],
                    line_of[closing - 1],
                )
            )
            position = closing
    return found, comment_only


def _skip_comment(text: str, position: int) -> int:
    """The offset just past the comment at `position` (a `#`): a bracket comment, or to
    the end of the line (the line break not included)."""
    bracket = _BRACKET_OPEN.match(text, position + 1)
    if bracket is not None:
        return _skip_bracket(text, bracket)
    newline = text.find("\n", position)
    return len(text) if newline < 0 else newline


def _skip_bracket(text: str, opening: re.Match[str]) -> int:
    close = text.find(f"]{opening.group(1)}]", opening.end())
    if close < 0:
        raise SiteError("a bracket argument or comment is not closed")
    return close + len(opening.group(1)) + 2


def _skip_arguments(text: str, opening: int) -> int:
    """The offset just past the `)` that closes the `(` at `opening`."""
    depth, position = 0, opening
    while position < len(text):
        char = text[position]
        if char == "\\":
            position += 2
            continue
        if char == '"':
            position += 1
            while position < len(text) and text[position] != '"':
                position += 2 if text[position] == "\\" else 1
        elif char == "#":
            position = _skip_comment(text, position)
            continue
        elif char == "[" and (bracket := _BRACKET_OPEN.match(text, position)):
            position = _skip_bracket(text, bracket)
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    raise SiteError("a command's arguments are not closed")


def _first_argument(command: Command) -> str:
    words = command.arguments.split()
    return words[0].strip('"') if words else ""


def site(lines: list[str]) -> int:
    """The index of the line the target goes before: the first line of the comment
    directly above the top-level command (a block's opening, or the include itself) that
    holds the first `include(cmake/external_projects/...)`."""
    found, comment_only = commands(lines)
    depth, top, anchor = 0, None, None
    for command in found:
        if depth == 0:
            top = command
        if command.name == "include" and _first_argument(command).startswith(EXTERNAL_PROJECTS):
            anchor = top
            break
        if command.name in _OPENS:
            depth += 1
        elif command.name in _CLOSES:
            depth -= 1
    if anchor is None:
        raise SiteError(
            f"no `include({EXTERNAL_PROJECTS}...)` command, before whose block the "
            f"{EXTENSION} target goes"
        )
    before = {command.name for command in found if command.last < anchor.first}
    missing = [name for name in REQUIRED_BEFORE if name not in before]
    if missing:
        raise SiteError(
            f"no `{missing[0]}(...)` before the block that includes {EXTERNAL_PROJECTS}: the "
            f"{EXTENSION} target needs the CUDA architectures set there"
        )
    first = anchor.first
    while first - 1 in comment_only:
        first -= 1
    return first


def source_bytes() -> bytes:
    """The op's source as the patch adds it: runner_hooks' copy, found without importing
    runner_hooks (no torch needed)."""
    from ..vendor import FOREIGN_NAMES, VendorError, source_dir

    origin = source_dir() / ORIGIN
    data = origin.read_bytes()
    foreign = [name for name in FOREIGN_NAMES if name.encode() in data]
    if foreign:
        raise VendorError(f"{origin} names {foreign[0]!r}, which is not part of vLLM")
    return data


def operations() -> FileOperations:
    return FileOperations(
        PATH,
        (
            InsertLines(
                why=f"build the seed op ({SOURCE}) as the {EXTENSION} extension",
                at=FindLine(f"the top-level block that includes {EXTERNAL_PROJECTS} first", site),
                code=landing("cmake_mamba_sr_target.cmake") + "\n",
            ),
        ),
    )
