"""bench/engine/session.py: what a run reads from the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import arms, client, identity, session, timing
from .arms import IDENTITY_ARMS, STOCK, TIMING_ARMS, GraphMode, Runner
from .cpu_fakes import quick_spawn


@pytest.mark.parametrize(("value", "sizes"), [("", ()), ("1", (1,)), ("1,8", (1, 8))])
def test_profile_batch_sizes_from_env(value: str, sizes: tuple, monkeypatch) -> None:
    monkeypatch.setenv(session.PROFILE_ENV, value)
    assert session.profile_batch_sizes_from_env() == sizes


@pytest.mark.parametrize("bad", ["3", "one", "1,,8", ","])
def test_a_bad_profile_batch_size_is_refused(bad: str, monkeypatch) -> None:
    monkeypatch.setenv(session.PROFILE_ENV, bad)
    with pytest.raises(ValueError, match="SR_ENGINE_PROFILE takes timed batch sizes"):
        session.profile_batch_sizes_from_env()


def test_the_timing_can_measure_one_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.RUNNERS_ENV, "v2")
    assert session.runners_from_env() == (Runner.V2,)
    calls: list[tuple[str, str, dict]] = []
    settings = session.Settings({}, ("0", "1"), tmp_path, session.runners_from_env())
    plan = timing.Plan(rounds=2, batch_sizes=(1,))
    data, _ = timing.run(settings, plan, spawn=quick_spawn(calls))
    assert list(data["runners"]) == ["v2"]
    assert calls and all(name.endswith("/v2") for name, _, _ in calls)


def test_the_timing_can_measure_some_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.ARMS_ENV, "reset-randint,floor")
    chosen = [arm.name for arm in session.timing_arms_from_env()]
    assert chosen == ["stock", "reset-randint", "floor"]  # stock always, in order
    monkeypatch.setenv(session.ARMS_ENV, "plugin,reset-randint")
    chosen = [arm.name for arm in session.timing_arms_from_env()]
    assert chosen == ["stock", "reset-randint", "plugin"]  # named-only arms where named
    monkeypatch.delenv(session.ARMS_ENV)
    assert session.timing_arms_from_env() == TIMING_ARMS


@pytest.mark.parametrize(
    "bad", ["explicit", ",", "stock,control-one-seed", "stock,reset-outside-graph"]
)
def test_an_unknown_timing_arm_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.ARMS_ENV, bad)
    with pytest.raises(ValueError, match="SR_ENGINE_ARMS takes names among"):
        session.timing_arms_from_env()


def test_the_identity_run_can_judge_some_arms_and_modes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(session.IDENTITY_ARMS_ENV, "control-one-seed,reset")
    monkeypatch.setenv(session.MODES_ENV, "FULL_AND_PIECEWISE,eager")
    chosen = [arm.name for arm in session.identity_arms_from_env()]
    # stock and its positive control always, in IDENTITY_ARMS' order
    assert chosen == ["stock", "stock-again", "reset", "control-one-seed"]
    assert session.modes_from_env(identity.MODES) == (
        GraphMode.EAGER,
        GraphMode.FULL_AND_PIECEWISE,
    )
    calls: list[tuple[str, str, dict]] = []
    settings = session.Settings({}, ("0",), tmp_path)
    records = identity.run(settings, spawn=quick_spawn(calls))["records"]
    assert sorted(records) == sorted(
        identity.key(arm, runner, mode)
        for arm in chosen
        for runner in Runner
        for mode in (GraphMode.EAGER, GraphMode.FULL_AND_PIECEWISE)
    )
    monkeypatch.delenv(session.IDENTITY_ARMS_ENV)
    monkeypatch.delenv(session.MODES_ENV)
    assert session.identity_arms_from_env() == IDENTITY_ARMS
    assert session.modes_from_env(identity.MODES) == identity.MODES


@pytest.mark.parametrize(
    ("env", "bad"),
    [("IDENTITY_ARMS_ENV", "explicit"), ("IDENTITY_ARMS_ENV", ","), ("MODES_ENV", "FULL")],
)
def test_an_unknown_identity_arm_or_mode_is_refused(
    env: str, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = getattr(session, env)
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=f"{name} takes names among"):
        session.identity_arms_from_env()
        session.modes_from_env(identity.MODES)


@pytest.mark.parametrize("bad", ["v3", ",", "v1,x"])
def test_an_unknown_runner_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.RUNNERS_ENV, bad)
    with pytest.raises(ValueError, match="SR_ENGINE_RUNNERS takes"):
        session.runners_from_env()


@pytest.mark.parametrize(
    ("version", "runners"),
    [("0.20.0", (Runner.V1,)), ("0.22.1", (Runner.V1,)), ("0.23.0", tuple(Runner)),
     ("0.26.0", tuple(Runner)), ("0.33.0", tuple(Runner)), (None, tuple(Runner))],
)  # fmt: skip
def test_the_runners_default_to_those_the_vllm_release_serves_the_model_with(
    version: str | None, runners: tuple[Runner, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM before 0.23.0 refuses hybrid models under its V2 runner: V1 alone, and
    naming V2 is refused before any engine starts; later (or unknown) releases run both."""
    monkeypatch.delenv(session.RUNNERS_ENV, raising=False)
    assert session.runners_from_env(version) == runners
    monkeypatch.setenv(session.RUNNERS_ENV, "v1")
    assert session.runners_from_env(version) == (Runner.V1,)
    monkeypatch.setenv(session.RUNNERS_ENV, "v1,v2")
    if Runner.V2 in runners:
        assert session.runners_from_env(version) == (Runner.V1, Runner.V2)
    else:
        with pytest.raises(ValueError, match=f"vLLM {version}'s V2 model runner refuses"):
            session.runners_from_env(version)


