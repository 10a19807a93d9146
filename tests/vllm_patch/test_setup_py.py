"""setup.py's edit: a wheel built from a patched source tree carries the vendored CUDA source.

The build definition is each release's own setup.py (from its sdist, fetched by
.ci/install-checks.sh); whether a file is package data is decided by setuptools'
own matching (build_py.find_data_files), over a tree holding the vendored files.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from setuptools import Distribution
from setuptools.command.build_py import build_py

from vllm_patch import releases, sdist, targets, tree, vendor
from vllm_patch.releases import Design
from vllm_patch.syntax import Source, apply_all, revert_all
from vllm_patch.targets import setup_py

HF3FS_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/utils/hf3fs_utils.cpp"


def release_setup_py(release: releases.Release) -> str:
    if not sdist.cached(release.version):
        pytest.fail(f"vLLM {release.version}'s sdist is not cached: run .ci/install-checks.sh")
    return sdist.read_members(release.version, ["setup.py"])["setup.py"].decode()


def package_data(setup_text: str) -> dict[str, list[str]]:
    """The value of setup.py's `package_data = {...}` assignment, evaluated."""
    for node in ast.parse(setup_text).body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [
            "package_data"
        ]:
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py assigns no package_data")


def data_files(setup_text: str, src: Path) -> set[str]:
    """The files of the `vllm` package under `src` that setuptools ships as its data."""
    command = build_py(
        Distribution({"packages": ["vllm"], "package_data": package_data(setup_text)})
    )
    command.finalize_options()
    command.analyze_manifest()  # no include_package_data: no manifest files
    found = command.find_data_files("vllm", str(src / "vllm"))
    return {Path(path).relative_to(src).as_posix() for path in found}


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with the vendored package and one of vLLM's own JIT sources (the control)."""
    root = tmp_path_factory.mktemp("src")
    for path, data in {**vendor.vendored_files(Design.RESET), HF3FS_SOURCE: b"// hf3fs\n"}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def cuda_sources() -> list[str]:
    paths = [p for p in vendor.vendored_files(Design.RESET) if p.endswith(".cu")]
    assert paths, "the vendored package has no CUDA source"
    return paths


@pytest.mark.parametrize("release", releases.RELEASES, ids=str)
def test_the_patched_setup_py_ships_the_vendored_cuda_source(
    release: releases.Release, src: Path
) -> None:
    pristine = release_setup_py(release)
    patched = apply_all(pristine, setup_py.operations())
    shipped = data_files(patched, src)
    assert set(cuda_sources()) <= shipped and HF3FS_SOURCE in shipped
    # The control: the release's own setup.py ships the hf3fs source, not ours.
    shipped = data_files(pristine, src)
    assert HF3FS_SOURCE in shipped and not set(cuda_sources()) & shipped
    # One pattern, after the hf3fs one, and taken back out byte for byte.
    added = set(package_data(patched)["vllm"]) - set(package_data(pristine)["vllm"])
    assert added == {setup_py.CUDA_SOURCES.removeprefix("vllm/")}
    patterns = package_data(patched)["vllm"]
    assert patterns.index(setup_py.ANCHOR) + 1 == patterns.index(added.pop())
    assert revert_all(patched, setup_py.operations()) == pristine


def test_without_the_hf3fs_pattern_the_pattern_goes_last() -> None:
    text = 'package_data = {\n    "vllm": [\n        "py.typed",\n        "a/*.json",\n    ]\n}\n'
    patched = apply_all(text, setup_py.operations())
    assert package_data(patched)["vllm"][-1] == setup_py.CUDA_SOURCES.removeprefix("vllm/")
    assert revert_all(patched, setup_py.operations()) == text


def test_a_setup_py_without_package_data_is_refused() -> None:
    with pytest.raises(Exception, match="package_data"):
        setup_py.operations().operations[0].at.node(Source("setup(name='vllm')\n", "setup.py"))


def test_setup_py_is_edited_only_where_the_tree_has_one_and_the_design_a_cu() -> None:
    for design in Design:
        with_setup = targets.file_operations(design, releases.NEWEST, setup_py_present=True)
        without = targets.file_operations(design, releases.NEWEST, setup_py_present=False)
        # Only the reset design vendors a CUDA source (the seed kernel's).
        wanted = design is Design.RESET
        assert (setup_py.PATH in [fo.path for fo in with_setup]) is wanted
        assert setup_py.PATH not in [fo.path for fo in without]
    assert not setup_py.needed(["vllm/x/__init__.py", "vllm/x/csrc/a.cu"])
    assert setup_py.needed([f"{vendor.VENDORED_PACKAGE}/csrc/a.cu"])


def test_the_pristine_tree_has_the_release_s_setup_py(pristine: Path) -> None:
    assert (pristine / "setup.py").read_text() == release_setup_py(releases.NEWEST)
    assert tree.pristine_path(releases.NEWEST).name == f"vllm-{releases.NEWEST.version}"
