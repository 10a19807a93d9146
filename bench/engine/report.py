"""Markdown and compact JSON from an engine run's identity.json and timing.json.

    python -m bench.engine.report --identity OUT/engine/identity.json [more...] \\
        --timing OUT/engine/timing.json [more...] --prefix bench/results/engine-<gpu>-<date>

writes <prefix>.md, <prefix>.identity.json (each record reduced to what the
comparison needs: each TP rank's fingerprints cut to 16 hex digits, tokens and
logprobs as sha256; in compact.py's committed form: each state chain once, per-slot
sums only where a cell differs) and <prefix>.timing.json.  Several identity files (runs of the same
code) are merged in order; a later record of a cell is kept beside the first,
as another run.  Several timing files (e.g. one device call per runner) are
merged by runner; a runner's rounds in several files are put together, each
file's engines numbered after the earlier files' (concatenate).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import autotune
from . import compact as compact_module
from . import timing as timing_module
from .arms import (
    IDENTITY_ARMS,
    NAMED_ONLY_ARMS,
    PLAIN,
    SERVING_BY_NAME,
    SERVINGS,
    STOCK,
    TIMING_ARMS,
    GraphMode,
    Runner,
)
from .compact import first_difference, rank_states


def serving_evidence(record: dict[str, Any]) -> str:
    """What a record shows its serving options did: prefix-cache hits, and MTP
    drafts and accepted tokens (from vLLM's counters); empty for a plain run."""
    parts = []
    cached = [n for n in record.get("cached_tokens", {}).values() if n]
    if cached:
        parts.append(f"{len(cached)} prefix-cache hits ({sum(cached)} tokens)")
    counters = record.get("counters", {})
    if counters.get("vllm:spec_decode_num_drafts"):
        parts.append(
            f"{counters['vllm:spec_decode_num_drafts']:.0f} drafts, "
            f"{counters.get('vllm:spec_decode_num_accepted_tokens', 0):.0f} of "
            f"{counters.get('vllm:spec_decode_num_draft_tokens', 0):.0f} draft tokens accepted"
        )
    return "; ".join(parts)


def merge_identity(runs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """cell -> the compact record of each run that has it, in run order (runs of
    any form compact.py reads: a run's identity.json, or a committed file)."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for cell, records in compact_module.unpacked(run)["records"].items():
            merged.setdefault(cell, []).extend(records)
    return merged


def _kept_at(a: dict[str, Any], b: dict[str, Any], key: str, step: int) -> tuple | None:
    """Both records' `key` entries for `step`, where both kept that step."""
    x, y = a.get(key, []), b.get(key, [])
    return None if step >= min(len(x), len(y)) else (x[step], y[step])


def first_layer(a: dict[str, Any], b: dict[str, Any], step: int) -> int | None:
    """The first Mamba-2 layer whose state differs at `step`, where both
    records kept that step's per-layer sums."""
    kept = _kept_at(a, b, "layer_sums", step)
    if kept is None:
        return None
    return next((i for i, (u, v) in enumerate(zip(*kept, strict=False)) if u != v), None)


def slots_differing(a: dict[str, Any], b: dict[str, Any], step: int) -> list[int] | None:
    """The cache slots whose state differs at `step`, where both records kept them."""
    kept = _kept_at(a, b, "slot_sums", step)
    if kept is None:
        return None
    return [i for i, (u, v) in enumerate(zip(*kept, strict=False)) if u != v]


def state_difference(stock: dict[str, Any], other: dict[str, Any]) -> str | None:
    """What differs first between two ranks' states (rank_states), or None."""
    step = first_difference(stock["fingerprints"], other["fingerprints"])
    if step is not None:
        layer = first_layer(stock, other, step)
        slots = slots_differing(stock, other, step)
        where = [] if layer is None else [f"layer {layer} first"]
        if slots is not None:
            where.append(f"slots {','.join(map(str, slots))}")
        return f"state differs from step {step}" + (f" ({'; '.join(where)})" if where else "")
    return "state differ" if stock["state_sha256"] != other["state_sha256"] else None


def compare(stock: dict[str, Any], other: dict[str, Any]) -> str:
    """'identical', or what differs first: on each TP rank whose state
    differs ("rank 1: ..." where there are several), else tokens or logprobs."""
    if "error" in stock or "error" in other:
        return "did not run"
    mine, theirs = rank_states(stock), rank_states(other)
    ranks = [state["rank"] for state in mine]
    if [state["rank"] for state in theirs] != ranks:
        return f"ranks {[state['rank'] for state in theirs]} against stock's {ranks}"
    differ = []
    for a, b in zip(mine, theirs, strict=True):
        verdict = state_difference(a, b)
        if verdict is not None:
            differ.append(verdict if len(mine) == 1 else f"rank {a['rank']}: {verdict}")
    if differ:
        return "; ".join(differ)
    for name in ("tokens_sha256", "logprobs_sha256"):
        if stock[name] != other[name]:
            return f"{name.removesuffix('_sha256')} differ"
    return "identical"


def identity_markdown(merged: dict[str, list[dict[str, Any]]]) -> str:
    arms = [arm.name for arm in IDENTITY_ARMS if arm is not STOCK]
    # Arms in the records that IDENTITY_ARMS lacks (an older run's diagnostic arm).
    arms += sorted({cell.split("/")[0] for cell in merged} - {STOCK.name, *arms})
    lines = [
        "| runner | mode | stock (steps / decode steps) | " + " | ".join(arms) + " |",
        "| --- | --- | --- |" + " --- |" * len(arms),
    ]
    # Each serving configuration's rows (PLAIN's cells have no suffix: identity.key).
    suffixes = [""] + [
        f"/{serving.name}"
        for serving in SERVINGS
        if serving != PLAIN and any(cell.endswith(f"/{serving.name}") for cell in merged)
    ]
    for suffix in suffixes:
        for runner in Runner:
            for mode in GraphMode:
                cell = f"{runner.value}/{mode.value}{suffix}"
                if suffix and f"{STOCK.name}/{cell}" not in merged:
                    continue  # a serving's rows: only the cells it ran
                lines.append(_identity_row(merged, arms, runner, mode, suffix))
    return "\n".join(lines) + "\n"


def _identity_row(
    merged: dict[str, list[dict[str, Any]]],
    arms: list[str],
    runner: Runner,
    mode: GraphMode,
    suffix: str,
) -> str:
    cell = f"{runner.value}/{mode.value}{suffix}"
    stock_runs = merged.get(f"{STOCK.name}/{cell}", [])
    if not stock_runs or "error" in stock_runs[0]:
        head = "missing"
    else:
        head = f"{stock_runs[0]['steps']} / {stock_runs[0]['decode_steps']}"
        if evidence := serving_evidence(stock_runs[0]):
            head += f"; {evidence}"
    cells = []
    for arm in arms:
        runs = merged.get(f"{arm}/{cell}", [])
        if not stock_runs or not runs:
            cells.append("not run")
            continue
        cells.append("; ".join(compare(stock_runs[0], run) for run in runs))
    if len(stock_runs) > 1:
        head += (
            " (stock's later runs: "
            + "; ".join(compare(stock_runs[0], run) for run in stock_runs[1:])
            + ")"
        )
    serving = f" / {suffix[1:]}" if suffix else ""
    return f"| {runner.value} | {mode.value}{serving} | {head} | " + " | ".join(cells) + " |"


def _predicted(predicted: dict[tuple[str, int], float], arm: str, bs: str) -> str:
    value = predicted.get((arm, int(bs)))
    return "-" if value is None or arm == STOCK.name else f"{value:.0f}"


def _interval(values: list[float] | None) -> str:
    return "n/a" if not values else f"[{values[0]:.0f}, {values[1]:.0f}]"


def _share(row: dict[str, Any], name: str = "recovered") -> str:
    """An arm's recovered share of the draws' cost, where its floor arm ran
    (name: "recovered" against the floor, "recovered_rng" against floor-rng)."""
    share = row.get(name)
    if share is None:
        return "-"
    interval = row.get(f"{name}_ci95")
    return f"{share:.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def predictions(summary: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """(arm, batch size) -> µs per step the microbenchmark says the arm saves
    against stock under a FULL graph: its variant's median below stock's."""
    medians = {
        (row["variant"], row["batch_size"]): row["median_us"]
        for row in summary
        if row.get("mode") == "graph" and row.get("median_us") is not None
    }
    return {
        (arm.name, bs): medians["stock", bs] - medians[arm.microbench, bs]
        for arm in (*TIMING_ARMS, *NAMED_ONLY_ARMS)
        for (variant, bs) in medians
        if variant == "stock" and (arm.microbench, bs) in medians
    }


def timing_markdown(
    timing: dict[str, Any], predicted: dict[tuple[str, int], float] | None = None
) -> str:
    predicted = predicted or {}
    out = []
    for runner, result in timing["runners"].items():
        summary = result["summary"]
        figures = summary if "step" in summary else {"step": summary}
        # The GPU-time figures first (timing.py): the host's carry ms of noise.
        order = sorted(figures, key=lambda name: (name not in GPU_FIGURES, name))
        for figure, per_bs in ((name, figures[name]) for name in order):
            if not any(per_bs.values()):
                continue  # a figure no sample has (replay_s before it was measured)
            out.append(f"\n**{runner}, {figure}** (µs)\n")
            out.append(
                "| BS | arm | n | median [95% CI] | IQR | saved vs stock [95% CI] | ratio "
                "| recovered [95% CI] | recovered vs floor-rng [95% CI] "
                "| microbench predicts saved |"
            )
            out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for bs, rows in per_bs.items():
                for arm, row in rows.items():
                    saved = (
                        f"{row['saved_us']:.0f} {_interval(row.get('saved_ci95_us'))}"
                        if "saved_us" in row
                        else "-"
                    )
                    iqr = row.get("iqr_us")
                    out.append(
                        f"| {bs} | {arm} | {row['samples']} | {row['median_us']:.0f} "
                        f"{_interval(row.get('median_ci95_us'))} | "
                        f"{'n/a' if not iqr else f'{iqr[1] - iqr[0]:.0f}'} | {saved} | "
                        f"{row.get('ratio_to_stock', 1.0):.3f} | {_share(row)} | "
                        f"{_share(row, 'recovered_rng')} | {_predicted(predicted, arm, bs)} |"
                    )
    return "\n".join(out) + "\n"


GPU_FIGURES = ("forward-gpu", "replay")
"""timing.FIGURES' GPU-time figures."""


def mixed_markdown(timing: dict[str, Any]) -> str:
    """Per runner whose samples timed forward_gpu_s (mixed steps): how many
    forwards it holds and how many it left out (a segment uncovered by its
    spin), and the medians of the host's time in a spun forward, which its
    spins must outlast, and of the steps' piecewise replays and prefill chunks."""
    out = []
    for runner, result in timing["runners"].items():
        samples = [
            sample
            for per_arm in result.get("samples", {}).values()
            for rows in per_arm.values()
            for sample in rows
            if "gpu_forwards" in sample
        ]
        if not samples:
            continue
        timed = sum(sample["gpu_forwards"] for sample in samples)
        left_out = sum(sample["gpu_uncovered"] for sample in samples)
        host_ms = statistics.median(sample["spun_host_s"] for sample in samples) * 1e3
        replays = statistics.median(sample["replays_per_step"] for sample in samples)
        chunk = statistics.median(sample["prefill_tokens"] for sample in samples)
        out.append(
            f"- {runner}: forward-gpu over {timed} forwards, {left_out} left out (the "
            f"host was still enqueuing a segment when its spin ended); {host_ms:.1f} ms of host "
            f"time in a spun forward, {replays:g} piecewise replays and a {chunk:g}-token "
            "prefill chunk per step (medians over samples)."
        )
    return "\n".join(out) + "\n" if out else ""


def engine_markdown(timing: dict[str, Any]) -> str:
    """Per runner that sampled an arm from more than one engine process
    (timing.Plan.rounds_per_engine): the engines per arm and rounds each, and
    per batch size and arm the medians of each engine's samples of the figure
    that resolves µs (forward-gpu for mixed steps, else replay) and their
    spread (max - min). Empty with one engine per arm."""
    figure = "forward-gpu" if _steps_of(timing)[1] == "mixed" else "replay"
    out = []
    for runner, result in timing["runners"].items():
        per_bs = result.get("engines", {}).get(figure)
        if not per_bs:
            continue
        entries = [entry for per_arm in per_bs.values() for entry in per_arm.values()]
        engines = max(len(entry["rounds"]) for entry in entries)
        rounds = sorted({n for entry in entries for n in entry["rounds"]})
        each = f"{rounds[0]}" if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
        out.append(
            f"\n**{runner}, {figure}**: {engines} engines per arm, {each} "
            f"round{'' if rounds == [1] else 's'} each (µs)\n"
        )
        out.append("| BS | arm | engines | each engine's median | spread (max - min) |")
        out.append("| --- | --- | --- | --- | --- |")
        for bs, per_arm in per_bs.items():
            for arm, entry in per_arm.items():
                medians = ", ".join(f"{m:.1f}" for m in entry["median_us"])
                out.append(
                    f"| {bs} | {arm} | {len(entry['rounds'])} | {medians} "
                    f"| {entry['spread_us']:.1f} |"
                )
    return "\n".join(out) + "\n" if out else ""


def _median_us(values: list[float]) -> str:
    return "-" if not values else f"{statistics.median(values) * 1e6:.1f}"


def rank_markdown(timing: dict[str, Any]) -> str:
    """Per runner whose engines ran over several TP ranks, per batch size and
    arm: each rank's median replay µs (over the samples' per-rank medians) and
    the spread between ranks (the median of the samples' replay_spread_s).
    Empty at TP 1."""
    out = []
    for runner, result in timing["runners"].items():
        rows, ranks = [], 0
        for bs, per_arm in result.get("samples", {}).items():
            for arm, samples in per_arm.items():
                per_sample = [s["rank_replay_s"] for s in samples if s.get("rank_replay_s")]
                if not per_sample or len(per_sample[0]) < 2:
                    continue
                ranks = len(per_sample[0])
                medians = [
                    _median_us([r[i] for r in per_sample if r[i] is not None]) for i in range(ranks)
                ]
                spread = [
                    s["replay_spread_s"] for s in samples if s.get("replay_spread_s") is not None
                ]
                rows.append(
                    f"| {bs} | {arm} | {len(per_sample)} | "
                    + " | ".join(medians)
                    + f" | {_median_us(spread)} |"
                )
        if rows:
            out.append(f"\n**{runner}, replay per TP rank** (µs, medians over samples)\n")
            out.append(
                "| BS | arm | n | "
                + " | ".join(f"rank {i}" for i in range(ranks))
                + " | spread (slowest - fastest rank) |"
            )
            out.append("| --- | --- | --- |" + " --- |" * (ranks + 1))
            out.extend(rows)
    return "\n".join(out) + "\n" if out else ""


KERNEL_NAME_CHARS = 70
"""Kernel names are C++ templates; the tables show their start."""
PROFILE_APART = 3
"""Kernels launched alike that the profile table names per arm: those most apart from stock."""
PROFILE_APART_US = 0.5
"""Below this difference per step (µs) a kernel launched alike is not named."""


def _kernel(name: str) -> str:
    short = name if len(name) <= KERNEL_NAME_CHARS else name[: KERNEL_NAME_CHARS - 1] + "…"
    return "`" + short.replace("|", "\\|") + "`"


def most_apart(
    kernels: dict[str, tuple[float, float]], base: dict[str, tuple[float, float]]
) -> str:
    """The kernels launched as often as in base whose time differs most from it
    (PROFILE_APART of them, each by PROFILE_APART_US or more; ties by name): name +µs."""
    apart = [
        (us - base[name][1], name)
        for name, (n, us) in sorted(kernels.items())
        if name in base and base[name][0] == n and abs(us - base[name][1]) >= PROFILE_APART_US
    ]
    shown = sorted(apart, key=lambda item: (-abs(item[0]), item[1]))[:PROFILE_APART]
    return "; ".join(f"{_kernel(name)} {d:+.1f}" for d, name in shown) or "none"


def launch_split(
    kernels: dict[str, tuple[float, float]], base: dict[str, tuple[float, float]]
) -> tuple[float, float]:
    """Device µs less base's (kernel name -> (launches, µs)), split in two: the kernels
    launched a different number of times than in base, and those launched alike."""
    split = {True: 0.0, False: 0.0}  # launched alike? -> µs less base's
    for name in kernels.keys() | base.keys():
        (mine, mine_us), (theirs, theirs_us) = kernels.get(name, (0, 0.0)), base.get(name, (0, 0.0))
        split[mine == theirs] += mine_us - theirs_us
    return split[False], split[True]


def profiled_step(timing: dict[str, Any]) -> str:
    """What one profiled step is: a mixed step, a decode step, or an MTP verify iteration."""
    serving, workload = _steps_of(timing)
    if workload == "decode" and SERVING_BY_NAME[serving].speculative_tokens:
        return f"{serving} verify iteration"
    return f"{workload} step"


def profile_markdown(timing: dict[str, Any]) -> str:
    """Per runner and batch size, each arm's GPU kernels per step of the
    workload (worker.py's profile): launches and device µs in all; its device µs
    less stock's, split between the kernels launched a different number of times
    than in stock (what its seed path changes) and those launched alike (what
    differs between engines of any code: their picks, their placement); which
    kernels those are, and of the ones launched alike, those most apart."""
    step = profiled_step(timing)
    out = []
    for runner, result in timing["runners"].items():
        profiles = result.get("profile") or {}
        stock = profiles.get(STOCK.name, {})
        for bs in sorted({bs for per_bs in profiles.values() for bs in per_bs}, key=int):
            out.append(f"\n**{runner}, BS {bs}: GPU kernels per {step}** (torch.profiler)\n")
            out.append(
                "| arm | launches | device µs | µs - stock's: kernels launched otherwise "
                "| µs - stock's: kernels launched alike "
                "| kernels launched other than in stock: the arm's launches (µs) vs stock's "
                "| launched alike, most apart from stock's: the arm's µs - stock's |"
            )
            out.append("| --- | ---: | ---: | ---: | ---: | --- | --- |")
            base = {name: (n, us) for name, n, us in stock.get(bs, {}).get("kernels", [])}
            for arm, per_bs in profiles.items():
                if bs not in per_bs:
                    continue
                if "error" in per_bs[bs]:
                    out.append(f"| {arm} | - | - | - | - | no profile: {per_bs[bs]['error']} | - |")
                    continue
                kernels = {name: (n, us) for name, n, us in per_bs[bs]["kernels"]}
                launches = sum(n for n, _ in kernels.values())
                device_us = sum(us for _, us in kernels.values())
                differ = []
                for name in sorted(kernels.keys() | base.keys()):
                    (mine, mine_us), (theirs, theirs_us) = (
                        kernels.get(name, (0, 0.0)),
                        base.get(name, (0, 0.0)),
                    )
                    if mine != theirs:
                        differ.append(
                            f"{_kernel(name)} {mine:g} ({mine_us:.1f} µs) vs "
                            f"{theirs:g} ({theirs_us:.1f} µs)"
                        )
                versus = arm != STOCK.name and base
                shown = ("; ".join(differ) or "none") if versus else "-"
                apart = most_apart(kernels, base) if versus else "-"
                split = (
                    "{:+.1f} | {:+.1f}".format(*launch_split(kernels, base)) if versus else "- | -"
                )
                out.append(
                    f"| {arm} | {launches:g} | {device_us:.1f} | {split} | {shown} | {apart} |"
                )
    return "\n".join(out) + "\n"


def steps_of_partial(name: str, runner: str) -> tuple[str, str]:
    """(serving, workload) of a partial file, from the tag timing.Plan.tag put
    in its name, timing-<runner><tag>-partial.json."""
    tags = {
        timing_module.Plan(serving=serving, workload=workload).tag: (serving, workload)
        for serving in SERVING_BY_NAME
        for workload in timing_module.WORKLOADS
    }
    prefix, suffix = f"timing-{runner}", "-partial.json"
    tag = name[len(prefix) : -len(suffix)]
    if not (name.startswith(prefix) and name.endswith(suffix)) or tag not in tags:
        raise SystemExit(f"{name} is not named {prefix}<tag>{suffix} with a tag timing.py writes")
    return tags[tag]


def from_partials(specs: Sequence[str]) -> dict[str, Any]:
    """timing.json's shape from RUNNER=PATH partial files (of one serving and
    workload, read from their names)."""
    parts: dict[str, list[dict[str, Any]]] = {}
    steps = set()
    for spec in specs:
        runner, sep, path = spec.partition("=")
        if not sep or runner not in {r.value for r in Runner}:
            raise SystemExit(f"--partial takes RUNNER=PATH with RUNNER v1 or v2, got {spec!r}")
        steps.add(steps_of_partial(Path(path).name, runner))
        samples = {int(bs): per_arm for bs, per_arm in _read(Path(path)).items()}
        parts.setdefault(runner, []).append(timing_module.runner_result(samples, runner))
    runners = {
        runner: {**concatenate(runner, results), "partial": True}
        for runner, results in parts.items()
    }
    if len(steps) > 1:
        raise SystemExit(f"--partial files of different steps {sorted(steps)}: report them apart")
    serving, workload = steps.pop() if steps else (PLAIN.name, "decode")
    return {"runners": runners, "partial": True, "serving": serving, "workload": workload}


def concatenate(runner: str, results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One runner's result from its results in several runs (e.g. one device
    call each) of the same arms and batch sizes: their rounds in run order, each
    run's engines numbered after the earlier runs' (each run's engines are
    processes of their own), summarized again (timing.runner_result); the
    engagement lines are the last run's, a profile the first run's that has one.
    One result is returned as it is."""
    if len(results) == 1:
        return results[0]
    samples: timing_module.Samples = {}
    engines = 0
    cells = None
    for result in results:
        if "samples" not in result:
            raise SystemExit(
                f"--timing: a run of {runner} without its samples cannot be put together "
                "with another's; report it alone"
            )
        runs = result["samples"]
        mine = {(bs, arm) for bs, per_arm in runs.items() for arm in per_arm}
        if cells is not None and mine != cells:
            raise SystemExit(
                f"--timing/--partial: runs of {runner} with different arms or batch sizes; "
                "report them apart"
            )
        cells = mine
        if len({len(rows) for per_arm in runs.values() for rows in per_arm.values()}) > 1:
            raise SystemExit(
                f"--timing/--partial: a run of {runner} whose arms have different numbers "
                "of rounds (an engine failed) cannot pair its rounds with another run's; "
                "report it alone"
            )
        count = 0
        for bs, per_arm in runs.items():
            for arm, rows in per_arm.items():
                for row in rows:
                    engine = int(row.get("engine", 0))
                    count = max(count, engine + 1)
                    kept = samples.setdefault(int(bs), {}).setdefault(arm, [])
                    kept.append({**row, "engine": engines + engine})
        engines += count
    merged = timing_module.runner_result(samples, runner)
    engagement = [result["engagement"] for result in results if "engagement" in result]
    profiles = [result["profile"] for result in results if result.get("profile")]
    return {
        **merged,
        **({"engagement": engagement[-1]} if engagement else {}),
        **({"profile": profiles[0]} if profiles else {}),
    }


def start_markdown(timing: dict[str, Any]) -> str:
    """Per runner, each arm's engines' start in seconds, read off their samples'
    start_s (samples before it was kept: none); "" where no sample has one."""
    out = []
    for runner, result in timing["runners"].items():
        starts: dict[str, dict[int, float]] = {}
        for per_arm in result.get("samples", {}).values():
            for arm, rows in per_arm.items():
                for row in rows:
                    if row.get("start_s") is not None:
                        starts.setdefault(arm, {})[int(row.get("engine", 0))] = row["start_s"]
        if not starts:
            continue
        out.append(
            f"\n**{runner}**: each engine's `start` call (s), engines in order; the "
            "run's first engine starts alone, the others of a round side by side, so "
            "each figure holds the others' contention, and a first engine compiles where "
            "its arm's cache is new\n"
        )
        out.append("| arm | engines | start (s) |")
        out.append("| --- | --- | --- |")
        for arm in sorted(starts):
            each = [starts[arm][engine] for engine in sorted(starts[arm])]
            out.append(f"| {arm} | {len(each)} | {', '.join(f'{s:.1f}' for s in each)} |")
    return "\n".join(out) + "\n" if out else ""


def autotune_markdown(timing: dict[str, Any]) -> str:
    """Whether every engine ran the same Triton autotuning picks of the Mamba kernels
    and Inductor's (timing.run's "autotune", per run where runs were merged); "" for
    runs before they were kept."""
    runs = [timing, *timing.get("runs", [])]
    kept = [run["autotune"] for run in runs if "autotune" in run]
    if not kept:
        return ""
    ranks = [
        picks for part in kept for picks in timing_module.picks_per_rank(part["picks"]).values()
    ]
    picked = {
        (kernel, key) for picks in ranks for kernel, per_key in picks.items() for key in per_key
    }
    differing = {name: seen for part in kept for name, seen in part["differences"].items()}
    unread = [engine for part in kept for engine, p in part["picks"].items() if "error" in p]
    alike = {name for part in kept for name in part.get("inductor_alike", [])}
    pairs = len({autotune.pick_name(kernel, key) for kernel, key in picked} | alike)
    out = [
        f"\n{pairs} kernel and tuning-key pairs in {len(ranks)} engine ranks "
        + ("all picked alike.\n" if not differing else f"{len(differing)} picked otherwise:\n")
    ]
    if differing:
        out += ["| kernel[key] | pick | engines |", "| --- | --- | --- |"]
        for name, seen in sorted(differing.items()):
            for pick in sorted(set(seen.values())):
                which = sorted(engine for engine, p in seen.items() if p == pick)
                out.append(f"| {name} | {pick} | {', '.join(which)} |")
    if unread:
        out.append(f"\nPicks not read (the engine's reply failed): {', '.join(sorted(unread))}.")
    return "\n".join(out) + "\n"


def merge_timing(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One timing.json from runs at one TP size: each runner's results (a
    runner in several runs: their rounds together, concatenate), and each run's
    plan, GPUs and failed engines, under "runs"."""
    sizes = sorted({run.get("tp", 1) for run in runs})
    if len(sizes) > 1:
        raise SystemExit(f"--timing: the files are of TP sizes {sizes}; give one TP size's")
    steps = sorted({_steps_of(run) for run in runs})
    if len(steps) > 1:
        raise SystemExit(
            f"--timing: the files time different steps (serving, workload) {steps}; "
            "give one serving and workload's"
        )
    if len(runs) == 1:
        return runs[0]
    parts: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for runner, result in run["runners"].items():
            parts.setdefault(runner, []).append(result)
    runners = {runner: concatenate(runner, results) for runner, results in parts.items()}
    return {
        "runners": runners,
        "tp": sizes[0],
        "serving": steps[0][0],
        "workload": steps[0][1],
        "runs": [{k: v for k, v in run.items() if k != "runners"} for run in runs],
    }


def _steps_of(timing: dict[str, Any]) -> tuple[str, str]:
    """(serving, workload) of a timing.json (runs before them: plain decode steps)."""
    return timing.get("serving", PLAIN.name), timing.get("workload", "decode")


def steps_heading(timing: dict[str, Any]) -> str:
    """The timing section's heading: which steps it times."""
    serving, workload = _steps_of(timing)
    k = SERVING_BY_NAME[serving].speculative_tokens
    if workload == "mixed":
        return (
            "## Mixed step time\n\nEach step prefills a chunk beside the decodes, on "
            "the piecewise graphs FULL_AND_PIECEWISE captured at the step's size, the SSU "
            "eager between them. forward-gpu is the GPU time of the step's forward, its "
            "kernels back to back behind spins; step and forward carry the host's time. "
            "The microbenchmark's column is its graph-mode saving at the decodes' batch "
            "size.\n"
        )
    if k:
        return (
            f"## MTP verify iteration time ({serving})\n\nEach step verifies 1 + {k} "
            "tokens per request (one SSU call per Mamba-2 layer, as a decode step makes) "
            "and drafts the next; the microbenchmark's column is its decode step's saving "
            "at the same batch size.\n"
        )
    return "## Decode step time\n" if serving == PLAIN.name else f"## Step time ({serving})\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identity", nargs="*", default=[], type=Path)
    parser.add_argument("--timing", nargs="*", default=[], type=Path)
    parser.add_argument(
        "--partial",
        nargs="*",
        default=[],
        metavar="RUNNER=PATH",
        help="instead of --timing: a run cut off by a time limit, from its per-runner "
        "timing-<runner><tag>-partial.json files (the rounds each runner completed)",
    )
    parser.add_argument("--prefix", required=True, type=Path)
    parser.add_argument(
        "--microbench",
        type=Path,
        help="a microbenchmark summary.json (bench/results): its graph-mode savings "
        "go beside the engine's",
    )
    args = parser.parse_args(argv)
    try:
        outputs = _outputs(args)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise SystemExit(
            f"report: a record is not of the form its option takes ({error!r}): give "
            "--identity identity records, --timing timing.json files, --partial "
            "timing-<runner>-partial.json files"
        ) from None
    for suffix, text in outputs.items():
        args.prefix.with_suffix(suffix).write_text(text)
    return 0


