"""Host µs per forward of the runner's call site: stock against the patch, flag off.

With VLLM_MAMBA_SR_SEED_PREFETCH unset, no seed prefetcher is attached, and the
patched model runner's forward site returns a shared no-op context at once:

    with set_forward_context(...), sr_seed_forward(attn_metadata, ...):

This measures that `with` against stock's, which opens set_forward_context
alone, and against the patch as it was before (a ForwardHooks registry on every
runner, with no hook registered), and flag-off's cost in two parts: its no-op
item entered alone, and its expression evaluated alone. sr_seed_forward is the
landed function itself (vllm_patch/landing/ssu_reset.py), run over the module
state it has with the flag off; set_forward_context is a stand-in that does
nothing, so the figures are what the patch adds, not vLLM's own cost. CPU only:
nothing here touches a GPU.

    python -m bench.flag_off [--rounds 60] [--forwards 2000] [--out PREFIX]

Variants run in interleaved rounds, shuffled per round with a fixed seed;
each sample is the mean over `--forwards` forwards. Reported: medians with
95% bootstrap intervals and IQRs, and each variant's µs over stock with a
paired interval (bench/stats.py).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import platform
import statistics
import sys
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runner_hooks.hooks import ForwardHooks, ForwardInfo

from . import stats

LANDING = Path(__file__).resolve().parents[1] / "vllm_patch" / "landing" / "ssu_reset.py"
FORWARD = "sr_seed_forward"


def landed_module_state() -> dict[str, Any]:
    """ssu_dispatch's globals as the patch leaves them with the flag off, with
    the landed sr_seed_forward and _batch_runs_mamba_ssu defined in them."""
    tree = ast.parse(LANDING.read_text())
    functions = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in (FORWARD, "_batch_runs_mamba_ssu")
    ]
    namespace: dict[str, Any] = {
        "Any": Any,
        "AbstractContextManager": contextlib.AbstractContextManager,
        "_sr_seed_prefetcher": None,
        "_mamba2_probe_layer": None,
        "_NO_SR_SEED_FORWARD": contextlib.nullcontext(),
    }
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(LANDING), "exec"), namespace)
    return namespace


STATE = landed_module_state()
sr_seed_forward = typing.cast(
    Callable[..., contextlib.AbstractContextManager[None]], STATE[FORWARD]
)


@contextlib.contextmanager
def set_forward_context_stand_in() -> Iterator[None]:
    """Stands in for vLLM's set_forward_context: a generator context, as it is."""
    yield


class Runner:
    """The attributes the call site before this patch read."""

    def __init__(self, hooks: ForwardHooks) -> None:
        self.forward_hooks = hooks


def stock(runner: Runner, attn_metadata: object) -> None:
    with set_forward_context_stand_in():
        pass


def flag_off(runner: Runner, attn_metadata: object) -> None:
    with (
        set_forward_context_stand_in(),
        sr_seed_forward(attn_metadata, micro_batched=False, full_cudagraph=False),
    ):
        pass


def hook_registry(runner: Runner, attn_metadata: object) -> None:
    """The site before sr_seed_forward: the runner's ForwardHooks, none registered."""
    with (
        set_forward_context_stand_in(),
        runner.forward_hooks.forward(
            ForwardInfo(runs_ssu=False, micro_batched=False, full_cudagraph=False)
            if runner.forward_hooks.active
            else None
        ),
    ):
        pass


def item_only(runner: Runner, attn_metadata: object) -> None:
    """flag-off's parts: its no-op item entered and exited, nothing evaluated."""
    with set_forward_context_stand_in(), STATE["_NO_SR_SEED_FORWARD"]:
        pass


def expression_only(runner: Runner, attn_metadata: object) -> None:
    """flag-off's parts: its expression evaluated, not entered."""
    sr_seed_forward(attn_metadata, micro_batched=False, full_cudagraph=False)
    with set_forward_context_stand_in():
        pass


PARTS = ("parts: the no-op item alone", "parts: the expression alone")
"""The variants that split flag-off's cost, not sites anyone runs."""


