"""sr-prefetch needs no torch: apply, check, status, revert and export run in a Python that
cannot import it, and importing runner_hooks there fails with one line that says what to
install.  torch is blocked by a sitecustomize on PYTHONPATH (no second venv)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import small_git_copy, snapshot
from vllm_patch import cache
from vllm_patch.releases import NEWEST

REPO = Path(__file__).resolve().parents[2]
BLOCKER = 'import sys\n\nsys.modules["torch"] = None  # None: "cannot be imported"\n'


@pytest.fixture
def env(tmp_path: Path, pristine: Path) -> dict[str, str]:
    """The environment of a Python without torch, and a cache of its own holding a small
    copy of the newest release's pristine tree (what export patches)."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    cached = cache.pristine_path(NEWEST).relative_to(cache.cache_dir())
    small_git_copy(pristine, tmp_path / "cache" / cached)
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(blocker), str(REPO)]),
        PYTHONDONTWRITEBYTECODE="1",
        SR_PREFETCH_CACHE=str(tmp_path / "cache"),
    )


def python(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *map(str, args)], env=env, capture_output=True, text=True, check=False
    )


def test_torch_is_blocked(env: dict[str, str]) -> None:
    """The control: without the blocker this Python imports torch; with it, it cannot."""
    assert python(dict(env, PYTHONPATH=str(REPO)), "-c", "import torch").returncode == 0
    blocked = python(env, "-c", "import torch")
    assert blocked.returncode == 1 and "import of torch halted" in blocked.stderr


def test_the_commands_run_without_torch(
    env: dict[str, str], pristine: Path, tmp_path: Path
) -> None:
    root = small_git_copy(pristine, tmp_path / "vllm")
    before = snapshot(root)
    for args, expected in (
        (["check", root], "would apply cleanly"),
        (["apply", root], "Applied the reset design"),
        (["status", root], "Design applied: reset"),
        (["export", "-o", tmp_path / "reset.patch"], "Wrote the reset design"),
        (["revert", root], "Reverted the reset design"),
    ):
        done = python(env, "-m", "vllm_patch", *args)
        assert done.returncode == 0 and expected in done.stdout, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
    assert snapshot(root) == before
    assert (tmp_path / "reset.patch").read_text().startswith("From ")


def test_importing_runner_hooks_without_torch_fails_with_one_line(env: dict[str, str]) -> None:
    done = python(env, "-c", "import runner_hooks")
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith("ImportError: runner_hooks needs torch") and "pip install" in last
    assert "ModuleNotFoundError" not in done.stderr  # raised in its place, not beside it


def test_the_base_install_needs_no_torch_and_the_extras_that_run_it_do() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    extras = project["optional-dependencies"]
    for extra in ("hooks", "test", "bench"):
        assert any(dep.startswith("torch") for dep in extras[extra]), extra
