"""One `vllm serve` process: its command line (the seed document's server flags, as far
as vLLM 0.26.0 on one H200 and the bundle allow), its environment per arm and runner,
and its life: start, wait for /health, HTTP requests, the engagement lines, stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine.arms import (
    DETERMINISTIC_ENV,
    MULTICAST_OFF_ENV,
    Arm,
    GraphMode,
    Runner,
    compilation_config,
)
from bench.engine.client import flashinfer_workspace
from bench.engine.envs import ARM_ENV
from bench.engine.envs import TORCH_DETERMINISTIC_ENV as ENGINE_TORCH_DETERMINISTIC_ENV

from . import model_dir
from .envs import DEPS_ENV, WEIGHTS_WORKER_ENV
from .settings import Settings

REPO = Path(__file__).resolve().parents[2]
SERVED_NAME = "sr-serve"
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 10240  # the seed document's
WORKER_CLS = "bench.serve.serve_worker.ServeWorker"
POLL_S = 2.0
"""Seconds between /health polls."""
ENGAGEMENT_MARKS = ("stochastic-rounding seeds", "SR_SEED_PREFETCH is set")


class ServerDied(RuntimeError):
    """The server exited before it answered /health; the message holds its log's tail."""


class ServerTimeout(RuntimeError):
    """The server did not answer /health in time (raise SR_SERVE_START_TIMEOUT, or read its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def capture_sizes(spec_tokens: int) -> list[int]:
    """Graphs per token count: a verify step of b requests runs b x (1 + K) tokens."""
    return [bs * (1 + spec_tokens) for bs in (1, 2, 4, 8) if bs <= MAX_NUM_SEQS]


def command(settings: Settings, folder: Path, port: int, kv_cache_dtype: str) -> list[str]:
    """`vllm serve` of the model in folder on port, with the seed document's flags:
    MTP (K speculative tokens), async scheduling, prefix caching in align mode, the
    FlashInfer SSU with an fp16 state and stochastic rounding over 5 Philox rounds,
    the KV cache in kv_cache_dtype; FULL_AND_PIECEWISE graphs with Inductor's
    deterministic mode (as the engine harness compiles); a GPU memory share that lets
    the round's servers reside side by side."""
    compile_cfg = compilation_config(GraphMode.FULL_AND_PIECEWISE)
    compile_cfg["cudagraph_capture_sizes"] = capture_sizes(settings.spec_tokens)
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        "--tokenizer",
        str(folder),
        "--load-format",
        "dummy",
        "--seed",
        "0",
        "--tensor-parallel-size",
        "1",
        "--attention-backend",
        "TRITON_ATTN",
        "--mamba-backend",
        "flashinfer",
        "--mamba-ssm-cache-dtype",
        "float16",
        "--enable-mamba-cache-stochastic-rounding",
        "--mamba-cache-philox-rounds",
        "5",
        *(["--async-scheduling"] if settings.async_scheduling else []),
        *(
            ["--enable-prefix-caching", "--mamba-cache-mode", "align"]
            if settings.prefix_caching
            else []
        ),
        "--max-model-len",
        str(model_dir.MAX_MODEL_LEN),
        "--max-num-batched-tokens",
        str(MAX_NUM_BATCHED_TOKENS),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--kv-cache-memory-bytes",
        str(settings.kv_cache_bytes),
        # Low enough that the round's later servers start beside the earlier ones.
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--compilation-config",
        json.dumps(compile_cfg),
        "--worker-cls",
        WORKER_CLS,
        "--disable-uvicorn-access-log",
    ]
    if settings.spec_tokens:
        spec = {"method": "mtp", "num_speculative_tokens": settings.spec_tokens}
        argv += ["--speculative-config", json.dumps(spec)]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    return argv + list(settings.extra_args)


def environment(arm: Arm, runner: Runner, site: str, settings: Settings) -> dict[str, str]:
    """The server's environment: this process's, the engine harness's determinism
    settings, the runner's and the arm's (VLLM_MAMBA_SR_SEED_PREFETCH=1 for the
    patched arms), the arm's vLLM copy and the serve deps on PYTHONPATH."""
    env = dict(os.environ)
    env.update(DETERMINISTIC_ENV)
    env.update(MULTICAST_OFF_ENV)
    env.update(runner.env)
    env.update(arm.env)
    deps = os.environ.get(DEPS_ENV, "/tmp/serve-site")
    cache_root = os.environ.get("VLLM_CACHE_ROOT", "/tmp/vllm_cache").split("/serve-")[0]
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), site, deps]),
        VLLM_USE_FLASHINFER_SAMPLER="0",
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        VLLM_CACHE_ROOT=f"{cache_root}/serve-{arm.name}-{runner.value}",
        FLASHINFER_WORKSPACE_BASE=flashinfer_workspace(Path(cache_root), arm),
        VLLM_NO_USAGE_STATS="1",
        PYTHONUNBUFFERED="1",
        **{ARM_ENV: arm.name, WEIGHTS_WORKER_ENV: settings.weights},
    )
    if settings.torch_deterministic in ("1", "nofill"):
        env[ENGINE_TORCH_DETERMINISTIC_ENV] = settings.torch_deterministic
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    else:
        env.pop(ENGINE_TORCH_DETERMINISTIC_ENV, None)
    return env


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    log: Path
    pid_file: Path | None = None
    launched: float = field(default_factory=time.monotonic)

    @classmethod
    def launch(
        cls,
        argv_for: Callable[[int], Sequence[str]],
        env: dict[str, str],
        log: Path,
        pid_file: Path | None = None,
        preexec_fn: Callable[[], None] | None = None,
    ) -> Server:
        """Starts argv_for(port) in a session of its own (so stop() ends all it started),
        after `preexec_fn` in the child (e.g. pinning it, and all it spawns, to cores)."""
        port = free_port()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as sink:
            process = subprocess.Popen(
                list(argv_for(port)),
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )
        if pid_file is not None:
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(str(process.pid))
        return cls(process, port, log, pid_file)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float, poll: float | None = None) -> float:
        """Seconds from the launch until /health answered 200 (so servers launched together
        are each timed from their own launch); ServerDied or ServerTimeout otherwise."""
        began = self.launched
        while True:
            if self.process.poll() is not None:
                raise ServerDied(
                    f"the server exited ({self.process.returncode}) before /health answered; "
                    f"its log ({self.log}) ends:\n{self.tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return time.monotonic() - began
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - began > timeout:
                raise ServerTimeout(
                    f"no /health in {timeout:.0f} s (raise SR_SERVE_START_TIMEOUT); {self.log} "
                    f"ends:\n" + self.tail()
                )
            time.sleep(POLL_S if poll is None else poll)

    def get(self, path: str, timeout: float = 30) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as reply:
            return reply.read().decode()

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"{path}: HTTP {error.code}: {error.read()[:500]!r}") from None

    def engagement(self) -> list[str]:
        """The log's prefetcher lines (engaged, or set but unused)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [
            line.strip() for line in text.splitlines() if any(m in line for m in ENGAGEMENT_MARKS)
        ]

    def stop(self, grace: float = 30) -> None:
        """SIGINT to the server's session, SIGKILL after `grace` seconds."""
        stop_session(self.process.pid, grace, self.process)
        if self.pid_file is not None and self.pid_file.exists():
            self.pid_file.unlink()


def stop_session(pid: int, grace: float = 30, process: subprocess.Popen | None = None) -> None:
    """Ends the session this harness started the server `pid` in: SIGINT, then SIGKILL."""
    try:
        os.killpg(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            break
        if process is None and not _alive(pid):
            break
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if process is not None:
        process.wait(timeout=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
