"""bench/engine/envs.py: the one table of the harness's environment variables."""

from __future__ import annotations

import re
from pathlib import Path

from . import envs

ROOT = Path(__file__).resolve().parents[2]


def test_every_variable_the_harness_reads_is_in_the_table() -> None:
    sources = [
        path
        for path in [
            *(ROOT / "bench" / "engine").glob("*.py"),
            *(ROOT / "tests/gpu/vllm").glob("*.py"),
        ]
        if not path.name.startswith("test_") or path.parent.name == "vllm"
    ]
    named = {
        name
        for path in sources
        if path.name != "envs.py"
        for name in re.findall(r'"(SR_ENGINE_[A-Z_]+)"', path.read_text())
    }
    assert not named, f"names spelled outside envs.py: {sorted(named)}"
    constants = {value for key, value in vars(envs).items() if key.endswith("_ENV")}
    assert constants == set(envs.BY_NAME) and len(envs.VARIABLES) == len(envs.BY_NAME) == 18
    assert all(v.name in envs.table() and v.meaning for v in envs.VARIABLES)
