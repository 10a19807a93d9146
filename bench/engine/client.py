"""Starts a worker (worker.py) for an arm and sends it commands."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .arms import MULTICAST_OFF_ENV, Arm, Runner
from .envs import SITES_ENV

REPO = Path(__file__).resolve().parents[2]
CACHE_ROOT = Path("/tmp/sr-engine-cache")
"""Where engines keep their compile caches, one per (arm, runner, GPU), and FlashInfer
workspaces, one per vLLM copy (flashinfer_workspace), shared by the identity and timing
runs: the timing's engines load what identity's compiled."""
# Where each arm's vLLM copy lives (Arm.site): "stock=/tmp/site,reset=...,forward-context=...".


class WorkerError(RuntimeError):
    """A worker replied with an error, died, or did not answer in time."""


def sites_from_env() -> dict[str, str] | None:
    """The `SR_ENGINE_SITES` mapping, or None where it is not set."""
    text = os.environ.get(SITES_ENV)
    if not text:
        return None
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"{SITES_ENV} must read copy=path,copy=path,...: got {text!r}")
    return dict(pairs)


def environment(
    arm: Arm,
    runner: Runner,
    sites: dict[str, str],
    gpu: str,
    cache_root: Path,
    extra_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """A worker process's environment, which its engine's TP ranks inherit:
    this one's, then extra_env (settings every arm shares), the runner's, the
    arm's own (which wins), and what the worker must have: its GPUs (`gpu`,
    one per rank, e.g. "0,1"), NVLink multicast off, an in-process engine core."""
    if arm.site not in sites:
        raise ValueError(f"{SITES_ENV} names no vLLM for the {arm.site!r} copy")
    env = dict(os.environ)
    env.update(extra_env or {})
    env.update(runner.env)
    env.update(arm.env)
    env.update(MULTICAST_OFF_ENV)
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), sites[arm.site]]),
        CUDA_VISIBLE_DEVICES=gpu,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        # One compile cache per engine: engines that start side by side
        # must not write the same entries at once.
        VLLM_CACHE_ROOT=str(cache_root / f"{arm.name}-{runner.value}-gpu{gpu.replace(',', '-')}"),
        FLASHINFER_WORKSPACE_BASE=flashinfer_workspace(cache_root, arm),
    )
    return env


def flashinfer_workspace(cache_root: Path, arm: Arm) -> str:
    """The FlashInfer JIT workspace of the arm's vLLM copy, one per copy: FlashInfer
    writes its own package's path into each kernel's ninja file and builds under one
    lock per workspace, so copies sharing one rebuild each other's SSU kernel, one
    engine at a time, inside the first FULL graph capture."""
    return str(cache_root / f"flashinfer-{arm.site}")


@dataclass
class Worker:
    arm: Arm
    runner: Runner
    process: subprocess.Popen
    replies: Any
    log: Path

    @classmethod
    def spawn(
        cls,
        arm: Arm,
        runner: Runner,
        *,
        sites: dict[str, str],
        model_dir: Path,
        gpu: str,
        log_dir: Path,
        cache_root: Path,
        extra_env: dict[str, str] | None = None,
        tp: int = 1,
    ) -> Worker:
        env = environment(arm, runner, sites, gpu, cache_root, extra_env)
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{arm.name}-{runner.value}.log"
        read_end, write_end = os.pipe()
        with log.open("w") as sink:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.engine.worker",
                    "--arm",
                    arm.name,
                    "--model-dir",
                    str(model_dir),
                    "--reply-fd",
                    str(write_end),
                    "--tp",
                    str(tp),
                ],
                stdin=subprocess.PIPE,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                pass_fds=(write_end,),
                text=True,
            )
        os.close(write_end)
        worker = cls(arm, runner, process, os.fdopen(read_end), log)
        worker.reply(timeout=300)
        return worker

    def reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerError(f"{self.name}: no reply in {timeout:.0f} s ({self.log})")
            ready, _, _ = select.select([self.replies], [], [], min(left, 5.0))
            if ready:
                line = self.replies.readline()
                if not line:
                    raise WorkerError(f"{self.name}: the worker died ({self.log})")
                answer = json.loads(line)
                if not answer.get("ok"):
                    raise WorkerError(f"{self.name}: {answer.get('error')} ({self.log})")
                return answer

    def call(self, op: str, timeout: float = 600, **args: Any) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        return self.reply(timeout)

    @property
    def name(self) -> str:
        return f"{self.arm.name}/{self.runner.value}"

    def close(self) -> None:
        try:
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)
        except Exception:
            self.process.kill()
        self.replies.close()

    def engagement(self) -> list[str]:
        """The engine log's prefetcher lines (engaged, or set but unused)."""
        return [
            line.strip()
            for line in self.log.read_text(errors="replace").splitlines()
            if "stochastic-rounding seeds" in line or "SR_SEED_PREFETCH is set" in line
        ]
