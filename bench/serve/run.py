"""The serve run (tests/gpu/vllm/engine.sh serve).  Per runner and round: one `vllm
serve` per measured arm (server.py), kept up together: launched together where each
arm's server has started on this machine before (warm caches), else one after another,
stock first, each ready before the next starts; the identity requests
(identity.py) on each, in arm order; per shape, SR_SERVE_BLOCKS blocks, each one
`vllm bench serve` run (bench_client.py) per arm against that arm's server, the arms
in order in even blocks and reversed in odd ones (ABC CBA ...), so that each arm runs
next to stock whatever pace the machine is in; the engagement lines; then the round's
servers stop, and in the rounds of SR_SERVE_CONTROL_PAIRS the one-seed control's
server runs the identity alone.  Every block is saved as it comes to
$OUT/engine/serve.json and to $SR_SERVE_RESUME, so a run cut off by `timeout` or by
SR_SERVE_BUDGET_S resumes, on fresh servers, with only what it lacks.

    python -m bench.serve.run        (settings: python -m bench.serve.envs)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from bench.engine.arms import Arm, Runner
from bench.engine.client import sites_from_env
from bench.engine.session import site_vllm_version

from . import bench_client, gpu_clocks, host_load, identity, model_dir, records, server
from .envs import RESUME_ENV
from .settings import CONTROL, Settings, Shape, from_env

MODEL_DIR = Path("/tmp/sr-serve/model")
FIRST_START_GUESS_S = 210.0
"""An arm's server's seconds to /health before this machine has timed one: a fresh
machine's first start of a vLLM copy took 180-208 s, and 244 s where the SSD kernels'
autotuning found no picks cached (Python imports in each of the server's processes,
compile, FlashInfer's JIT, autotuning; bench/results/serve-nvidia-h200-20261205-starts.md)."""
WARM_START_GUESS_S = 90.0
"""An arm's server's seconds to /health after its warm-up on this machine, before a warm
start has been timed: 48 s on 2026-12-03 (serve-nvidia-h200-20261203.md), with margin for
the processes' imports (~20 s each)."""
FIRST_BLOCK_GUESS_S = 30.0
"""A block's seconds (the slowest default shape, warmups included), before this run
has timed one."""

T = TypeVar("T")


class Stopped(BaseException):
    """SIGTERM (a time limit) arrived: the run saves what it has and stops."""


class SitesMissing(RuntimeError):
    """SR_ENGINE_SITES is not set or lacks an arm's copy: run through tests/gpu/vllm/engine.sh "
    "serve."""


class OutOfBudget(Exception):
    """SR_SERVE_BUDGET_S has no room for the next part: the run saves and stops; run it
    again (with a new budget) to resume."""


def log(message: str, began: float = time.monotonic()) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - began:6.0f}s] {message}", flush=True)


@dataclass(frozen=True)
class Round:
    """One round of one runner: the measured arms' servers with these shapes, then,
    where `control`, the control's server alone."""

    runner: Runner
    pair: int
    shapes: tuple[Shape, ...]
    control: bool


def plan(settings: Settings) -> Iterator[Round]:
    """The rounds in order: per runner, round after round."""
    for runner in settings.runners:
        for pair in range(1, settings.pairs + 1):
            control = pair in settings.control_pairs and settings.identity
            yield Round(runner, pair, settings.shapes_of(pair), control)


def start_key(arm: Arm, runner: Runner) -> str:
    """How the records' meta names an arm's server on a runner: runner/arm."""
    return f"{runner.value}/{arm.name}"


def rotation(arms: Sequence[T], block: int) -> list[T]:
    """Block `block`'s order: the arms as given in even blocks, reversed in odd ones."""
    return list(arms) if block % 2 == 0 else list(reversed(arms))


@dataclass
class Resident:
    """A running server of the round: its cell, and which of the cell's starts it is."""

    server: server.Server
    cell: dict[str, Any]
    key: str
    start: int
    launched: float


