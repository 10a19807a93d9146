"""Prose in the code names what exists: the repository files that docstrings and comments
cite, and the project's environment variables (SR_*, VLLM_MAMBA_SR_*) they name."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from .test_readme_commands import _CITED, _exists

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench", "runner_hooks", "tests", "vllm_patch")
_ENV = re.compile(r"(?<![\w$])\$?\{?((?:SR|VLLM_MAMBA_SR)_[A-Z0-9_]*[A-Z0-9])\b")


def split(path: str, text: str) -> tuple[list[tuple[int, str]], str]:
    """(line, prose) of a Python or shell file's docstrings and comments, and its code."""
    if path.endswith(".sh"):
        lines = list(enumerate(text.splitlines(), 1))
        prose = [(n, line) for n, line in lines if line.lstrip().startswith("#")]
        return prose, "\n".join(line for n, line in lines if not line.lstrip().startswith("#"))
    docstrings = {
        (node.body[0].lineno, node.body[0].end_lineno)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    }
    prose, code = [], []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        is_doc = token.type == tokenize.STRING and (token.start[0], token.end[0]) in docstrings
        if token.type == tokenize.COMMENT or is_doc:
            prose.append((token.start[0], token.string))
        else:
            code.append(token.string)
    return prose, " ".join(code)


def sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text()
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*"))
        if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts
    }


def missing_files(texts: dict[str, str]) -> list[str]:
    return [
        f"{path}:{line}: {cited}"
        for path, text in texts.items()
        for line, prose in split(path, text)[0]
        for cited in _CITED.findall(prose)
        if not _exists(cited)
    ]


def unknown_variables(texts: dict[str, str]) -> list[str]:
    parts = {path: split(path, text) for path, text in texts.items()}
    read = {name for _, code in parts.values() for name in _ENV.findall(code)}
    return [
        f"{path}:{line}: {name}"
        for path, (prose, _) in parts.items()
        for line, text in prose
        for name in _ENV.findall(text)
        if name not in read
    ]


def test_files_cited_in_code_prose_exist() -> None:
    assert missing_files(sources()) == []


def test_variables_named_in_code_prose_are_read_by_code() -> None:
    assert unknown_variables(sources()) == []


def test_the_checks_can_fail() -> None:
    planted = {
        "bench/planted.py": '"""See bench/gone.py; set SR_ENGINE_GONE."""\n'
        'import os\nos.environ.get("SR_ENGINE_KEPT")  # SR_ENGINE_KEPT, bench/stats.py\n',
        "tests/planted.sh": "# runs tests/gone.sh with $SR_PREFETCH_GONE\necho $SR_ENGINE_KEPT\n",
    }
    assert missing_files(planted) == [
        "bench/planted.py:1: bench/gone.py",
        "tests/planted.sh:1: tests/gone.sh",
    ]
    assert unknown_variables(planted) == [
        "bench/planted.py:1: SR_ENGINE_GONE",
        "tests/planted.sh:1: SR_PREFETCH_GONE",
    ]
