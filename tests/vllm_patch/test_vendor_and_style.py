"""The vendored copy of runner_hooks, and what sr-prefetch and runner_hooks ship.

vLLM's own checks of the code the patch puts into vLLM are the release's pre-commit
hooks, run on each design's export (test_precommit.py).
"""

from __future__ import annotations

import ast
import fnmatch
import shutil
from pathlib import Path, PurePosixPath

import pytest

from vllm_patch import releases, vendor
from vllm_patch.releases import Design
from vllm_patch.syntax import LANDING_DIR

REPO = Path(__file__).resolve().parents[2]

# --- vendoring --------------------------------------------------------------------------------


HEADER = vendor.SPDX_HEADER


def test_a_module_gets_vllms_logger() -> None:
    source = (
        HEADER + '"""Doc."""\n\nfrom __future__ import annotations\n\n'
        "import torch\n\nfrom .._logging import init_logger\nfrom .prefetch import SeedBatch\n\n"
        "logger = init_logger(__name__)\n"
    )
    vendored = vendor._use_init_logger(source, vendor.source_dir(), PurePosixPath("core/x.py"))
    assert vendored == (
        HEADER + '"""Doc."""\n\nfrom __future__ import annotations\n\n'
        "import torch\n\nfrom vllm.logger import init_logger\n\nfrom .prefetch import SeedBatch\n\n"
        "logger = init_logger(__name__)\n"
    )


def test_the_logger_import_must_be_init_logger_alone() -> None:
    source = HEADER + "import torch\n\nfrom .._logging import functools, init_logger\n"
    with pytest.raises(vendor.VendorError, match="import `init_logger` alone"):
        vendor._use_init_logger(source, vendor.source_dir(), PurePosixPath("core/x.py"))


def test_a_module_without_vllms_header_or_with_an_absolute_import_is_refused() -> None:
    with pytest.raises(vendor.VendorError, match="SPDX header"):
        vendor.vendor_module('"""Doc."""\n', "runner_hooks/core/x.py")
    with pytest.raises(vendor.VendorError, match=r"runner_hooks/core/x.py:3 imports runner_hooks"):
        vendor.vendor_module(
            HEADER + "from runner_hooks.core.hooks import ForwardInfo\n", "runner_hooks/core/x.py"
        )


EXPECTED = {
    Design.RESET: {"__init__.py", "prefetch.py", "randint_seeds.py", "reset.py"},
    Design.FORWARD_CONTEXT: {"__init__.py", "prefetcher.py", "side_stream.py", "prefetch.py"},
}
"""What each design lands in vLLM: its unit, and the shared machinery it imports."""


def vendored_modules(design: Design) -> dict[str, str]:
    """The vendored package's modules: flat name -> text."""
    prefix = vendor.VENDORED_PACKAGE + "/"
    return {
        path.removeprefix(prefix): data.decode()
        for path, data in vendor.vendored_files(design).items()
        if path.endswith(".py")
    }


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_each_design_vendors_its_closure_and_nothing_else(design: Design) -> None:
    modules = vendored_modules(design)
    assert set(modules) == EXPECTED[design]
    # Every module but __init__ is imported by another vendored module, relatively:
    # nothing is vendored that the package does not reach.
    imported = {
        f"{node.module}.py"
        for text in modules.values()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }
    assert imported == set(modules) - {"__init__.py"}
    # No CUDA source: nothing of it is compiled (the seeds' kernel is Triton's).
    assert all(path.endswith(".py") for path in vendor.vendored_files(design))


def test_a_module_is_vendored_once_the_unit_imports_it(tmp_path: Path) -> None:
    source = tmp_path / "runner_hooks"
    shutil.copytree(vendor.source_dir(), source, ignore=shutil.ignore_patterns("__pycache__"))
    (source / "core" / "newcomer.py").write_text(HEADER + "X = 1\n")
    before = vendor.vendored_files(Design.RESET, source)
    assert not any("newcomer" in path for path in before)
    reset = source / "core" / "reset.py"
    reset.write_text(reset.read_text() + "\nfrom . import newcomer  # noqa\n")
    with pytest.raises(vendor.VendorError, match="import names from a module"):
        vendor.vendored_files(Design.RESET, source)
    reset.write_text(reset.read_text().replace("from . import newcomer", "from .newcomer import X"))
    after = vendor.vendored_files(Design.RESET, source)
    assert f"{vendor.VENDORED_PACKAGE}/newcomer.py" in after


def test_a_file_naming_anything_outside_vllm_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "runner_hooks"
    shutil.copytree(vendor.source_dir(), source, ignore=shutil.ignore_patterns("__pycache__"))
    reset = source / "core" / "reset.py"
    reset.write_text(reset.read_text() + "# measured: bench/results/x.md\n")
    with pytest.raises(vendor.VendorError, match=r"core/reset\.py names 'bench/'"):
        vendor.vendored_files(Design.RESET, source)


def test_another_units_module_is_imported_as_a_sibling() -> None:
    modules = vendored_modules(Design.FORWARD_CONTEXT)
    assert "from .prefetch import" in modules["prefetcher.py"]
    assert "from ..core" not in "".join(modules.values())


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_no_vendored_file_names_anything_outside_vllm(design: Design) -> None:
    for path, data in vendor.vendored_files(design).items():
        text = data.decode()
        assert text.startswith(vendor.SPDX_HEADER), path
        assert "logging.getLogger" not in text and "_logging" not in text, path
        for name in vendor.FOREIGN_NAMES:
            assert name not in text, (path, name)
        assert "torch.ops." not in text, path  # no compiled op to call


def package_data() -> dict[str, list[str]]:
    """pyproject.toml's package data: package -> the globs of its non-module files."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["package-data"]


def shipped(package: str, relative: str) -> bool:
    return any(fnmatch.fnmatch(relative, glob) for glob in package_data().get(package, []))


def test_sr_prefetch_ships_the_landing_code_and_the_release_table() -> None:
    package = REPO / "vllm_patch"
    read_at_run_time = [
        *sorted(LANDING_DIR.glob("*.py")),
        Path(releases.__file__).with_name("pristine_sha256.json"),
    ]
    for path in read_at_run_time:
        assert shipped("vllm_patch", path.relative_to(package).as_posix()), path
