"""An installed vLLM: a site-packages directory as pip leaves it (the package beside its
vllm-*.dist-info, no git), given by path or found as the vLLM this Python imports.

`apply` keeps the files it replaces, `revert` gives them back byte for byte, and
`status` and `check` read it as they read a tree.  Two pip installs: vLLM 0.33.0
from the wheel CI already downloads, and vLLM 0.26.0 from a wheel of the few members
the patch reads, taken from its release wheel over HTTP ranges.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import run, snapshot
from vllm_patch import cache, fork_test, patch, releases, sources, targets, tree, vendor
from vllm_patch.releases import Design

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_026(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of vLLM 0.26.0 holding what the patch reads and changes: those members of
    the release's wheel, with its own METADATA and WHEEL, and a RECORD for them."""
    release = releases.get("0.26.0")
    dist = "vllm-0.26.0.dist-info"
    paths = (*targets.paths(release), "vllm/__init__.py", "vllm/_version.py")
    files = sources.release_files(release, (*paths, f"{dist}/METADATA", f"{dist}/WHEEL"))
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in sorted(files.items())]
    files[f"{dist}/RECORD"] = ("\n".join([*record, f"{dist}/RECORD,,"]) + "\n").encode()
    wheel = tmp_path_factory.mktemp("wheel") / "vllm-0.26.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pip_install(site: Path, wheel: Path) -> None:
    """`wheel` installed by pip, without its dependencies, into the directory `site`."""
    command = ["install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", *command], check=True)


@pytest.fixture
def site_026(wheel_026: Path, tmp_path: Path) -> Path:
    """vLLM 0.26.0 installed by pip into a throwaway site-packages directory."""
    site = tmp_path / "site-packages"
    pip_install(site, wheel_026)
    assert (site / "vllm-0.26.0.dist-info" / "INSTALLER").read_text().strip() == "pip"
    return site


@pytest.fixture(scope="module")
def pip_installed_033(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM 0.33.0 installed by pip (no dependencies) into a throwaway site directory."""
    wheels = sorted(cache.wheel_dir().glob("vllm-0.33.0-*.whl"))
    if not wheels:
        pytest.skip(
            f"no vLLM 0.33.0 wheel in {cache.wheel_dir()}: .ci/install-vllm.sh puts it there"
        )
    site = tmp_path_factory.mktemp("pip") / "site-packages"
    pip_install(site, wheels[0])
    return site


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_apply_check_status_revert_on_a_site_packages_directory(
    site_026: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(site_026)
    target = tree.resolve(site_026)
    assert target.kind is tree.Kind.INSTALLED and target.release.version == "0.26.0"

    status, out = run(capsys, "check", site_026, "--design", design)
    assert status == 0 and "would apply cleanly" in out, out
    assert fork_test.PATH not in out  # no tests/ in site-packages
    status, out = run(capsys, "apply", site_026, "--design", design)
    assert status == 0, out
    kept = site_026 / patch.ORIGINALS
    for path in (fo.path for fo in patch.operations(design, target)):
        if hashlib.sha256((site_026 / path).read_bytes()).hexdigest() == before[path]:
            assert not (kept / path).exists()  # no edit in this release: nothing to keep
        else:
            assert hashlib.sha256((kept / path).read_bytes()).hexdigest() == before[path]
    assert (site_026 / vendor.VENDORED_PACKAGE / "__init__.py").is_file()
    assert not (site_026 / fork_test.PATH).exists()

    status, out = run(capsys, "status", site_026)
    assert status == 0 and f"Design applied: {design}" in out and "installed vLLM" in out, out
    status, out = run(capsys, "revert", site_026)
    assert status == 0 and "the file apply replaced" in out, out
    assert snapshot(site_026) == before


def test_revert_refuses_a_file_changed_after_apply(
    site_026: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", site_026)[0] == 0
    runner = site_026 / "vllm/v1/worker/gpu_model_runner.py"
    runner.write_text(runner.read_text() + "\n# a local change\n")
    changed = snapshot(site_026)
    status, out = run(capsys, "revert", site_026)
    assert status == 1 and "was changed after the patch was applied" in out, out
    assert snapshot(site_026) == changed


def test_a_changed_installed_file_is_refused_before_apply(
    site_026: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    envs = site_026 / "vllm/envs.py"
    envs.write_text(envs.read_text() + "\n# a local change\n")
    before = snapshot(site_026)
    status, out = run(capsys, "apply", site_026)
    assert status == 1 and "differs from vLLM 0.26.0's file" in out, out
    assert snapshot(site_026) == before


def test_installed_finds_the_vllm_this_python_imports(site_026: Path) -> None:
    before = snapshot(site_026)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site_026), str(REPO)]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    def sr_prefetch(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "vllm_patch", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert str(site_026) in sr_prefetch("apply", "--installed")
    assert "Design applied: reset" in sr_prefetch("status", "--installed")
    sr_prefetch("revert", "--installed")
    assert snapshot(site_026) == before


def test_a_pip_installed_vllm_is_patched_and_given_back_byte_for_byte(
    pip_installed_033: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An installed vLLM has no setup.py or CMakeLists.txt, and the patch needs neither: it
    # compiles nothing, and leaves _custom_ops.py as it is.
    assert not any((pip_installed_033 / path).exists() for path in ("setup.py", "CMakeLists.txt"))
    watched = [*targets.PATHS, "vllm/_custom_ops.py", "vllm/__init__.py"]
    before = {path: (pip_installed_033 / path).read_bytes() for path in watched}
    status, out = run(capsys, "apply", pip_installed_033)
    assert status == 0 and "vLLM 0.33.0 (installed vLLM)" in out, out
    assert "_custom_ops.py" not in out and "missing" not in out, out
    assert (pip_installed_033 / "vllm/_custom_ops.py").read_bytes() == before["vllm/_custom_ops.py"]
    assert run(capsys, "check", pip_installed_033)[1].count("already applied") == 1
    status, out = run(capsys, "revert", pip_installed_033)
    assert status == 0, out
    assert {path: (pip_installed_033 / path).read_bytes() for path in watched} == before
    assert not (pip_installed_033 / patch.ORIGINALS).exists()
    assert not (pip_installed_033 / vendor.VENDORED_PACKAGE).exists()
