"""Fixtures for the sr-prefetch tests: pristine vLLM trees per session, a copy per test.

A pristine tree is the one `sr-prefetch apply` builds in its cache
($SR_PREFETCH_CACHE or ~/.cache/sr-prefetch) from the release's wheel, read
over HTTP ranges once per cache.  The tests under patched/ run only inside a
patched tree, started by test_patched_vllm.py; a plain run does not collect them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_patch import gitrepo, releases, sources

PATCHED_TREE_ENV = "SR_PREFETCH_PATCHED_TREE"

collect_ignore = [] if os.environ.get(PATCHED_TREE_ENV) else ["patched"]


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean work tree of the cached pristine tree of the newest release (built on
    first use); the cached one's work tree may carry `sr-prefetch apply`'s patch."""
    return gitrepo.clone(
        sources.pristine_tree(releases.NEWEST), tmp_path_factory.mktemp("pristine") / "vllm"
    )


@pytest.fixture
def vllm_tree(pristine: Path, tmp_path: Path) -> Path:
    """A fresh git clone of the newest release's pristine tree for one test."""
    return gitrepo.clone(pristine, tmp_path / "vllm")


@pytest.fixture
def no_bytecode() -> Iterator[None]:
    """Keeps imports and subprocesses from writing __pycache__ into the trees under test."""
    old = os.environ.get("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    yield
    if old is None:
        del os.environ["PYTHONDONTWRITEBYTECODE"]
    else:
        os.environ["PYTHONDONTWRITEBYTECODE"] = old


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty sr-prefetch cache of this test's own ($SR_PREFETCH_CACHE): what `apply`
    without PATH patches there is not the shared cache's pristine tree."""
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(folder))
    return folder
