"""Where the reset design's eager host time goes, piece by piece of its hot path.

On a CUDA machine with FlashInfer, from the repository root (the same setup as
`pytest bench`, README.md):

    python -m bench.host_breakdown            # --help lists the options

Host µs to enqueue one eager decode step (a synchronize before each sample,
outside it), for the floor (one fixed seed, nothing drawn) and for the floor
plus one piece of the reset prefetcher's work at a time, then the
whole design, in interleaved rounds shuffled by a seeded generator
(step_timing.py).  Each figure is a median with its bootstrap 95% interval and the
IQR; "over floor" is the paired difference of medians, with its interval
(stats.py), and "÷ floor-rng" the ratio of medians.  `--profile` adds cProfile's
view of the floor and of the design.

The pieces reach into runner_hooks' internals (RUNNER_HOOKS_NAMES), as a
breakdown must.  bench/test_host_breakdown.py checks on the CPU that every one
exists and builds and runs every step once with stand-ins for CUDA, so a
change there fails CI.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from runner_hooks.core import prefetch as prefetch_module
from runner_hooks.core.prefetch import SeedBatch
from runner_hooks.hooks import ForwardHooks, ForwardInfo

from .drawers import stock_seed
from .stats import BOOTSTRAP_SEED, RESAMPLES, bootstrap_medians, interval_of, quantile, seeded_rng
from .step_timing import Step, gc_paused, host_us_per_step, interleaved
from .synthetic_model import DecodeModel, MixerShape
from .target import BenchUnavailable, flashinfer_target
from .variants import ResetPrefetcherByName

RUNNER_HOOKS_NAMES = (
    "runner_hooks.hooks.ForwardHooks.register",
    "runner_hooks.hooks.ForwardHooks.forward",
    "runner_hooks.hooks.ForwardInfo",
    "bench.variants.ResetPrefetcherByName.next_seed",
    "runner_hooks.core.prefetch.SeedBatch.take",
    "runner_hooks.core.prefetch.SeedBatch.consumed",
    "runner_hooks.core.prefetch.SeedPrefetch.schedule",
    "runner_hooks.core.prefetch._is_capturing",
    "runner_hooks.core.prefetch._current_stream_handle",
)
"""The runner_hooks and bench.variants names this script uses, checked by the CPU test; the
instance attributes it reads (ResetPrefetcherByName.prefetch and ._batch, SeedPrefetch.draw,
_buffer, _device_index, SeedBuffer.whole and .seeds, and the batches'
constructors) are exercised by that test's run of every step."""

STEPS: tuple[tuple[str, str], ...] = (
    ("floor", "floor (fixed seed)"),
    ("floor_rng", "floor-rng: the floor plus one stock draw per step"),
    ("capture_check", "floor + capture check (`_is_capturing()`) per SSU call"),
    ("stream_check", "floor + raw current-stream handle per SSU call"),
    ("draw", "floor + the drawer's draw of N seeds, once per step"),
    ("begin_end", "floor + forward begin/end (hooks, schedule incl. the draw, finish)"),
    ("takes", "floor + `SeedBatch.take()` per SSU call (checks at the first and last)"),
    ("design", "reset (`next_seed()` per SSU call, inside hooks.forward)"),
)
"""(name, what the step adds to the floor), in table order."""

DEFAULT_ROUNDS = 300
WARMUP = 5
PROFILED_STEPS = 200


@dataclass(frozen=True)
class Breakdown:
    """What the steps run on: one model, and one reset prefetcher behind its hooks."""

    model: DecodeModel
    hooks: ForwardHooks
    prefetcher: ResetPrefetcherByName
    base_seed: torch.Tensor
    """The floor's one seed."""


def breakdown_steps(parts: Breakdown) -> dict[str, Step]:
    """One eager step per entry of STEPS, each enqueueing the model's forward once.

    Every seed function is one Python call that returns a seed tensor, plus
    the piece of the hot path its step measures.
    """
    model, hooks, prefetcher, base = parts.model, parts.hooks, parts.prefetcher, parts.base_seed
    prefetch = prefetcher.prefetch
    if prefetch is None:
        raise RuntimeError("the prefetcher is disabled (no CUDA device): nothing to break down")
    info = ForwardInfo(runs_ssu=True)
    buffer = prefetch._buffer
    views = buffer.seeds
    is_capturing = prefetch_module._is_capturing
    stream_handle = prefetch_module._current_stream_handle
    device_index = prefetch._device_index
    next_seed = prefetcher.next_seed

    def floor_seed() -> torch.Tensor:
        return base

    def capture_checked_seed() -> torch.Tensor:
        is_capturing()
        return base

    def stream_checked_seed() -> torch.Tensor:
        stream_handle(device_index)  # type: ignore[misc]
        return base

    def prefetched(take: Callable[[], torch.Tensor | None]) -> Callable[[], torch.Tensor]:
        def seed() -> torch.Tensor:
            # The vLLM patch's call site checks for None too, and then draws inline as
            # stock; here every seed is prefetched, so a None means the breakdown is off.
            value = take()
            if value is None:
                raise RuntimeError("the prefetcher handed out no seed: the breakdown is off")
            return value

        return seed

    design_seed = prefetched(next_seed)

    def floor() -> None:
        model.forward(floor_seed)

    def floor_rng() -> None:
        stock_seed(base.device)
        model.forward(floor_seed)

    def capture_check() -> None:
        model.forward(capture_checked_seed)

    def stream_check() -> None:
        model.forward(stream_checked_seed)

    def draw() -> None:
        prefetch.draw(buffer.whole)
        model.forward(floor_seed)

    def begin_end() -> None:
        with hooks.forward(info):
            seeds = iter(views)

            def view_seed() -> torch.Tensor:
                return next(seeds)

            model.forward(view_seed)
            batch = prefetcher._batch
            assert batch is not None
            batch.consumed = len(views)

    def takes() -> None:
        batch = SeedBatch(prefetch._hand_back, views, device_index, len(views), None)
        model.forward(batch.take)  # type: ignore[arg-type]

    def design() -> None:
        with hooks.forward(info):
            model.forward(design_seed)

    steps = {
        "floor": floor,
        "floor_rng": floor_rng,
        "capture_check": capture_check,
        "stream_check": stream_check,
        "draw": draw,
        "begin_end": begin_end,
        "takes": takes,
        "design": design,
    }
    assert list(steps) == [name for name, _ in STEPS]
    return steps


