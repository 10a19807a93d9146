"""bench/engine/identity.py: the identity run over arms, runners, modes and servings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import arms, identity, session
from .arms import IDENTITY_ARMS, GraphMode, Runner
from .cpu_fakes import FakeWorker, fake_record, quick_spawn


def test_identity_run_orders_resumes_and_respawns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .identity import MODES, RESUME_ENV, key, run
    from .session import Settings

    log: list[str] = []
    spawned: list[str] = []
    resume = tmp_path / "resume.json"
    done = key("forward-context", Runner.V2, GraphMode.EAGER)
    resume.write_text(
        json.dumps(
            {
                "records": {
                    done: fake_record(["z" * 64], [9]),
                    key("stock", Runner.V2, GraphMode.EAGER): {"error": "boom"},
                },
                "engagement": {"forward-context/v2": ["old line"]},
            }
        )
    )
    monkeypatch.setenv(RESUME_ENV, str(resume))

    def spawn(pairs, settings, tag, extra_env):
        assert extra_env == arms.IDENTITY_ENV
        out = {}
        for arm, runner in pairs:
            name = f"{arm.name}/{runner.value}"
            again = name in spawned
            spawned.append(name)
            out[arm.name, runner.value] = FakeWorker(
                name, log, fail_first_start=name == "reset/v1" and not again
            )
        return out

    settings = Settings(sites={}, gpus=("0",), out=tmp_path / "out")
    data = run(settings, spawn=spawn)
    cells = {key(a.name, r, m) for a in IDENTITY_ARMS for r in Runner for m in MODES}
    assert set(data["records"]) == cells
    # Stock leads every mode: its V1 engine of a mode gives its record before
    # any other engine of that mode starts, and its V2 engine before V2's arms.
    assert log[0] == "stock/v1 start eager"

    def recorded(name: str, mode: GraphMode) -> int:
        started = log.index(f"{name} start {mode.value}")
        return log.index(f"{name} identity", started)

    for mode in MODES:
        starts = {line.split()[0]: i for i, line in enumerate(log) if line.endswith(mode.value)}
        assert all(i > recorded("stock/v1", mode) for n, i in starts.items() if n != "stock/v1")
        v2_arms = [i for n, i in starts.items() if n.endswith("/v2") and n != "stock/v2"]
        assert v2_arms and all(i > recorded("stock/v2", mode) for i in v2_arms), (mode, log)
    # A recorded cell is kept, not run again; a cell that failed before runs again.
    assert data["records"][done]["fingerprints"] == ["z" * 64]
    assert "forward-context/v2 start eager" not in log
    assert "stock/v2 start eager" in log
    # A worker that dies is replaced once, and its cell then has a record.
    assert spawned.count("reset/v1") == 2
    failed = [c for c, r in data["records"].items() if "error" in r]
    assert failed == [], failed
    saved = json.loads((tmp_path / "out" / "identity.json").read_text())
    assert saved["records"] == json.loads(resume.read_text())["records"] == data["records"]
    assert data["engagement"]["stock/v1"] == ["line of stock/v1"]
    # Saved with each record, so a run cut off before its workers close has them.
    assert json.loads(resume.read_text())["engagement"]["forward-context/v2"] == [
        "line of forward-context/v2"
    ]


def test_the_identity_run_goes_through_each_serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(session.IDENTITY_ARMS_ENV, "reset")
    monkeypatch.setenv(session.MODES_ENV, "FULL_AND_PIECEWISE")
    monkeypatch.setenv(session.SERVING_ENV, "plain,mtp7")
    calls: list[tuple[str, str, dict]] = []
    records = identity.run(session.Settings({}, ("0",), tmp_path), spawn=quick_spawn(calls))[
        "records"
    ]
    full = GraphMode.FULL_AND_PIECEWISE
    mtp7 = arms.SERVING_BY_NAME["mtp7"]
    assert identity.key("stock", Runner.V1, full) == "stock/v1/FULL_AND_PIECEWISE"
    assert identity.key("stock", Runner.V1, full, mtp7) == "stock/v1/FULL_AND_PIECEWISE/mtp7"
    assert sorted(records) == sorted(
        identity.key(arm, runner, full, serving)
        for arm in ("stock", "stock-again", "reset")
        for runner in Runner
        for serving in (arms.PLAIN, mtp7)
    )
    starts = [(name, args["serving"]) for name, op, args in calls if op == "start"]
    # Each worker: plain first, then mtp7; stock V1 leads each serving.
    assert [serving for name, serving in starts if name == "reset/v2"] == ["plain", "mtp7"]
    first_mtp = starts.index(("stock/v1", "mtp7"))
    assert all(serving == "plain" for _, serving in starts[:first_mtp])


def test_identity_run_takes_its_arms_and_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/gpu/test_plugin_engine.py's run: its own arms (the plugin's among them, not
    one of IDENTITY_ARMS) and modes, whatever SR_ENGINE_IDENTITY_ARMS says."""
    from .identity import RESUME_ENV, key, run
    from .session import IDENTITY_ARMS_ENV, Settings

    monkeypatch.delenv(RESUME_ENV, raising=False)
    monkeypatch.setenv(IDENTITY_ARMS_ENV, "reset")
    log: list[str] = []

    def spawn(pairs, settings, tag, extra_env):
        return {(a.name, r.value): FakeWorker(f"{a.name}/{r.value}", log) for a, r in pairs}

    chosen = (arms.STOCK, arms.PLUGIN)
    modes = (GraphMode.EAGER, GraphMode.FULL_AND_PIECEWISE)
    settings = Settings(sites={}, gpus=("0",), out=tmp_path / "out")
    data = run(settings, spawn=spawn, arms=chosen, modes=modes)
    assert set(data["records"]) == {
        key(a.name, r, m) for a in chosen for r in Runner for m in modes
    }
    assert data["engagement"]["plugin/v2"] == ["line of plugin/v2"]
