"""The patched vLLM imported and exercised for real, on the CPU, for both designs.

Each test applies a design to a copy of the pristine tree and runs the tests
under patched/ in a subprocess whose `import vllm` is that tree (a process
imports one vLLM, and the two designs are two of them), over the installed
vLLM 0.33.0's pure-Python dependencies: .ci/install-vllm.sh installs them
with no GPU.  $SR_PREFETCH_VLLM_PYTHON names another interpreter that has
them; by default it is this one.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_patch.conftest import PATCHED_TREE_ENV
from tests.vllm_patch.helpers import git
from vllm_patch import cli, edits, patch, tree

REPO = Path(__file__).resolve().parents[2]
PATCHED_TESTS = "tests/vllm_patch/patched"
PYTHON = os.environ.get("SR_PREFETCH_VLLM_PYTHON", sys.executable)


def installed_vllm() -> str | None:
    result = subprocess.run(
        [PYTHON, "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else None


VLLM_VERSION = installed_vllm()
pytestmark = pytest.mark.skipif(
    VLLM_VERSION != tree.SUPPORTED_VERSION,
    reason=f"needs vLLM {tree.SUPPORTED_VERSION} installed for {PYTHON} (found "
    f"{VLLM_VERSION or 'none'}); bash .ci/install-vllm.sh installs it without a GPU",
)


def run_patched_tests(root: Path, design: str, *tests: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        PATCHED_TREE_ENV: str(root),
        "SR_PREFETCH_PATCHED_DESIGN": design,
    }
    command = [PYTHON, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", "-rs"]
    return subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


@pytest.mark.parametrize("design", sorted(edits.DESIGNS))
def test_the_patched_vllm_passes_its_cpu_tests(
    vllm_tree: Path, design: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["apply", str(vllm_tree), "--design", design]) == 0
    result = run_patched_tests(vllm_tree, design, PATCHED_TESTS)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    with capsys.disabled():
        print(f"\n  patched vLLM, {design} design: {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in summary and "failed" not in summary


RUNNER_CALL_SITES = [
    pytest.param(file_edits, index, id=f"{Path(file_edits.path).name}-{index}")
    for file_edits in edits.DESIGNS[edits.RESET].file_edits
    if file_edits.path in (edits.V1_RUNNER, edits.V2_RUNNER, edits.V2_CUDAGRAPH)
    for index, edit in enumerate(file_edits.edits)
    if not edit.why.startswith("import")
]


@pytest.mark.parametrize(("file_edits", "index"), RUNNER_CALL_SITES)
def test_removing_any_runner_call_site_fails_a_test(
    vllm_tree: Path, file_edits: edits.FileEdits, index: int
) -> None:
    assert cli.main(["apply", str(vllm_tree)]) == 0
    without = dataclasses.replace(
        file_edits, edits=tuple(e for i, e in enumerate(file_edits.edits) if i != index)
    )
    pristine_text = git(vllm_tree, "show", f"HEAD:{file_edits.path}")
    mutant, problems = patch.edit_text(pristine_text, without)
    assert not problems
    (vllm_tree / file_edits.path).write_text(mutant)
    result = run_patched_tests(vllm_tree, edits.RESET, f"{PATCHED_TESTS}/test_runners.py")
    assert result.returncode == 1, f"no test noticed: {file_edits.edits[index].why}"
    assert " failed" in result.stdout.strip().splitlines()[-1]
