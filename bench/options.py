"""The bench's command-line options and the settings they make."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pytest

from .target import TARGETS

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "results"


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def batch_sizes(text: str) -> tuple[int, ...]:
    """'1,2,4,8' -> (1, 2, 4, 8): positive, distinct, in the order given."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("no batch size given")
    sizes = tuple(positive_int(part) for part in parts)
    if len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"batch sizes repeat: {text!r}")
    return sizes


@dataclass(frozen=True)
class BenchOptions:
    """What a bench run measures, and where it writes its summary.

    layers: Mamba-2 layers per decode step, i.e. SSU calls and seeds per forward.
    batch_sizes: decode batch sizes; each gets its own model and graphs.
    gemms: add each layer's in_proj and out_proj GEMMs, so the saving can be
        read as a share of a fuller step.
    rounds: interleaved timing rounds, and pytest-benchmark rounds per test.
    seed: seeds the shuffled order of every interleaved round (step_timing.py);
        the summary records it.
    out_dir: where the summary's .json and .md go.
    ssu: the SSU kernel the model calls, a key of target.TARGETS.
    """

    layers: int = 40
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    gemms: bool = False
    rounds: int = 50
    seed: int = 0
    out_dir: Path = DEFAULT_OUT_DIR
    ssu: str = "flashinfer"

    @classmethod
    def from_config(cls, config: pytest.Config) -> BenchOptions:
        return cls(
            layers=config.getoption("bench_layers"),
            batch_sizes=config.getoption("bench_batch_sizes"),
            gemms=config.getoption("bench_gemms"),
            rounds=config.getoption("bench_rounds"),
            seed=config.getoption("bench_seed"),
            out_dir=Path(config.getoption("bench_out")),
            ssu=config.getoption("bench_ssu"),
        )

    def describe(self) -> str:
        gemms = "with in_proj/out_proj GEMMs" if self.gemms else "no GEMMs"
        sizes = ",".join(map(str, self.batch_sizes))
        return (
            f"{self.ssu} SSU, {self.layers} layers, {gemms}, BS {sizes}, "
            f"{self.rounds} interleaved rounds"
        )

    @property
    def tag(self) -> str:
        """What the summary files' names add: '-triton' for the Triton SSU, '-gemms'."""
        parts = ([] if self.ssu == BenchOptions.ssu else [self.ssu]) + (
            ["gemms"] if self.gemms else []
        )
        return "-".join(parts)


def add_options(parser: pytest.Parser) -> None:
    defaults = BenchOptions()
    group = parser.getgroup("bench", "SSU seed step-time benchmark (bench/)")
    group.addoption(
        "--bench-layers",
        type=positive_int,
        default=defaults.layers,
        help=f"Mamba-2 layers (SSU calls) per decode step (default {defaults.layers})",
    )
    group.addoption(
        "--bench-batch-sizes",
        type=batch_sizes,
        default=defaults.batch_sizes,
        help="comma-separated decode batch sizes (default 1,2,4,8)",
    )
    group.addoption(
        "--bench-gemms",
        action="store_true",
        default=defaults.gemms,
        help="add per-layer in_proj/out_proj GEMMs like the model's (summary files get '-gemms')",
    )
    group.addoption(
        "--bench-rounds",
        type=positive_int,
        default=defaults.rounds,
        help=f"interleaved timing rounds and pytest-benchmark rounds (default {defaults.rounds})",
    )
    group.addoption(
        "--bench-seed",
        type=int,
        default=defaults.seed,
        help="seed of the shuffled variant order in each interleaved round "
        f"(default {defaults.seed}; recorded in the summary)",
    )
    group.addoption(
        "--bench-out",
        default=str(defaults.out_dir),
        help="directory for <gpu>-<yyyymmdd>.summary.json and .md (default bench/results)",
    )
    group.addoption(
        "--bench-ssu",
        choices=tuple(TARGETS),
        default=defaults.ssu,
        help=f"the SSU kernel: FlashInfer's or vLLM's Triton SSU, which needs Blackwell and "
        f"the patched vLLM (summary files get '-triton'; default {defaults.ssu})",
    )