def variants() -> dict[str, tuple[Callable[[Runner, object], None], Runner]]:
    unhooked = Runner(ForwardHooks())
    return {
        "stock": (stock, unhooked),
        "flag-off": (flag_off, unhooked),
        "flag-off, hook registry (before)": (hook_registry, unhooked),
        PARTS[0]: (item_only, unhooked),
        PARTS[1]: (expression_only, unhooked),
    }


def measure(rounds: int, forwards: int, seed: int = 0) -> dict[str, list[float]]:
    """Seconds per forward, one sample of every variant per round, shuffled."""
    table = variants()
    samples: dict[str, list[float]] = {name: [] for name in table}
    metadata: dict[str, Any] = {}
    for round_index in range(rounds):
        order = list(table)
        stats.seeded_rng(seed, "flag-off", round_index).shuffle(order)
        for name in order:
            call, runner = table[name]
            began = time.perf_counter_ns()
            for _ in range(forwards):
                call(runner, metadata)
            samples[name].append((time.perf_counter_ns() - began) / forwards / 1e9)
    return samples


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    boot = stats.bootstrap_medians(samples, rng=stats.seeded_rng(stats.BOOTSTRAP_SEED, "flag-off"))
    enough = all(len(v) >= stats.MIN_SAMPLES for v in samples.values())
    base = statistics.median(samples["stock"])
    rows = {}
    for name, values in samples.items():
        median = statistics.median(values)
        row: dict[str, Any] = {
            "samples": len(values),
            "median_us": round(median * 1e6, 4),
            "median_ci95_us": (
                [round(v * 1e6, 4) for v in stats.percentile_interval(boot[name])]
                if enough
                else None
            ),
            "iqr_us": [round(v * 1e6, 4) for v in stats.quartiles(values) or ()],
        }
        if name != "stock":
            row["over_stock_us"] = round((median - base) * 1e6, 4)
            over = stats.interval_of([boot["stock"], boot[name]], lambda s, v: v - s)
            row["over_stock_ci95_us"] = (
                [round(v * 1e6, 4) for v in over] if enough and over else None
            )
        rows[name] = row
    return rows


def markdown(
    rows: dict[str, dict[str, Any]],
    command: str,
    per: str = "per forward at the runner's call site",
) -> str:
    def interval(values: list[float] | None) -> str:
        return "n/a" if not values else f"[{values[0]:.3f}, {values[1]:.3f}]"

    lines = [
        f"# Host µs {per}, flag off ({platform.node() or 'host'})",
        "",
        f"`{command}`; Python {platform.python_version()}, {platform.machine()}.",
        "",
        "| variant | median µs [95% CI] | IQR | over stock [95% CI] |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        iqr = row["iqr_us"]
        over = (
            f"{row['over_stock_us']:+.3f} {interval(row['over_stock_ci95_us'])}"
            if "over_stock_us" in row
            else "-"
        )
        lines.append(
            f"| {name} | {row['median_us']:.3f} {interval(row['median_ci95_us'])} | "
            f"{(iqr[1] - iqr[0]) if iqr else float('nan'):.3f} | {over} |"
        )
    return "\n".join(lines) + "\n"


def cli(
    argv: list[str] | None,
    module: str,
    count: str,
    default: int,
    measure: Callable[[int, int, int], dict[str, list[float]]],
    summarize: Callable[[dict[str, list[float]]], dict[str, dict[str, Any]]],
    per: str,
    description: str,
) -> int:
    """The command line of a flag-off bench: interleaved rounds, one table, PREFIX.md/json."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument(f"--{count}", type=int, default=default)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write PREFIX.md and PREFIX.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or getattr(args, count) < 1:
        parser.error(f"--rounds and --{count} must be at least 1")
    rows = summarize(measure(args.rounds, getattr(args, count), args.seed))
    command = f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, command.strip(), per)
    if args.out:
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli(
        argv,
        "bench.flag_off",
        "forwards",
        2000,
        measure,
        summarize,
        "per forward at the runner's call site",
        __doc__.splitlines()[0],
    )


if __name__ == "__main__":
    raise SystemExit(main())
