"""bench/engine/reproduce.py: stock against stock per setting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import arms, worker
from .arms import STOCK, Runner
from .cpu_fakes import fake_record


def test_reproduce_runs_stock_twice_per_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from . import reproduce
    from .session import Settings

    events: list[str] = []

    class Stock:
        def __init__(self, root: Path, env: dict[str, str]) -> None:
            self.root, self.env = root, env

        def call(self, op: str, **args: object) -> dict:
            events.append(f"{self.root} {op}")
            if op == "start":
                assert args["mode"] == "PIECEWISE"
                return {"start_s": 1.0}
            # Processes with a compile cache of their own compute their own bits.
            bits = self.root.name  # the process number
            return fake_record([bits.ljust(64, "x")], [1])

        def close(self) -> None:
            events.append(f"{self.root} close")

    def spawn(arm, runner, *, cache_root, extra_env, **_: object) -> Stock:
        assert (arm, runner) == (STOCK, Runner.V1)
        assert extra_env.items() >= arms.DETERMINISTIC_ENV.items()
        return Stock(cache_root, extra_env)

    monkeypatch.setattr(reproduce.Worker, "spawn", spawn)
    monkeypatch.setattr(Settings, "write_model", lambda self: tmp_path / "model")
    settings = Settings(sites={}, gpus=("0", "1"), out=tmp_path)
    by_name = {v.name: v for v in reproduce.VARIANTS}
    apart = reproduce.run_variant(by_name["as-run"], settings, "1")
    assert apart["verdict"].startswith("state differs from step 0") and apart["gpu"] == "1"
    # Two processes, each on a compile cache of its own, each started, run and closed.
    roots = [reproduce.ROOT / "as-run" / str(process) for process in (0, 1)]
    ops = ("start", "identity", "close")
    assert sorted(events) == sorted(f"{root} {op}" for root in roots for op in ops)
    assert by_name["torch-deterministic"].env.items() <= arms.IDENTITY_ENV.items()
    tuned = json.loads(by_name["reductions-tuned"].env[worker.LLM_KWARGS_ENV])
    assert "deterministic" not in tuned["compilation_config"]["inductor_compile_config"]
