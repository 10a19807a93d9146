"""The paired A/A and A/B pieces on CPU, on fixtures whose answers are known: the ABBA
schedule, the /metrics ITL delta, the whole-core split of a fake sysfs tree, and the
statistics (bootstrap, t interval, offsets, the A/A decision)."""

from __future__ import annotations

import math
import os
import random
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from . import cores, metrics, pairing
from . import paired_stats as ps

# --- pairing


def test_schedule_is_abba_with_fresh_prompts_and_a_seed_per_pair() -> None:
    schedule = pairing.pairs(16, seed=3, vocab_size=1000, prompt_len=32)
    sent = list(pairing.requests(schedule))
    assert "".join(server for server, _ in sent) == "ABBA" * 8
    assert [p.order for p in schedule[:2]] == [("A", "B"), ("B", "A")]
    for first, second in zip(sent[0::2], sent[1::2], strict=True):
        assert first[1].index == second[1].index
        assert first[0] != second[0]
    assert len({p.prompt[0] for p in schedule}) == 16
    assert len({p.seed for p in schedule}) == 16
    assert all(len(p.prompt) == 32 and 4 <= min(p.prompt) <= max(p.prompt) < 1000 for p in schedule)
    assert pairing.pairs(16, 3, 1000, 32) == schedule
    assert pairing.pairs(16, 4, 1000, 32) != schedule


def test_schedule_refuses_more_pairs_than_first_tokens() -> None:
    assert len({p.prompt[0] for p in pairing.pairs(6, 0, vocab_size=10, prompt_len=3)}) == 6
    with pytest.raises(pairing.TooManyPairs):
        pairing.pairs(7, 0, vocab_size=10, prompt_len=3)


