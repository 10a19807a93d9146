"""A paired run through two resident servers: A/A (two stock servers) or A/B (stock and a
patched arm), one request at a time in the A B B A order of pairing.py.

Both servers stay up together on the one GPU, each pinned with every process it spawns
to whole cores of its own, this client to others (cores.py); run r gives A core set
r % 2. Per request: the server's own mean ITL, from the change in
`vllm:inter_token_latency_seconds` between /metrics reads around it (the primary
figure), and the client's TTFT, ITL, TPOT and output tokens per second from the stream.
Each pair is one JSON line of its run's file in `--out`; the first line holds the run's
command, GPU and core sets, the last the GPU clocks and host load over it. `report`
pools runs (paired_stats.py).

    python -m bench.serve.paired run --a stock --b stock --runs 2 --out DIR
    python -m bench.serve.paired report --effect 0.03 DIR/*.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.engine.arms import BY_NAME, Arm, Runner

from . import cores, gpu_clocks, host_load, metrics, paired_stats, pairing, server
from .settings import TEMPERATURE, Settings

SERVERS = pairing.SERVERS
HEADER = "run"
"""The `kind` of a file's first line: what the run was; every later line is a pair."""


class PairedRunError(RuntimeError):
    """The run cannot go on as asked; the message says what to change."""


@dataclass(frozen=True)
class Request:
    """One request's figures: the server's mean ITL, and the client's own."""

    server_itl_s: float
    ttft_s: float
    client_itl_s: float
    tpot_s: float
    output_tokens: int
    tokens_per_s: float


def stream_completion(url: str, body: dict[str, Any], timeout: float = 300) -> Request:
    """POSTs `body` streamed to url's /v1/completions; the client's figures, with the
    server's ITL left at 0 (measure() fills it)."""
    request = urllib.request.Request(
        url + "/v1/completions",
        json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode(),
        {"Content-Type": "application/json"},
    )
    began = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if any(choice.get("text") for choice in chunk.get("choices", [])):
                arrivals.append(time.perf_counter())
    if len(arrivals) < 2 or tokens < 2:
        raise PairedRunError(
            f"{url}: a streamed reply of {len(arrivals)} chunks and {tokens} tokens has no "
            "inter-token gap: raise --max-tokens"
        )
    total = arrivals[-1] - began
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    return Request(
        server_itl_s=0.0,
        ttft_s=arrivals[0] - began,
        client_itl_s=statistics.fmean(gaps),
        tpot_s=(arrivals[-1] - arrivals[0]) / (tokens - 1),
        output_tokens=tokens,
        tokens_per_s=tokens / total,
    )


def measure(url: str, body: dict[str, Any]) -> Request:
    """One request, with /metrics read before and after it."""
    before = _get(url + "/metrics")
    figures = stream_completion(url, body)
    after = _get(url + "/metrics")
    return Request(**{**asdict(figures), "server_itl_s": metrics.mean_itl(before, after)})


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as reply:
        return reply.read().decode()


