"""Test code run by a fresh Python that imports this repository's packages."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_child(
    code: str, *args: str, timeout: int, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -c code *args` with this repository first on PYTHONPATH and `env`
    over the process's environment; its output captured as text."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **(env or {}), "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
