"""The vendored copy of runner_hooks, and what sr-prefetch and runner_hooks ship.

vLLM's own checks of the code the patch puts into vLLM are the release's pre-commit
hooks, run on each design's export (test_precommit.py).
"""

from __future__ import annotations

import ast
import fnmatch
import shutil
from pathlib import Path

import pytest

from vllm_patch import releases, vendor
from vllm_patch.syntax import LANDING_DIR

REPO = Path(__file__).resolve().parents[2]

# --- vendoring --------------------------------------------------------------------------------


def test_a_module_gets_vllms_header_and_logger() -> None:
    source = (
        '"""Doc."""\n\nfrom __future__ import annotations\n\nimport logging\n\n'
        "import torch\n\nfrom .hooks import ForwardInfo\n\n"
        "logger = logging.getLogger(__name__)\n"
    )
    vendored = vendor.vendor_module(source, "runner_hooks/x.py")
    assert vendored == (
        vendor.SPDX_HEADER
        + vendor.GENERATED_MARK.format(source="runner_hooks/x.py")
        + '"""Doc."""\n\nfrom __future__ import annotations\n\n'
        "import torch\n\nfrom vllm.logger import init_logger\n\nfrom .hooks import ForwardInfo\n\n"
        "logger = init_logger(__name__)\n"
    )


def test_logging_stays_imported_where_the_module_uses_it_otherwise() -> None:
    source = "import logging\n\nlogger = logging.getLogger(__name__)\nLEVEL = logging.DEBUG\n"
    vendored = vendor.vendor_module(source, "runner_hooks/x.py")
    assert "import logging\n\nfrom vllm.logger import init_logger\n" in vendored
    assert "logger = init_logger(__name__)" in vendored and "logging.DEBUG" in vendored


def test_an_absolute_runner_hooks_import_is_refused() -> None:
    with pytest.raises(vendor.VendorError, match=r"runner_hooks/x.py:1 imports runner_hooks"):
        vendor.vendor_module("from runner_hooks.hooks import ForwardInfo\n", "runner_hooks/x.py")


def test_a_new_runner_hooks_module_is_vendored_without_a_code_change(
    tmp_path: Path,
) -> None:
    source = tmp_path / "runner_hooks"
    shutil.copytree(vendor.source_dir(), source, ignore=shutil.ignore_patterns("__pycache__"))
    (source / "newcomer.py").write_text('"""A module added later."""\n')
    (source / "csrc" / "extra.cu").write_text("// verbatim\n")
    (source / ".ruff_cache").mkdir(exist_ok=True)
    (source / ".ruff_cache" / "CACHEDIR.TAG").write_text("a tool's cache\n")
    files = vendor.vendored_files(source)
    assert not any(".ruff_cache" in path or path.endswith(".toml") for path in files)
    assert files[f"{vendor.VENDORED_PACKAGE}/newcomer.py"].startswith(vendor.SPDX_HEADER.encode())
    assert files[f"{vendor.VENDORED_PACKAGE}/csrc/extra.cu"] == b"// verbatim\n"


def test_the_vendored_package_imports_relatively_and_logs_through_vllm() -> None:
    for path, data in vendor.vendored_files().items():
        if not path.endswith(".py"):
            continue
        text = data.decode()
        assert text.startswith(vendor.SPDX_HEADER), path
        assert "logging.getLogger" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.level > 0 or not node.module.startswith("runner_hooks"), path


def test_the_vendored_op_is_not_registered_under_runner_hooks() -> None:
    # The op namespace: vendor.py gives the vendored CUDA op a vLLM-side torch.ops
    # namespace (work in progress elsewhere). Whatever it is named, no vendored file may
    # register or call the op under runner_hooks' own: a process that loads both ops
    # would register that namespace twice, which torch refuses.
    for path, data in vendor.vendored_files().items():
        assert b"runner_hooks::" not in data, path
        assert b"torch.ops.runner_hooks" not in data, path


def package_data() -> dict[str, list[str]]:
    """pyproject.toml's package data: package -> the globs of its non-module files."""
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return pyproject["tool"]["setuptools"]["package-data"]


def shipped(package: str, relative: str) -> bool:
    return any(fnmatch.fnmatch(relative, glob) for glob in package_data().get(package, []))


def test_the_cuda_sources_ship_as_package_data_and_are_vendored() -> None:
    source = vendor.source_dir()
    sources = sorted(path.relative_to(source).as_posix() for path in (source / "csrc").iterdir())
    assert sources, "runner_hooks has no CUDA sources"
    vendored = vendor.vendored_files()
    for name in sources:
        # A wheel of runner_hooks carries them: the kernel drawer compiles them on first use ...
        assert shipped(vendor.SOURCE_PACKAGE, name), name
        # ... and the vendored copy has them beside its modules, as runner_hooks does.
        assert f"{vendor.VENDORED_PACKAGE}/{name}" in vendored, name


def test_sr_prefetch_ships_the_landing_code_and_the_release_table() -> None:
    package = REPO / "vllm_patch"
    read_at_run_time = [
        *sorted(LANDING_DIR.glob("*.py")),
        Path(releases.__file__).with_name("pristine_sha256.json"),
    ]
    for path in read_at_run_time:
        assert shipped("vllm_patch", path.relative_to(package).as_posix()), path