def gpus() -> list[str]:
    """nvidia-smi's name and driver of each GPU; none where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, check=False).stdout.splitlines()


def body(pair: pairing.Pair, max_tokens: int) -> dict[str, Any]:
    return {
        "model": server.SERVED_NAME,
        "prompt": list(pair.prompt),
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": TEMPERATURE,
        "seed": pair.seed,
        "ignore_eos": True,
    }


def run_pairs(
    urls: dict[str, str],
    schedule: Iterable[pairing.Pair],
    max_tokens: int,
    write: Callable[[dict[str, Any]], None],
    warmup: int = 0,
) -> None:
    """Each pair's two requests in its order, one line per pair through `write`; the
    first `warmup` pairs are sent but not written."""
    for pair in schedule:
        figures = {name: measure(urls[name], body(pair, max_tokens)) for name in pair.order}
        if pair.index < warmup:
            continue
        write(
            {
                "kind": "pair",
                "pair": pair.index,
                "order": "".join(pair.order),
                "seed": pair.seed,
                **{name: asdict(figures[name]) for name in SERVERS},
            }
        )


# --- the report -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSummary:
    header: dict[str, Any]
    d: list[float]
    interval: paired_stats.Interval
    offsets: dict[str, float]


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A run file's header and its pairs."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines or lines[0].get("kind") != HEADER:
        raise PairedRunError(f"{path}: no run header on its first line: not a paired run's file")
    return lines[0], [line for line in lines[1:] if line.get("kind") == "pair"]


def summarize(path: Path, metric: str = "server_itl_s") -> RunSummary:
    header, pairs = load(path)
    a = [p["A"][metric] for p in pairs]
    b = [p["B"][metric] for p in pairs]
    return RunSummary(
        header,
        paired_stats.log_ratios(a, b),
        paired_stats.block_bootstrap(paired_stats.log_ratios(a, b)),
        paired_stats.offsets(a, b),
    )


def report(paths: list[Path], effect: float, metric: str = "server_itl_s") -> str:
    """Markdown: per run, mean d with its block-bootstrap interval and the servers'
    offsets; across runs, the t interval, and (for A/A) the go or no-go against
    `effect`, the fraction the engine predicts."""
    runs = [summarize(path, metric) for path in paths]
    arms = {(r.header["a"], r.header["b"]) for r in runs}
    if len(arms) != 1:
        raise PairedRunError(f"the runs compare different arms ({sorted(arms)}): pool one pair")
    ((a, b),) = arms
    lines = [
        f"# Paired {a} / {b}: ln(B / A) of {metric}, {len(runs)} run(s)",
        "",
        "| run | cores A / B | pairs | mean B/A - 1 | 95 % CI | offset A | offset B |",
        "|---|---|---:|---:|---|---:|---:|",
    ]
    for r in runs:
        mean, low, high = r.interval.percent()
        cores_ab = " / ".join(cores.cpu_list(r.header["cores"][s]) for s in SERVERS)
        lines.append(
            f"| {r.header['run']} | {cores_ab} | {len(r.d)} | {mean:+.2f} % "
            f"| {low:+.2f} to {high:+.2f} % | {r.offsets['A']:+.2f} % | {r.offsets['B']:+.2f} % |"
        )
    lines.append("")
    if len(runs) >= 2:
        pooled = paired_stats.across_runs([r.interval.mean for r in runs])
        label = "t interval across runs"
    else:
        pooled = runs[0].interval
        label = "block bootstrap within the one run"
    mean, low, high = pooled.percent()
    lines.append(f"Pooled: {mean:+.2f} % ({low:+.2f} to {high:+.2f} %, 95 %, {label}).")
    if a == b:
        decision = paired_stats.aa_decision(pooled, effect)
        verdict = "go" if decision.go else "no-go"
        lines.append(
            f"A/A against a predicted effect of {100 * effect:.2f} %: {verdict}: {decision.reason}."
        )
    return "\n".join(lines) + "\n"


# --- the run on a GPU machine -----------------------------------------------------------


def arm_of(name: str) -> Arm:
    if name not in BY_NAME:
        raise PairedRunError(f"no arm {name!r}: choose one of {', '.join(sorted(BY_NAME))}")
    return BY_NAME[name]


Launch = Callable[[str, Arm, list[int], Path], server.Server]
"""Starts server `name` ("A" or "B") of `arm`, pinned to the cpus, logging to the path."""


def vllm_launcher(settings: Settings, runner: Runner) -> tuple[Launch, int, list[str]]:
    """`vllm serve` of the bench's model per arm's vLLM copy (SR_ENGINE_SITES); with the
    model's vocabulary size and the server's flags."""
    from bench.engine.client import sites_from_env

    from . import model_dir
    from .run import MODEL_DIR

    sites = sites_from_env()
    if not sites or any(arm.site not in sites for arm in settings.arms):
        raise PairedRunError(
            "SR_ENGINE_SITES lacks an arm's vLLM copy: run through tests/gpu/vllm/engine.sh"
        )
    folder = model_dir.write(MODEL_DIR, settings.spec_tokens)
    kv = settings.kv_cache_dtype

    def launch(name: str, arm: Arm, cpus: list[int], log: Path) -> server.Server:
        return server.Server.launch(
            lambda port: server.command(settings, folder, port, kv),
            server.environment(arm, runner, sites[arm.site], settings),
            log,
            preexec_fn=cores.preexec(cpus),
        )

    vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    return launch, vocab, server.command(settings, folder, 0, kv)[3:]


def run(
    args: argparse.Namespace,
    index: int,
    out: Path,
    launch: Launch,
    vocab: int,
    server_argv: list[str],
    start_timeout: float,
    sysfs: Path = cores.SYSFS_CPU,
) -> None:
    """Run `index` into `out`: both servers up (one after another, so the first holds its
    memory when the next starts), then the pairs; the servers stop at the end, whatever
    happens."""
    if out.exists():
        raise PairedRunError(f"{out} exists: give a new --out, or remove it")
    arms = {"A": arm_of(args.a), "B": arm_of(args.b)}
    client_cpus, *server_sets = cores.core_sets(3, args.cores_each, sysfs)
    pinned = pairing.assign(index, server_sets)
    os.sched_setaffinity(0, client_cpus)
    servers: dict[str, server.Server] = {}
    try:
        for name in SERVERS:
            log = out.with_name(f"{out.stem}-{name}.log")
            servers[name] = launch(name, arms[name], pinned[name], log)
            servers[name].wait_ready(start_timeout)
        schedule = pairing.pairs(args.warmup + args.pairs, index, vocab, args.prompt_len)
        sampler = gpu_clocks.Sampler(out.with_name(f"{out.stem}-clocks.csv"))
        load = host_load.Window()
        with out.open("w") as sink, sampler, load:

            def write(line: dict[str, Any]) -> None:
                sink.write(json.dumps(line) + "\n")
                sink.flush()

            write(
                {
                    "kind": HEADER,
                    "run": index,
                    "a": args.a,
                    "b": args.b,
                    "argv": sys.argv,
                    "gpus": gpus(),
                    "cores": {"client": client_cpus, **pinned},
                    "server_argv": server_argv,
                    "engagement": {n: s.engagement() for n, s in servers.items()},
                }
            )
            urls = {n: s.url for n, s in servers.items()}
            run_pairs(urls, schedule, args.max_tokens, write, args.warmup)
        with out.open("a") as sink:
            machine = {"kind": "machine", "clocks": sampler.summary(), "host_load": load.summary()}
            sink.write(json.dumps(machine) + "\n")
    finally:
        for running in servers.values():
            running.stop()


def _run(args: argparse.Namespace) -> int:
    runner = Runner(args.runner)
    settings = Settings(
        runners=(runner,),
        arms=(arm_of(args.a), arm_of(args.b)),
        spec_tokens=args.spec_tokens,
        async_scheduling=args.async_scheduling,
        prefix_caching=args.prefix_caching,
        kv_cache_dtype=args.kv_cache_dtype,
        kv_cache_bytes=args.kv_cache_bytes,
    )
    launch, vocab, server_argv = vllm_launcher(settings, runner)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(args.first_run, args.first_run + args.runs):
        out = folder / f"{args.a}-{args.b}-run{index}.jsonl"
        run(args, index, out, launch, vocab, server_argv, settings.start_timeout)
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serve.paired", description=__doc__.splitlines()[0]
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="one run of pairs through two resident servers")
    run.add_argument("--a", default="stock")
    run.add_argument("--b", default="stock")
    run.add_argument("--runs", type=int, default=2, help="runs, each on fresh servers")
    run.add_argument(
        "--first-run", type=int, default=0, help="the first run's index: its prompts and cores"
    )
    run.add_argument("--pairs", type=int, default=64)
    run.add_argument("--warmup", type=int, default=4, help="pairs sent first and not recorded")
    run.add_argument("--max-tokens", type=int, default=64)
    run.add_argument("--prompt-len", type=int, default=128)
    run.add_argument("--runner", choices=[r.value for r in Runner], default=Runner.V1.value)
    run.add_argument("--spec-tokens", type=int, default=0)
    run.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false")
    run.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false")
    run.add_argument("--kv-cache-dtype", default="auto")
    run.add_argument("--kv-cache-bytes", type=int, default=2 << 30)
    run.add_argument(
        "--cores-each", type=int, default=4, help="whole cores per server and the client"
    )
    run.add_argument("--out", required=True, help="the folder of the run files")
    pooled = verbs.add_parser("report", help="the pooled report of run files")
    pooled.add_argument("files", nargs="+", type=Path)
    pooled.add_argument(
        "--effect", type=float, required=True, help="the predicted effect, e.g. 0.03"
    )
    pooled.add_argument(
        "--metric", default="server_itl_s", choices=[f for f in Request.__dataclass_fields__]
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.verb == "report":
            print(report(args.files, args.effect, args.metric), end="")
            return 0
        return _run(args)
    except (
        PairedRunError,
        paired_stats.StatsError,
        metrics.MetricsError,
        cores.CoresError,
    ) as error:
        print(f"bench.serve.paired: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
