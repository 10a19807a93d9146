"""The code that lands in vLLM (vllm_patch/landing/) and the prose that cites files.

Landing files are fragments of vLLM files, so ruff does not check them here:
these tests hold them to vLLM's conventions instead (88 columns, a header that
says where the code goes), and make sure each one is used.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_patch import fork_test, releases, sources, targets
from vllm_patch.syntax import LANDING_DIR

REPO = Path(__file__).resolve().parents[2]
LANDING = sorted(p for p in LANDING_DIR.iterdir() if p.suffix in (".py", ".cmake"))


@pytest.mark.parametrize("path", LANDING, ids=lambda p: p.name)
def test_a_landing_file_says_where_it_lands_and_fits_vllm_s_88_columns(path: Path) -> None:
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# Lands "), "open with a comment saying where it lands"
    too_long = [n for n, line in enumerate(lines, 1) if len(line) > 88]
    assert not too_long, f"lines over vLLM's 88 columns: {too_long}"


@pytest.mark.parametrize("path", LANDING, ids=lambda p: p.name)
def test_every_landing_file_is_used(path: Path) -> None:
    users = [
        *(REPO / "vllm_patch" / "targets").glob("*.py"),
        REPO / "vllm_patch/fork_test.py",
    ]
    sources = "".join(p.read_text() for p in users)
    assert f'"{path.name}"' in sources, f"no target module (or fork_test.py) lands {path.name}"


def test_the_patched_lines_fit_88_columns_in_the_newest_release() -> None:
    """The lines the patch adds or changes, placeholders filled, as vLLM's ruff wants them
    (0.33.0: the names it reads off the code are short there)."""
    from vllm_patch.syntax import apply_all

    release = releases.NEWEST
    files = sources.release_files(release, targets.PATHS)
    for design in releases.Design:
        for file_ops in targets.file_operations(design, release):
            before = set(files[file_ops.path].decode().splitlines())
            after = apply_all(files[file_ops.path].decode(), file_ops).splitlines()
            added = [line for line in after if line not in before]
            assert added
            assert [line for line in added if len(line) > 88] == [], file_ops.path


def cited_paths(text: str) -> set[str]:
    """Repository paths cited in backticks: `bench/README.md`, `vllm_patch/releases.py`
    (not the path the patch adds to a vLLM tree)."""
    tops = ("runner_hooks/", "vllm_patch/", "tests/", "bench/", ".ci/")
    return {
        match.rstrip("/")
        for match in re.findall(r"`([\w./-]+)`", text)
        if match.startswith(tops) and "*" not in match and match not in fork_test.PATHS
    }


@pytest.mark.parametrize("document", ["README.md", "bench/README.md"])
def test_files_cited_in_the_docs_exist(document: str) -> None:
    cited = cited_paths((REPO / document).read_text())
    assert cited, f"{document} cites no files: the pattern is wrong"
    missing = sorted(path for path in cited if not (REPO / path).exists())
    assert missing == []