def test_core_sets_swap_between_runs() -> None:
    sets = [[0, 4], [1, 5]]
    assert pairing.assign(0, sets) == {"A": [0, 4], "B": [1, 5]}
    assert pairing.assign(1, sets) == {"A": [1, 5], "B": [0, 4]}
    assert [pairing.core_set_of(r, "A") for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(pairing.ScheduleError):
        pairing.core_set_of(0, "C")


# --- metrics

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} {m_count}
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} {m_count}
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} {m_count}
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} {m_sum}
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="o,\\"x\\""} 4.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="o,\\"x\\""} 4.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="o,\\"x\\""} 2.0
# HELP vllm:inter_token_latency_seconds_created Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds_created gauge
vllm:inter_token_latency_seconds_created{engine="0",model_name="m"} 1.796686818261636e+09
"""


def _metrics(m_count: float, m_sum: float) -> str:
    return METRICS.replace("{m_count}", repr(m_count)).replace("{m_sum}", repr(m_sum))


def test_itl_totals_and_delta() -> None:
    before, after = _metrics(10.0, 0.2), _metrics(58.0, 1.16)
    assert metrics.totals(before, model_name="m") == (0.2, 10.0)
    assert metrics.totals(before, model_name='o,"x"') == (2.0, 4.0)
    assert metrics.totals(before) == (2.2, 14.0)
    d_sum, d_count = metrics.itl_delta(before, after, model_name="m")
    assert d_count == 48 and d_sum == pytest.approx(0.96)
    assert metrics.mean_itl(before, after, "m") == pytest.approx(0.02)


def test_itl_delta_refusals() -> None:
    text = _metrics(10.0, 0.2)
    with pytest.raises(metrics.EmptyDelta):
        metrics.itl_delta(text, text)
    with pytest.raises(metrics.NegativeDelta):
        metrics.itl_delta(text, _metrics(3.0, 0.05), "m")
    with pytest.raises(metrics.MissingMetric):
        metrics.totals(text, model_name="absent")
    with pytest.raises(metrics.MetricsError):
        list(metrics.samples("vllm:x{a=unquoted} 1\n"))


# --- cores


def _sysfs(root: Path, siblings: bool) -> Path:
    """8 CPUs on one package, 4 cores x 2 threads (core k: CPUs k and k + 4), one offline."""
    for cpu in range(8):
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_id").write_text(f"{cpu % 4}\n")
        (topology / "physical_package_id").write_text("0\n")
        if siblings:
            (topology / "thread_siblings_list").write_text(f"{cpu % 4},{cpu % 4 + 4}\n")
    (root / "cpu8").mkdir()
    (root / "cpufreq").mkdir()
    return root


@pytest.mark.parametrize("siblings", [True, False])
def test_whole_core_sets(tmp_path: Path, siblings: bool) -> None:
    root = _sysfs(tmp_path, siblings)
    everything = range(9)
    assert cores.physical_cores(root, everything) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert cores.core_sets(3, 1, root, everything) == [[0, 4], [1, 5], [2, 6]]
    assert cores.core_sets(2, 2, root, everything) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    with pytest.raises(cores.NotEnoughCores):
        cores.core_sets(3, 2, root, everything)
    # CPU 7 not allowed: core 3 is no longer whole
    assert cores.core_sets(3, 1, root, range(7)) == [[0, 4], [1, 5], [2, 6]]
    with pytest.raises(cores.NotEnoughCores):
        cores.core_sets(2, 2, root, range(7))


def test_no_topology(tmp_path: Path) -> None:
    with pytest.raises(cores.NoTopology):
        cores.physical_cores(tmp_path, range(8))


def test_pinning_forms() -> None:
    assert cores.parse_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cores.cpu_list([5, 1, 4, 0]) == "0,1,4,5"
    assert cores.taskset_argv([4, 0]) == ["taskset", "-c", "0,4"]
    cpu = min(os.sched_getaffinity(0))
    # the child's own child reports the pinning it inherited
    grandchild = "import os; print(sorted(os.sched_getaffinity(0)))"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"
    argv = [sys.executable, "-c", code]
    out = subprocess.run(argv, preexec_fn=cores.preexec([cpu]), capture_output=True, text=True)
    assert out.stdout.strip() == f"[{cpu}]"
    if shutil.which("taskset"):
        out = subprocess.run(cores.taskset_argv([cpu]) + argv, capture_output=True, text=True)
        assert out.stdout.strip() == f"[{cpu}]"


# --- statistics


def _lognormal(rng: random.Random, n: int, sigma: float) -> list[float]:
    return [0.02 * math.exp(rng.gauss(0, sigma)) for _ in range(n)]


def test_exact_ratio_gives_its_log_and_a_zero_width_interval() -> None:
    a = _lognormal(random.Random(1), 50, 0.3)
    ci = ps.block_bootstrap(ps.log_ratios(a, [x * 1.02 for x in a]))
    assert ci.mean == pytest.approx(math.log(1.02), abs=1e-12)
    assert ci.width < 1e-12 and ci.contains(ci.mean)
    assert ci.percent()[0] == pytest.approx(2.0, abs=1e-9)


def test_log_ratio_refusals() -> None:
    with pytest.raises(ps.NotPaired):
        ps.log_ratios([1.0, 2.0], [1.0])
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ps.NotPositive):
            ps.log_ratios([1.0, 1.0], [1.0, bad])
    with pytest.raises(ps.TooFew):
        ps.block_bootstrap([0.1])
    for block in (0, 11):
        with pytest.raises(ps.BadArgument):
            ps.block_bootstrap([0.0] * 10, block=block)


def test_bootstrap_is_reproducible_and_covers_the_offset() -> None:
    truth, hits = math.log(1.01), 0
    for seed in range(100):
        rng = random.Random(seed)
        a = _lognormal(rng, 64, 0.05)
        b = [x * 1.01 * math.exp(rng.gauss(0, 0.05)) for x in a]
        ci = ps.block_bootstrap(ps.log_ratios(a, b), resamples=500)
        hits += ci.contains(truth)
    assert 0.85 <= hits / 100 <= 0.99
    d = ps.log_ratios(a, b)
    assert ps.block_bootstrap(d, seed=5) == ps.block_bootstrap(d, seed=5)
    assert ps.block_bootstrap(d, seed=5) != ps.block_bootstrap(d, seed=6)


def test_blocks_widen_the_interval_for_drift() -> None:
    rng, x, d = random.Random(7), 0.0, []
    for _ in range(256):
        x = 0.9 * x + rng.gauss(0, 0.01)
        d.append(x)
    assert ps.block_bootstrap(d, block=16).width > 1.5 * ps.block_bootstrap(d, block=1).width
    assert ps.default_block(256) == 6 and ps.default_block(1) == 1


@pytest.mark.parametrize(
    ("p", "df", "t"),
    [
        (0.975, 1, 12.706),
        (0.975, 2, 4.303),
        (0.975, 4, 2.776),
        (0.975, 10, 2.228),
        (0.975, 30, 2.042),
        (0.95, 5, 2.015),
        (0.995, 3, 5.841),
        (0.025, 4, -2.776),
        (0.975, 10**6, 1.960),
    ],
)
def test_t_quantile(p: float, df: int, t: float) -> None:
    assert ps.t_quantile(p, df) == pytest.approx(t, abs=5e-4)
    assert ps.t_cdf(ps.t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_across_runs_interval_and_coverage() -> None:
    ci = ps.across_runs([0.01, 0.02, 0.03])
    assert ci.mean == pytest.approx(0.02)
    assert ci.high - ci.mean == pytest.approx(4.302653 * 0.01 / math.sqrt(3), rel=1e-6)
    with pytest.raises(ps.TooFew):
        ps.across_runs([0.01])
    # 3 runs each: a normal quantile (1.96) would cover about 0.81 of the time
    truth, hits = math.log(1.02), 0
    for seed in range(200):
        rng = random.Random(seed)
        runs = []
        for _ in range(3):
            process = rng.gauss(0, 0.01)  # each run's servers differ by themselves
            a = _lognormal(rng, 32, 0.1)
            b = [x * 1.02 * math.exp(process + rng.gauss(0, 0.02)) for x in a]
            runs.append(statistics.fmean(ps.log_ratios(a, b)))
        hits += ps.across_runs(runs).contains(truth)
    assert 0.90 <= hits / 200 <= 0.99


def test_offsets_and_core_sets() -> None:
    a = _lognormal(random.Random(2), 20, 0.2)
    off = ps.offsets(a, [x * 1.02 for x in a])
    assert off["B"] > 0 > off["A"]
    assert (1 + off["B"] / 100) / (1 + off["A"] / 100) == pytest.approx(1.02)
    server, core = ps.by_core_set([0.015, 0.005, 0.015, 0.005])
    assert (server, core) == (pytest.approx(0.01), pytest.approx(0.005))
    with pytest.raises(ps.TooFew):
        ps.by_core_set([0.01])


def test_aa_decision_both_ways() -> None:
    limit = math.log(1.03) / 2
    go = ps.aa_decision(ps.Interval(0.001, -0.003, 0.005), 0.03)
    assert go.go and go.width == pytest.approx(0.008) and go.limit == pytest.approx(limit)
    assert not ps.aa_decision(ps.Interval(0.0, -0.01, 0.01), 0.03).go
    assert not ps.aa_decision(ps.Interval(0.004, 0.002, 0.006), 0.03).go
    assert not ps.aa_decision(ps.Interval(0.0, -limit / 2, limit / 2), 0.03).go
    with pytest.raises(ps.BadArgument):
        ps.aa_decision(ps.Interval(0.0, -0.001, 0.001), 0.0)
