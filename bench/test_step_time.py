"""Step time of one variant, in one mode, at one batch size: the pytest-benchmark tests.

What pytest-benchmark times here is one step followed by a synchronize,
`--bench-rounds` times: the latency of a step that is waited for, which
pytest-benchmark's wall clock can see.  It carries the fixed cost of a
synchronize and times each variant alone, so it is the figure for
`--benchmark-compare` between runs of the same variant.  The comparison
between variants is the summary's: interleaved CUDA-event timing of
back-to-back steps (step_session.py), whose figures (median, its 95% interval,
IQR, ratios, ties, host time, round-order seed) also go into each test's
`extra_info` (and so into `--benchmark-json`).
"""

from __future__ import annotations

import pytest
import torch

from .step_session import BenchSession, Case
from .summary import FAILED, SKIPPED

pytest.importorskip("pytest_benchmark", reason="the bench needs pytest-benchmark")

WARMUP_ROUNDS = 2


def test_step_time(benchmark, bench_session: BenchSession, case: Case) -> None:
    run = bench_session.batch(case.batch_size)
    cell = run.cells[case.variant, case.mode]
    if cell.status == SKIPPED:
        pytest.skip(f"{case.variant}: {cell.reason}")
    if cell.status == FAILED:
        pytest.fail(f"{case.variant}: {cell.reason}", pytrace=False)
    row = run.row(case.variant, case.mode)
    figures = row.as_json()
    benchmark.extra_info.update(
        interleaved_median_us=row.median_us,
        **{
            key: figures[key]
            for key in (
                "median_ci95_us",
                "iqr_us",
                "ratio_to_stock",
                "ratio_ci95",
                "recovered",
                "recovered_ci95",
                "ties",
                "host_us",
                "host_ci95_us",
                "host_iqr_us",
            )
        },
        layers=bench_session.options.layers,
        gemms=bench_session.options.gemms,
        order_seed=bench_session.options.seed,
    )
    step = run.step(case.variant, case.mode)

    def step_and_wait() -> None:
        step()
        torch.cuda.synchronize()

    benchmark.pedantic(
        step_and_wait, rounds=bench_session.options.rounds, warmup_rounds=WARMUP_ROUNDS
    )