def measure(
    steps: dict[str, Step],
    *,
    rounds: int,
    seed: int,
    timer: Callable[[Step, int], float] = host_us_per_step,
) -> dict[str, list[float]]:
    """`rounds` host-time samples per step, in shuffled interleaved rounds."""
    with gc_paused():
        return interleaved(
            steps,
            rounds=rounds,
            burst=1,
            timer=timer,
            rng=seeded_rng(seed, "host-breakdown"),
            warmup=WARMUP,
        )


def table(samples: dict[str, list[float]], resamples: int = RESAMPLES) -> list[str]:
    """The markdown table of the samples: medians, 95% intervals, IQR, p10, over the floor."""
    boot = bootstrap_medians(
        samples, rng=seeded_rng(BOOTSTRAP_SEED, "host-breakdown"), resamples=resamples
    )
    lines = [
        "| step | median µs [95% CI] | IQR | p10 µs | over floor µs [95% CI] | ÷ floor-rng |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    floor = sorted(samples["floor"])
    floor_median = quantile(floor, 0.5)
    floor_rng_median = quantile(sorted(samples["floor_rng"]), 0.5)
    for name, label in STEPS:
        ordered = sorted(samples[name])
        median = quantile(ordered, 0.5)
        ci = interval_of([boot[name]], lambda value: value)
        assert ci is not None
        iqr = quantile(ordered, 0.75) - quantile(ordered, 0.25)
        over = interval_of([boot[name], boot["floor"]], lambda value, base: value - base)
        assert over is not None
        over_text = (
            "0"
            if name == "floor"
            else f"{median - floor_median:+.1f} [{over[0]:+.1f}, {over[1]:+.1f}]"
        )
        lines.append(
            f"| {label} | {median:.1f} [{ci[0]:.1f}, {ci[1]:.1f}] | {iqr:.1f} | "
            f"{quantile(ordered, 0.1):.1f} | {over_text} | {median / floor_rng_median:.3f} |"
        )
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.host_breakdown",
        description="Where the reset design's eager host time per step goes.",
    )
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved rounds")
    parser.add_argument("--layers", type=int, default=40, help="Mamba-2 layers per step")
    parser.add_argument("--batch-size", type=int, default=1, help="decode batch size")
    parser.add_argument("--drawer", default="triton", help="bench.drawers.DRAWERS key")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffled round order")
    parser.add_argument("--profile", action="store_true", help="also cProfile floor and design")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        target = flashinfer_target()
    except BenchUnavailable as exc:
        print(f"host_breakdown: {exc}", file=sys.stderr)
        return 2
    model = DecodeModel(
        MixerShape(),
        num_layers=args.layers,
        batch_size=args.batch_size,
        gemms=False,
        device=target.device,
        ssu=target.ssu,
    )
    hooks = ForwardHooks()
    prefetcher = ResetPrefetcherByName(args.layers, target.device, drawer=args.drawer)
    hooks.register(prefetcher)
    assert prefetcher.prefetch is not None  # flashinfer_target found a CUDA device
    base = torch.zeros(1, dtype=torch.int64, device=target.device)
    steps = breakdown_steps(Breakdown(model, hooks, prefetcher, base))
    samples = measure(steps, rounds=args.rounds, seed=args.seed)
    command = "python -m bench.host_breakdown " + " ".join(argv or sys.argv[1:])
    lines = [
        f"# Eager host time of one step, piece by piece: {target.gpu}",
        "",
        f"Command: `{command.strip()}`",
        "",
        f"- {target.platform}",
        f"- {args.layers} layers, BS {args.batch_size}, no GEMMs; reset with drawer {args.drawer}",
        f"- host µs to enqueue one eager step onto an idle GPU; {args.rounds} interleaved "
        f"rounds, order shuffled per round (seed {args.seed}); 95% CIs: percentile "
        f"bootstrap, {RESAMPLES} resamples of the rounds, paired (seed {BOOTSTRAP_SEED})",
        "",
        *table(samples),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.profile:
        for name in ("floor", "design"):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(PROFILED_STEPS):
                steps[name]()
                torch.cuda.synchronize()
            profile.disable()
            print(f"===== {name}: cProfile, {PROFILED_STEPS} steps")
            pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
