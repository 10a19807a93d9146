"""The patched vLLM imported and exercised for real, on the CPU, for both designs and two
releases: the newest (0.33.0) and 0.26.0, the newest that the H200 machine's torch runs.

Each test applies a design to a copy of a pristine tree and runs the tests
under patched/ in a subprocess whose `import vllm` is that tree (a process
imports one vLLM, and each design and release is another), over the installed
vLLM 0.33.0's pure-Python dependencies, which 0.26.0's requirements accept too:
.ci/install-vllm.sh installs them with no GPU.  $SR_PREFETCH_VLLM_PYTHON names
another interpreter that has them; by default it is this one.
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
from vllm_patch import cli, gitrepo, releases, sources, targets, tree
from vllm_patch.releases import Design, Site
from vllm_patch.syntax import FileOperations, apply_all

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
    releases.NEWEST.version != VLLM_VERSION,
    reason=f"needs vLLM {releases.NEWEST.version} installed for {PYTHON} (found "
    f"{VLLM_VERSION or 'none'}); bash .ci/install-vllm.sh installs it without a GPU",
)
RELEASES = ["0.33.0", "0.26.0"]


@pytest.fixture(scope="module", params=RELEASES)
def release_pristine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    release = releases.get(request.param)
    return gitrepo.clone(
        sources.pristine_tree(release), tmp_path_factory.mktemp(release.version) / "vllm"
    )


@pytest.fixture
def release_tree(release_pristine: Path, tmp_path: Path) -> Path:
    return gitrepo.clone(release_pristine, tmp_path / "vllm")


def run_patched_tests(root: Path, design: str, *tests: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(REPO)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        PATCHED_TREE_ENV: str(root),
        "SR_PREFETCH_PATCHED_DESIGN": str(design),
        "SR_PREFETCH_PATCHED_RELEASE": tree.resolve(root).release.version,
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


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_the_patched_vllm_passes_its_cpu_tests(
    release_tree: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["apply", str(release_tree), "--design", str(design)]) == 0
    result = run_patched_tests(release_tree, design, PATCHED_TESTS)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    version = tree.resolve(release_tree).version
    with capsys.disabled():
        print(f"\n  patched vLLM {version}, {design} design: {summary}")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in summary and "failed" not in summary


def runner_call_sites() -> list:
    """Every operation of the reset design that hooks a runner call site, per release."""
    params = []
    for version in RELEASES:
        release = releases.get(version)
        for file_ops in targets.file_operations(Design.RESET, release):
            for index, operation in enumerate(file_ops.operations):
                if operation.site is not None:
                    params.append(
                        pytest.param(
                            version,
                            file_ops,
                            index,
                            id=f"{version}-{Path(file_ops.path).name}-{index}",
                        )
                    )
    return params


@pytest.fixture(scope="module")
def reset_trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tree per release with the reset design applied, shared by the mutations: each
    rewrites one file and puts it back."""
    trees = {}
    for version in RELEASES:
        root = gitrepo.clone(
            sources.pristine_tree(releases.get(version)), tmp_path_factory.mktemp(version) / "vllm"
        )
        assert cli.main(["apply", str(root)]) == 0
        trees[version] = root
    return trees


@pytest.mark.parametrize(("version", "file_ops", "index"), runner_call_sites())
def test_removing_any_runner_call_site_fails_a_test(
    reset_trees: dict[str, Path], version: str, file_ops: FileOperations, index: int
) -> None:
    root = reset_trees[version]
    operation = file_ops.operations[index]
    without = dataclasses.replace(
        file_ops, operations=tuple(op for op in file_ops.operations if op is not operation)
    )
    patched = (root / file_ops.path).read_bytes()
    pristine_text = git(root, "show", f"HEAD:{file_ops.path}")
    (root / file_ops.path).write_text(apply_all(pristine_text, without))
    try:
        result = run_patched_tests(
            root, Design.RESET, f"{PATCHED_TESTS}/test_runners.py", "-x", "-p", "no:benchmark"
        )
    finally:
        (root / file_ops.path).write_bytes(patched)
    assert result.returncode == 1, f"no test noticed: {operation.why} ({Site(operation.site)})"
    assert " failed" in result.stdout.strip().splitlines()[-1]


def test_the_mutations_start_from_a_tree_whose_runner_tests_pass(
    reset_trees: dict[str, Path],
) -> None:
    """The control for the mutations above: unmutated, the same tests pass, so a
    failure there is the removed site's."""
    for root in reset_trees.values():
        result = run_patched_tests(
            root, Design.RESET, f"{PATCHED_TESTS}/test_runners.py", "-p", "no:benchmark"
        )
        assert result.returncode == 0, result.stdout[-4000:]