class Run:
    def __init__(
        self,
        settings: Settings,
        sites: dict[str, str],
        out: Path,
        resume: Path | None,
        client: Callable[[list[str]], dict],
        argv_for: Callable[[Arm, Runner, int, str], list[str]] | None = None,
        env_for: Callable[[Arm, Runner], dict[str, str]] | None = None,
        folder: Path = MODEL_DIR,
    ) -> None:
        self.settings, self.sites, self.out, self.client = settings, sites, out, client
        self.folder = folder
        self.paths = [out / "serve.json"] + ([resume] if resume else [])
        self.pid_dir = (resume.parent if resume else out) / "serve-pids"
        self.data = records.load(resume)
        self.argv_for = argv_for or (
            lambda arm, runner, port, kv: server.command(settings, folder, port, kv)
        )
        self.env_for = env_for or (
            lambda arm, runner: server.environment(arm, runner, sites[arm.site], settings)
        )
        self.resident: dict[str, Resident] = {}  # arm name -> its running server
        self.slowest_block = 0.0
        self.began = time.monotonic()
        meta = self.data["meta"]
        meta.setdefault("kv_cache_dtype", settings.kv_cache_dtype)
        meta.setdefault("last_start_s", {})  # runner/arm -> its last start here (s)
        meta.setdefault("warm_starts", {})  # runner/arm -> its warm-up's start here (s)
        meta["settings"] = {**asdict(settings), "arms": [a.name for a in settings.arms]}
        meta["vllm"] = site_vllm_version(sites.get("stock"))
        meta["model"] = model_dir.serve_config(settings.spec_tokens)
        meta["server_argv"] = server.command(settings, folder, 0, meta["kv_cache_dtype"])[3:]

    def save(self) -> None:
        records.save(self.paths, self.data)

    def end_leftovers(self) -> None:
        """Servers a killed run of this harness left running (their ids in pid files)."""
        for pid_file in sorted(self.pid_dir.glob("*.pid")) if self.pid_dir.exists() else []:
            pid = int(pid_file.read_text())
            log(f"ending the server session {pid} a cut run left")
            server.stop_session(pid, grace=10)
            pid_file.unlink()

    def fits(self, need: float, what: str) -> None:
        """OutOfBudget where `need` seconds no longer fit in SR_SERVE_BUDGET_S."""
        budget = self.settings.budget_s
        if budget is None:
            return
        left = budget - (time.monotonic() - self.began)
        if left < need:
            raise OutOfBudget(
                f"budget: {left:.0f} s left, {what} may take {need:.0f} s: stopping here "
                f"(run again to resume)"
            )

    def start_guess(self, arm: Arm, runner: Runner) -> float:
        """The arm's last start on this runner in these records, which live on the
        machine with the caches that start warmed (SR_SERVE_RESUME, /tmp); else
        WARM_START_GUESS_S after its warm-up, FIRST_START_GUESS_S before."""
        key, meta = start_key(arm, runner), self.data["meta"]
        if key in meta["last_start_s"]:
            return meta["last_start_s"][key]
        return WARM_START_GUESS_S if key in meta["warm_starts"] else FIRST_START_GUESS_S

    def started_here(self, arm: Arm, runner: Runner) -> bool:
        """Whether the arm's server has started on this runner on this machine (in the
        round or its warm-up), so that its caches are warm."""
        key, meta = start_key(arm, runner), self.data["meta"]
        return key in meta["last_start_s"] or key in meta["warm_starts"]

    def warm_up(self, runner: Runner, arms: Sequence[Arm]) -> None:
        """Each of `arms` never started on this runner here: its server started and
        stopped, all of them together, so that their caches (compile, FlashInfer's JIT,
        autotuning) are warm for the round; meta.warm_starts keeps each start.  A cold
        round of three servers does not fit one device call, a warm one does.  Triton's
        autotuning of the Mamba-2 SSD kernels runs in each warming server at once; the
        picks the cache keeps (TRITON_CACHE_AUTOTUNING) are then every round server's."""
        meta = self.data["meta"]
        cold = [arm for arm in arms if not self.started_here(arm, runner)]
        if not cold:
            return
        names = ", ".join(arm.name for arm in cold)
        self.fits(FIRST_START_GUESS_S, f"warming {names} up")
        log(f"{runner.value}: warming {names} up together (the round fits only warm)")
        named = [(arm, f"{runner.value}-warm-{arm.name}") for arm in cold]
        for (arm, _), outcome in zip(named, self.start_together(runner, named), strict=True):
            key = start_key(arm, runner)
            if isinstance(outcome, Exception):
                log(f"{key}: the warm-up did not start: {outcome}")
                continue
            srv, start_s = outcome
            srv.stop()
            meta["warm_starts"][key] = round(start_s, 1)
            log(f"{key}: warmed up in {start_s:.0f} s")
        self.save()

    def block_guess(self) -> float:
        return self.slowest_block or FIRST_BLOCK_GUESS_S

    def launch_one(
        self, arm: Arm, runner: Runner, name: str, kv: str, log_suffix: str = ""
    ) -> server.Server:
        """The arm's server launched (not yet ready), its log and pid file named `name`."""
        return server.Server.launch(
            lambda port: self.argv_for(arm, runner, port, kv),
            self.env_for(arm, runner),
            self.out / "serve-logs" / f"{name}{log_suffix}.log",
            self.pid_dir / f"{name}.pid",
        )

    def start(self, arm: Arm, runner: Runner, name: str) -> tuple[server.Server, float]:
        """A ready server; once, where fp8 KV cache is what fails, the rest of the run
        falls back to the model's KV dtype (meta.kv_cache_fallback says why)."""
        meta = self.data["meta"]
        for attempt in (1, 2):
            kv = meta["kv_cache_dtype"]
            srv = self.launch_one(arm, runner, name, kv, "" if attempt == 1 else "-retry")
            try:
                return srv, srv.wait_ready(self.settings.start_timeout)
            except BaseException as error:
                srv.stop(grace=10)
                if not isinstance(error, (server.ServerDied, server.ServerTimeout)):
                    raise
                started_before = any(records.starts_of(c) for c in self.data["cells"].values())
                if attempt == 1 and kv != "auto" and not started_before:
                    meta["kv_cache_dtype"] = "auto"
                    meta["kv_cache_fallback"] = (
                        f"--kv-cache-dtype {kv} failed to start: {str(error)[-1500:]}"
                    )
                    log(f"{name}: the server failed with --kv-cache-dtype {kv}; again with auto")
                    self.save()
                    continue
                if attempt == 2:  # not the KV dtype after all: keep the one asked for
                    meta["kv_cache_dtype"] = self.settings.kv_cache_dtype
                    meta.pop("kv_cache_fallback", None)
                    self.save()
                raise
        raise AssertionError("unreachable")

    def start_together(
        self, runner: Runner, named: Sequence[tuple[Arm, str]]
    ) -> list[tuple[server.Server, float] | Exception]:
        """Per (arm, name), a ready server and its seconds from its own launch, or why it
        did not start.  Several are launched at once, then awaited in turn; one that dies
        or times out among them is started once more (start(), with its KV dtype
        fallback).  One is just start()."""
        if len(named) == 1:
            ((arm, name),) = named
            try:
                return [self.start(arm, runner, name)]
            except (server.ServerDied, server.ServerTimeout) as error:
                return [error]
        kv = self.data["meta"]["kv_cache_dtype"]
        launched: list[server.Server] = []
        outcomes: list[tuple[server.Server, float] | Exception] = []
        try:
            for arm, name in named:
                launched.append(self.launch_one(arm, runner, name, kv))
            for (arm, name), srv in zip(named, launched, strict=True):
                try:
                    outcomes.append((srv, srv.wait_ready(self.settings.start_timeout)))
                except (server.ServerDied, server.ServerTimeout) as error:
                    srv.stop(grace=10)
                    log(f"{name}: no start beside the others ({str(error).splitlines()[0]})")
                    try:
                        outcomes.append(self.start(arm, runner, f"{name}-again"))
                    except (server.ServerDied, server.ServerTimeout) as again:
                        outcomes.append(again)
        except BaseException:
            ready = [o[0] for o in outcomes if not isinstance(o, Exception)]
            with contextlib.ExitStack() as stops:
                for srv in {id(srv): srv for srv in launched + ready}.values():
                    stops.callback(srv.stop, 10)
            raise
        return outcomes

    def launch(self, runner: Runner, pair: int, arms: Sequence[Arm], together: bool) -> None:
        """The round's servers of `arms`, ready and resident: launched together where
        `together`, else one after another, each ready before the next starts; where
        one does not start, the error goes in its cell and the round goes on without it."""
        keys = {arm.name: records.cell_key(runner.value, pair, arm.name) for arm in arms}
        groups = [list(arms)] if together else [[arm] for arm in arms]
        for group in groups:
            log(f"{', '.join(keys[arm.name] for arm in group)}: starting ({len(self.resident)} up)")
            named = [(arm, keys[arm.name].replace("/", "-")) for arm in group]
            for arm, outcome in zip(group, self.start_together(runner, named), strict=True):
                key = keys[arm.name]
                cell = self.data["cells"].setdefault(
                    key, {"arm": arm.name, "runner": runner.value, "pair": pair}
                )
                if isinstance(outcome, Exception):
                    cell.setdefault("errors", []).append(f"start: {outcome}"[-3000:])
                    log(f"{key}: the server did not start: {str(outcome).splitlines()[0]}")
                    continue
                srv, start_s = outcome
                self.data["meta"]["last_start_s"][start_key(arm, runner)] = round(start_s, 1)
                cell.setdefault("starts", []).append(start_s)
                cell["kv_cache_dtype"] = self.data["meta"]["kv_cache_dtype"]
                self.resident[arm.name] = Resident(
                    srv, cell, key, len(cell["starts"]) - 1, srv.launched
                )
                log(f"{key}: ready in {start_s:.0f} s")
            self.save()

    def stop_resident(self) -> None:
        """Each resident server's engagement lines, then every one of them stops (its
        pid file with it), the others also where one's stop fails."""
        residents, self.resident = list(self.resident.values()), {}
        with contextlib.ExitStack() as stops:
            for resident in residents:
                stops.callback(self.stop_one, resident)
            for resident in residents:
                resident.cell["engagement"] = resident.server.engagement()
        self.save()

    def stop_one(self, resident: Resident) -> None:
        try:
            resident.server.stop()
        finally:
            resident.cell["wall_s"] = (
                resident.cell.get("wall_s", 0) + time.monotonic() - resident.launched
            )
            engaged = resident.cell.get("engagement", [])[:1] or "none"
            log(f"{resident.key}: stopped; engagement: {engaged}")

    def measured(self, rnd: Round) -> None:
        """The round's measured arms: their servers resident together, the identity on
        each, the blocks of each shape in rotation; only what the records lack."""
        settings = self.settings
        todo = {
            arm.name: records.missing(
                self.data["cells"].get(records.cell_key(rnd.runner.value, rnd.pair, arm.name)),
                rnd.shapes,
                settings.identity,
                settings.blocks,
            )
            for arm in settings.arms
        }
        todo = {name: parts for name, parts in todo.items() if parts[0] or parts[1]}
        label = f"{rnd.runner.value}/p{rnd.pair}"
        if not todo:
            log(f"{label}: done before")
            return
        starting = [arm for arm in settings.arms if arm.name in todo]

        def together() -> bool:
            return all(self.started_here(arm, rnd.runner) for arm in starting)

        def fits_the_round() -> None:
            guesses = [self.start_guess(arm, rnd.runner) for arm in starting]
            need = max(guesses) if together() else sum(guesses)
            self.fits(need + self.block_guess(), f"{len(todo)} server starts and a block")

        try:
            fits_the_round()
        except OutOfBudget:
            self.warm_up(rnd.runner, starting)
            fits_the_round()
        try:
            self.launch(rnd.runner, rnd.pair, starting, together())
            for arm in settings.arms:
                if arm.name in self.resident and todo[arm.name][0]:
                    self.identity(self.resident[arm.name])
            for shape in rnd.shapes:
                for block in range(settings.blocks):
                    for slot, arm in enumerate(rotation(settings.arms, block)):
                        resident = self.resident.get(arm.name)
                        if resident is None or block not in todo[arm.name][1].get(shape.name, []):
                            continue
                        self.fits(self.block_guess(), "a block")
                        self.block(resident, shape, block, slot)
        finally:
            self.stop_resident()

    def control(self, rnd: Round) -> None:
        """The one-seed control's server alone: the identity requests only."""
        key = records.cell_key(rnd.runner.value, rnd.pair, CONTROL.name)
        if "identity" in self.data["cells"].get(key, {}):
            log(f"{key}: done before")
            return
        self.fits(self.start_guess(CONTROL, rnd.runner), "a server start")
        try:
            self.launch(rnd.runner, rnd.pair, [CONTROL], together=False)
            if CONTROL.name in self.resident:
                self.identity(self.resident[CONTROL.name])
        finally:
            self.stop_resident()

    def identity(self, resident: Resident) -> None:
        cell, key = resident.cell, resident.key
        try:
            record = identity.run(resident.server.post, self.data["meta"]["model"]["vocab_size"])
        except Exception as error:  # recorded, so the next run retries this part
            cell.setdefault("errors", []).append(
                f"identity: {type(error).__name__}: {error}"[:2000]
            )
            log(f"{key}: identity failed: {error}")
        else:
            cell["identity"] = record
            log(f"{key}: identity recorded ({record['sanity']})")
        self.save()

    def block(self, resident: Resident, shape: Shape, block: int, slot: int) -> None:
        """One `vllm bench serve` run of the shape against the resident server, with the
        GPUs' and the host's load over it; saved as block `block` of the shape."""
        cell, key = resident.cell, resident.key
        name = f"{key.replace('/', '-')}-{shape.name}-b{block}"
        result = self.out / "serve-results" / f"{name}.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        arguments = bench_client.argv(
            shape, resident.server.port, self.folder, result, self.settings.warmups
        )
        log(
            f"{key}: vllm bench serve {shape.name} block {block} (concurrency "
            f"{shape.concurrency}, {shape.num_prompts} requests)"
        )
        began = time.monotonic()
        try:
            with (
                gpu_clocks.Sampler(result.with_suffix(".gpu.csv")) as gpus,
                host_load.Window() as host,
            ):
                self.client(arguments)
            kept = bench_client.summary(json.loads(result.read_text()))
            bench_client.check(shape, kept)
        except Exception as error:
            cell.setdefault("errors", []).append(
                f"{shape.name} block {block}: {type(error).__name__}: {error}"[:2000]
            )
            log(f"{key}: {shape.name} block {block} failed: {error}")
        else:
            kept.update(block=block, slot=slot, start=resident.start)
            if gpus.summary():
                kept["gpus"] = gpus.summary()
            if host.summary():
                kept["host"] = host.summary()
            records.add_block(cell, shape.name, kept, {"shape": asdict(shape), "argv": arguments})
            log(
                f"{key}: {shape.name} block {block}: ITL p50 "
                f"{kept.get('median_itl_ms', float('nan')):.3f} ms, TPOT p50 "
                f"{kept.get('median_tpot_ms', float('nan')):.3f} ms, acceptance length "
                f"{kept.get('spec_decode_acceptance_length', float('nan')):.2f}, host "
                f"{kept.get('host', 'not read')}"
            )
        finally:
            self.slowest_block = max(self.slowest_block, time.monotonic() - began)
        self.save()

    def all(self) -> dict[str, Any]:
        self.end_leftovers()
        try:
            for rnd in plan(self.settings):
                self.measured(rnd)
                if rnd.control:
                    self.control(rnd)
        except OutOfBudget as stop:
            log(str(stop))
        self.save()
        return self.data


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(f"signal {signum}")


