"""tests/gpu/vllm/*.sh: the GPU machine scripts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "script",
    ["engine.sh", "patched_installed.sh", "bundle-0.20.sh", "stage-0.20.sh", "identity-0.20.sh"],
)
def test_gpu_machine_scripts_parse(script: str) -> None:
    path = Path(__file__).resolve().parents[2] / "tests" / "gpu" / "vllm" / script
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_fork_script_checks_every_file_the_patch_changes() -> None:
    """patched_installed.sh hashes the installed files before apply and after
    revert: every file the patch edits must be among them."""
    import re

    from vllm_patch import releases
    from vllm_patch.targets import paths

    script = Path(__file__).resolve().parents[2] / "tests" / "gpu" / "vllm" / "patched_installed.sh"
    listed = re.search(r"^files=\(([^)]*)\)", script.read_text(), re.MULTILINE)
    assert listed is not None
    assert set(listed.group(1).split()) == set(paths(releases.get("0.26.0")))
