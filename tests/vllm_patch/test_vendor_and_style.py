"""The vendored copy of runner_hooks, and the code the patch puts into vLLM, in vLLM's style."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_patch import cli, edits, fork_test, vendor

VLLM_RUFF = [
    "--line-length=88",
    "--target-version=py310",
    "--config=lint.isort.known-first-party=['vllm']",
]


def ruff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )


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


@pytest.mark.parametrize("design", sorted(edits.DESIGNS))
def test_the_code_put_into_vllm_is_formatted_and_linted_as_vllm_does(
    vllm_tree: Path, design: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["apply", str(vllm_tree), "--design", design]) == 0
    capsys.readouterr()
    changed = [vllm_tree / fe.path for fe in edits.DESIGNS[design].file_edits]
    test_file = vllm_tree / fork_test.PATH
    lint = ruff("check", *VLLM_RUFF, "--select=E,F,W,I", "--ignore=E731", test_file, *changed)
    assert lint.returncode == 0, lint.stdout
    lint = ruff("check", *VLLM_RUFF, "--select=UP,B,SIM,RUF", test_file)
    assert lint.returncode == 0, lint.stdout
    formatted = ruff("format", "--check", *VLLM_RUFF[:2], test_file, *changed)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    # The vendored modules keep runner_hooks' own line length (100); the rest is vLLM's.
    vendored = vllm_tree / vendor.VENDORED_PACKAGE
    lint = ruff("check", *VLLM_RUFF, "--select=E,F,W,I,UP", "--ignore=E501", vendored)
    assert lint.returncode == 0, lint.stdout