def check_sites(settings: Settings, sites: dict[str, str] | None) -> dict[str, str]:
    """The sites, once they name a vLLM for every arm's copy and the control's."""
    wanted = {arm.site for arm in (*settings.arms, CONTROL)}
    if not sites or not wanted <= set(sites):
        raise SitesMissing(
            f"SR_ENGINE_SITES must name the {sorted(wanted)} copies: run "
            f"tests/gpu/vllm/engine.sh serve"
        )
    return sites


def main() -> int:
    settings = from_env()
    sites = check_sites(settings, sites_from_env())
    out = Path(os.environ.get("OUT", "/tmp/out")) / "engine"
    resume = Path(os.environ[RESUME_ENV]) if os.environ.get(RESUME_ENV) else None
    model_dir.write(MODEL_DIR, settings.spec_tokens)
    log(f"tokenizer: {model_dir.check_tokenizer(MODEL_DIR)}")
    log("importing vllm.benchmarks.serve (vLLM's client)")
    client = bench_client.vllm_client()
    signal.signal(signal.SIGTERM, _stop)
    run = Run(settings, sites, out, resume, client)
    try:
        data = run.all()
    except Stopped as stop:
        log(f"stopped by {stop}: records saved; run again to resume")
        run.save()
        return 1
    failed = [k for k, c in data["cells"].items() if c.get("errors")]
    log(f"done: {len(data['cells'])} cells, {len(failed)} with errors {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