def test_the_stock_copy_s_vllm_version_picks_the_runners_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site-0.20.0"
    (site / "vllm-0.20.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.20.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.20.0\n")
    (site / "vllm").mkdir()
    assert session.site_vllm_version(str(site)) == "0.20.0"
    assert session.site_vllm_version(str(site / "vllm")) is None
    assert session.site_vllm_version(None) is None
    monkeypatch.setenv(client.SITES_ENV, f"stock={site},reset={tmp_path / 'r'}")
    monkeypatch.delenv(session.RUNNERS_ENV, raising=False)
    for env in (session.IDENTITY_ARMS_ENV, session.MODES_ENV, identity.RESUME_ENV):
        monkeypatch.delenv(env, raising=False)
    settings = session.Settings.from_env()
    assert settings is not None and settings.runners == (Runner.V1,)
    settings = session.Settings(settings.sites, ("0",), tmp_path / "out", settings.runners)
    calls: list[tuple[str, str, dict]] = []
    data = identity.run(settings, spawn=quick_spawn(calls))
    assert data["vllm"] == "0.20.0"
    assert json.loads((tmp_path / "out" / "identity.json").read_text())["vllm"] == "0.20.0"
    assert calls and all(name.endswith("/v1") for name, _, _ in calls)


@pytest.mark.parametrize(("value", "tp"), [(None, 1), ("", 1), ("1", 1), ("2", 2), (" 4 ", 4)])
def test_tp_from_env(value: str | None, tp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv(session.TP_ENV, raising=False)
    else:
        monkeypatch.setenv(session.TP_ENV, value)
    assert session.tp_from_env() == tp


@pytest.mark.parametrize("bad", ["0", "3", "16", "two", "-2", "2.0", "2,4"])
def test_a_bad_tp_is_refused(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(session.TP_ENV, bad)
    with pytest.raises(ValueError, match=r"SR_ENGINE_TP takes a tensor-parallel size among 1, 2"):
        session.tp_from_env()


def test_each_runner_gets_a_group_of_tp_gpus(tmp_path: Path, monkeypatch) -> None:
    def gpus(names: tuple[str, ...], tp: int) -> list[str]:
        settings = session.Settings({}, names, tmp_path, tp=tp)
        return [settings.gpu(runner) for runner in Runner]

    assert gpus(("0", "1"), 1) == ["0", "1"]  # as before TP
    assert gpus(("0",), 1) == ["0", "0"]
    assert gpus(("0", "1"), 2) == ["0,1", "0,1"]
    assert gpus(("0", "1", "2", "3"), 2) == ["0,1", "2,3"]
    assert gpus(("0", "1", "2"), 2) == ["0,1", "0,1"]
    assert gpus(("0", "1", "2", "3"), 4) == ["0,1,2,3"] * 2
    with pytest.raises(ValueError, match="SR_ENGINE_TP=2 needs 2 GPUs per engine; SR_ENGINE_GPUS"):
        session.Settings({}, ("0",), tmp_path, tp=2)
    monkeypatch.setenv("SR_ENGINE_SITES", "stock=/s")
    monkeypatch.setenv(session.GPUS_ENV, "0,1")
    monkeypatch.setenv(session.TP_ENV, "2")
    settings = session.Settings.from_env()
    assert settings is not None and settings.tp == 2
    # Every engine is spawned with the TP size.
    spawned: list[dict] = []
    monkeypatch.setattr(session.Worker, "spawn", lambda arm, runner, **kw: spawned.append(kw))
    monkeypatch.setattr(session.Settings, "write_model", lambda self: tmp_path / "m")
    session.spawn_all([(STOCK, Runner.V1), (STOCK, Runner.V2)], settings, "t")
    assert [(kw["tp"], kw["gpu"]) for kw in spawned] == [(2, "0,1"), (2, "0,1")]


def test_servings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert session.servings_from_env() == (arms.PLAIN,)
    monkeypatch.setenv(session.SERVING_ENV, "seed-serving,mtp3")
    assert [s.name for s in session.servings_from_env()] == ["mtp3", "seed-serving"]
    monkeypatch.setenv(session.SERVING_ENV, "mtp5")
    with pytest.raises(ValueError, match="SR_ENGINE_SERVING takes names among"):
        session.servings_from_env()


def test_the_identity_run_can_judge_one_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With SR_ENGINE_RUNNERS=v2 the V2 engines run without waiting for a V1
    stock engine that never starts; only V2 cells are recorded."""
    monkeypatch.setenv(session.IDENTITY_ARMS_ENV, "reset")
    monkeypatch.setenv(session.MODES_ENV, "eager")
    calls: list[tuple[str, str, dict]] = []
    settings = session.Settings({}, ("0",), tmp_path, (Runner.V2,))
    records = identity.run(settings, spawn=quick_spawn(calls))["records"]
    assert sorted(records) == sorted(
        identity.key(arm, Runner.V2, GraphMode.EAGER) for arm in ("stock", "stock-again", "reset")
    )
    assert {name.split("/")[1] for name, _, _ in calls} == {"v2"}
