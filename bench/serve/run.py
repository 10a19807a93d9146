"""The serve run (tests/gpu/vllm/engine.sh serve): for each runner, round and arm, a
fresh `vllm serve` (server.py), the identity requests (identity.py), each bench shape
through vLLM's own client (bench_client.py), the engagement lines; then the server
stops and the next arm's starts.  Every part is saved as it comes to
$OUT/engine/serve.json and to $SR_SERVE_RESUME, so a run cut off by `timeout` goes on
where it stopped when run again on the same machine.

    python -m bench.serve.run        (settings: python -m bench.serve.envs)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.engine.arms import Arm, Runner
from bench.engine.client import sites_from_env
from bench.engine.session import site_vllm_version

from . import bench_client, gpu_clocks, identity, model_dir, records, server
from .envs import RESUME_ENV
from .settings import CONTROL, Settings, Shape, from_env

MODEL_DIR = Path("/tmp/sr-serve/model")
FIRST_START_GUESS_S = 240.0


class Stopped(BaseException):
    """SIGTERM (a time limit) arrived: the run saves what it has and stops."""


class SitesMissing(RuntimeError):
    """SR_ENGINE_SITES is not set or lacks an arm's copy: run through tests/gpu/vllm/engine.sh "
    "serve."""


def log(message: str, began: float = time.monotonic()) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - began:6.0f}s] {message}", flush=True)


def plan(settings: Settings) -> Iterator[tuple[Runner, int, Arm, tuple[Shape, ...]]]:
    """The servers in order: per runner, round after round, stock first in each, the
    control (identity only) last in its rounds."""
    for runner in settings.runners:
        for pair in range(1, settings.pairs + 1):
            for arm in settings.arms:
                yield runner, pair, arm, settings.shapes_of(pair)
            if pair in settings.control_pairs and settings.identity:
                yield runner, pair, CONTROL, ()


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
        self.slowest = 0.0
        self.began = time.monotonic()
        meta = self.data["meta"]
        meta.setdefault("kv_cache_dtype", settings.kv_cache_dtype)
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

    def fits(self) -> bool:
        budget = self.settings.budget_s
        if budget is None:
            return True
        guess = max(self.slowest, FIRST_START_GUESS_S if not self.slowest else 0)
        left = budget - (time.monotonic() - self.began)
        if left < guess:
            log(
                f"budget: {left:.0f} s left, a server took up to {guess:.0f} s: stopping here "
                f"(run again to resume)"
            )
            return False
        return True

    def start(self, arm: Arm, runner: Runner, name: str) -> tuple[server.Server, float]:
        """A ready server; once, where fp8 KV cache is what fails, the rest of the run
        falls back to the model's KV dtype (meta.kv_cache_fallback says why)."""
        meta = self.data["meta"]
        for attempt in (1, 2):
            kv = meta["kv_cache_dtype"]
            srv = server.Server.launch(
                lambda port, kv=kv: self.argv_for(arm, runner, port, kv),
                self.env_for(arm, runner),
                self.out / "serve-logs" / f"{name}{'' if attempt == 1 else '-retry'}.log",
                self.pid_dir / f"{name}.pid",
            )
            try:
                return srv, srv.wait_ready(self.settings.start_timeout)
            except BaseException as error:
                srv.stop(grace=10)
                if not isinstance(error, (server.ServerDied, server.ServerTimeout)):
                    raise
                started_before = any("start_s" in c for c in self.data["cells"].values())
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

    def cell(self, runner: Runner, pair: int, arm: Arm, shapes: tuple[Shape, ...]) -> None:
        key = records.cell_key(runner.value, pair, arm.name)
        cell = self.data["cells"].setdefault(
            key, {"arm": arm.name, "runner": runner.value, "pair": pair}
        )
        need_identity, todo = records.missing(cell, shapes, self.settings.identity)
        if not need_identity and not todo:
            log(f"{key}: done before")
            return
        name = key.replace("/", "-")
        log(
            f"{key}: starting the server ({', '.join(s.name for s in todo) or 'identity only'} "
            f"to do)"
        )
        began = time.monotonic()
        try:
            srv, start_s = self.start(arm, runner, name)
        except (server.ServerDied, server.ServerTimeout) as error:
            cell.setdefault("errors", []).append(f"start: {error}"[-3000:])
            log(f"{key}: the server did not start: {str(error).splitlines()[0]}")
            self.save()
            return
        try:
            cell["start_s"] = start_s
            cell["kv_cache_dtype"] = self.data["meta"]["kv_cache_dtype"]
            log(f"{key}: ready in {start_s:.0f} s")
            if need_identity:
                self.identity(cell, srv, key)
            for shape in todo:
                self.shape(cell, srv, key, shape)
        finally:
            cell["engagement"] = srv.engagement()
            srv.stop()
            self.slowest = max(self.slowest, time.monotonic() - began)
            cell["wall_s"] = cell.get("wall_s", 0) + time.monotonic() - began
            self.save()
        log(f"{key}: stopped; engagement: {cell['engagement'][:1] or 'none'}")

    def identity(self, cell: dict[str, Any], srv: server.Server, key: str) -> None:
        try:
            record = identity.run(srv.post, self.data["meta"]["model"]["vocab_size"])
        except Exception as error:  # recorded, so the next run retries this part
            cell.setdefault("errors", []).append(
                f"identity: {type(error).__name__}: {error}"[:2000]
            )
            log(f"{key}: identity failed: {error}")
        else:
            cell["identity"] = record
            log(f"{key}: identity recorded ({record['sanity']})")
        self.save()

    def shape(self, cell: dict[str, Any], srv: server.Server, key: str, shape: Shape) -> None:
        result = self.out / "serve-results" / f"{key.replace('/', '-')}-{shape.name}.json"
        result.parent.mkdir(parents=True, exist_ok=True)
        arguments = bench_client.argv(shape, srv.port, self.folder, result, self.settings.warmups)
        log(
            f"{key}: vllm bench serve {shape.name} (concurrency {shape.concurrency}, "
            f"{shape.num_prompts} requests)"
        )
        try:
            with gpu_clocks.Sampler(result.with_suffix(".gpu.csv")) as gpus:
                self.client(arguments)
            kept = bench_client.summary(json.loads(result.read_text()))
            if gpus.summary():
                kept["gpus"] = gpus.summary()
            bench_client.check(shape, kept)
        except Exception as error:
            cell.setdefault("errors", []).append(
                f"{shape.name}: {type(error).__name__}: {error}"[:2000]
            )
            log(f"{key}: {shape.name} failed: {error}")
        else:
            cell.setdefault("bench", {})[shape.name] = {
                **kept,
                "shape": asdict(shape),
                "argv": arguments,
            }
            log(
                f"{key}: {shape.name}: ITL p50 {kept.get('median_itl_ms', float('nan')):.3f} ms, "
                f"TPOT p50 {kept.get('median_tpot_ms', float('nan')):.3f} ms, "
                f"acceptance length {kept.get('spec_decode_acceptance_length', float('nan')):.2f}"
            )
        self.save()

    def all(self) -> dict[str, Any]:
        self.end_leftovers()
        for runner, pair, arm, shapes in plan(self.settings):
            if not self.fits():
                break
            self.cell(runner, pair, arm, shapes)
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