def _read(path: Path) -> Any:
    """A record file's JSON; SystemExit, in one line, where it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"report: {path}: {error}") from None


def _outputs(args: argparse.Namespace) -> dict[str, str]:
    """What main writes, by the prefix's suffix: every input read and checked first, so
    that a bad one leaves no file written."""
    parts = []
    outputs = {}
    if args.identity:
        runs = [_read(path) for path in args.identity]
        merged = merge_identity(runs)
        compact = {"records": merged, "engagement": {}}
        for run in runs:
            compact["engagement"].update(compact_module.unpacked(run)["engagement"])
        outputs[".identity.json"] = compact_module.dumps_identity(compact_module.packed(compact))
        parts.append("## Identity to stock\n\n" + identity_markdown(merged))
    if args.timing or args.partial:
        timing = (
            merge_timing([_read(path) for path in args.timing])
            if args.timing
            else from_partials(args.partial)
        )
        outputs[".timing.json"] = compact_module.converted(json.dumps(timing, sort_keys=True))
        predicted = predictions(_read(args.microbench)) if args.microbench else None
        tp = timing.get("tp", 1)
        parts.append(
            steps_heading(timing)
            + (f"\nTP {tp}: each step's figures are its slowest rank's.\n" if tp > 1 else "")
            + timing_markdown(timing, predicted)
        )
        if mixed := mixed_markdown(timing):
            parts.append("## Mixed steps' forwards\n\n" + mixed)
        if engines := engine_markdown(timing):
            parts.append("## Engines per arm\n" + engines)
        if starts := start_markdown(timing):
            parts.append("## Engine start per arm\n" + starts)
        if picks := autotune_markdown(timing):
            parts.append("## Autotuning picks: the Mamba kernels' and Inductor's\n" + picks)
        if ranks := rank_markdown(timing):
            parts.append("## Replay per TP rank\n" + ranks)
        if any(result.get("profile") for result in timing["runners"].values()):
            parts.append(f"## GPU kernels per {profiled_step(timing)}\n" + profile_markdown(timing))
    outputs[".md"] = "\n".join(parts)
    return outputs


if __name__ == "__main__":
    raise SystemExit(main())
