"""bench/serve/envs.py: the one table of the serve harness's variables, and engine.sh's serve "
"step."""

from __future__ import annotations

import re
from pathlib import Path

from . import envs

ROOT = Path(__file__).resolve().parents[2]


def test_every_variable_is_in_the_table_and_spelled_there_alone() -> None:
    named = {
        name
        for path in (ROOT / "bench" / "serve").glob("*.py")
        if path.name != "envs.py" and not path.name.startswith("test_")
        for name in re.findall(r'"(SR_SERVE_[A-Z_]+)"', path.read_text())
    }
    assert not named, f"names spelled outside envs.py: {sorted(named)}"
    constants = {value for key, value in vars(envs).items() if key.endswith("_ENV")}
    assert constants == set(envs.BY_NAME)
    assert all(v.name in envs.table() and v.meaning for v in envs.VARIABLES)


def test_engine_sh_has_the_serve_step() -> None:
    script = (ROOT / "tests/gpu/vllm/engine.sh").read_text()
    assert "python3 -m bench.serve.run" in script and "serve)" in script
    assert "! -path ./engine/serve.json" in script  # the records come back as a file of their own
    assert "python3 -m bench.serve.paired run ${SR_SERVE_PAIRED_ARGS:-" in script
    assert "! -path './engine/paired/*.jsonl'" in script


def test_the_budgets_meaning_gives_the_start_guesses_run_uses() -> None:
    from .run import FIRST_START_GUESS_S, WARM_START_GUESS_S

    meaning = envs.BY_NAME[envs.BUDGET_ENV].meaning
    assert f"else {WARM_START_GUESS_S:.0f} s after its warm-up" in meaning
    assert f"else {FIRST_START_GUESS_S:.0f} s;" in meaning
