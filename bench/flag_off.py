"""Host µs per forward of the runner's call site: stock against the patch, flag off.

With VLLM_MAMBA_SR_SEED_PREFETCH unset, the patched model runner registers no
hook, and its forward site passes None instead of a ForwardInfo:

    with set_forward_context(...), self.forward_hooks.forward(
        sr_seed_prefetch.ForwardInfo(...) if self.forward_hooks.active else None
    ):

This measures that `with` against stock's, which opens set_forward_context
alone, and against the patch as it was before this fast path (the seed relay
registered on every runner, a ForwardInfo built and the hooks' context
entered on every forward), and flag-off's cost in two parts: its no-op item
entered alone, and its expression evaluated alone. set_forward_context is a
stand-in that does nothing, so the figures are what the patch adds, not
vLLM's own cost. CPU only: nothing here touches a GPU.

    python -m bench.flag_off [--rounds 60] [--forwards 2000] [--out PREFIX]

Variants run in interleaved rounds, shuffled per round with a fixed seed;
each sample is the mean over `--forwards` forwards. Reported: medians with
95% bootstrap intervals and IQRs, and each variant's µs over stock with a
paired interval (bench/stats.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runner_hooks import ForwardHooks, ForwardInfo
from runner_hooks import core as sr_seed_prefetch  # named as the patched runners name it

from . import stats


@contextlib.contextmanager
def set_forward_context_stand_in() -> Iterator[None]:
    """Stands in for vLLM's set_forward_context: a generator context, as it is."""
    yield


class Relay:
    """The seed relay as it was registered with the flag off: no prefetcher behind it."""

    prefetcher = None

    def on_forward_begin(self, info: ForwardInfo) -> None:
        if self.prefetcher is not None:
            self.prefetcher.on_forward_begin(info)

    def on_forward_end(self, info: ForwardInfo) -> None:
        if self.prefetcher is not None:
            self.prefetcher.on_forward_end(info)


def runs_ssu(attn_metadata: object) -> bool:
    """batch_runs_mamba_ssu with the flag off: no probe layer, so False at once."""
    return False


class Runner:
    """The attributes the call site reads."""

    def __init__(self, hooks: ForwardHooks) -> None:
        self.forward_hooks = hooks


def stock(runner: Runner, attn_metadata: object) -> None:
    with set_forward_context_stand_in():
        pass


def flag_off(runner: Runner, attn_metadata: object) -> None:
    with (
        set_forward_context_stand_in(),
        runner.forward_hooks.forward(
            sr_seed_prefetch.ForwardInfo(
                runs_ssu=runs_ssu(attn_metadata),
                micro_batched=False,
                full_cudagraph=False,
            )
            if runner.forward_hooks.active
            else None
        ),
    ):
        pass


def relay_always(runner: Runner, attn_metadata: object) -> None:
    with (
        set_forward_context_stand_in(),
        runner.forward_hooks.forward(
            sr_seed_prefetch.ForwardInfo(
                runs_ssu=runs_ssu(attn_metadata),
                micro_batched=False,
                full_cudagraph=False,
            )
        ),
    ):
        pass


def item_only(runner: Runner, attn_metadata: object) -> None:
    """flag-off's parts: its no-op item entered and exited, nothing evaluated."""
    with set_forward_context_stand_in(), ForwardHooks.UNHOOKED:
        pass


def expression_only(runner: Runner, attn_metadata: object) -> None:
    """flag-off's parts: its expression evaluated (the `active` read and the
    forward(None) call), not entered."""
    runner.forward_hooks.forward(
        sr_seed_prefetch.ForwardInfo(
            runs_ssu=runs_ssu(attn_metadata),
            micro_batched=False,
            full_cudagraph=False,
        )
        if runner.forward_hooks.active
        else None
    )
    with set_forward_context_stand_in():
        pass


PARTS = ("parts: the no-op item alone", "parts: the expression alone")
"""The variants that split flag-off's cost, not sites anyone runs."""


def variants() -> dict[str, tuple[Callable[[Runner, object], None], Runner]]:
    unhooked = Runner(ForwardHooks())
    relayed = Runner(ForwardHooks())
    relayed.forward_hooks.register(Relay())
    return {
        "stock": (stock, unhooked),
        "flag-off": (flag_off, unhooked),
        "flag-off, relay always registered (before)": (relay_always, relayed),
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


def markdown(rows: dict[str, dict[str, Any]], command: str) -> str:
    def interval(values: list[float] | None) -> str:
        return "n/a" if not values else f"[{values[0]:.3f}, {values[1]:.3f}]"

    lines = [
        f"# Host µs per forward at the runner's call site, flag off ({platform.node() or 'host'})",
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--forwards", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write PREFIX.md and PREFIX.json")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.forwards < 1:
        parser.error("--rounds and --forwards must be at least 1")
    rows = summarize(measure(args.rounds, args.forwards, args.seed))
    command = "python -m bench.flag_off " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, command.strip())
    if args.out:
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
