"""A serve run's records as markdown: the settings and server command, the identity
verdicts (judge.py), and per runner and shape each arm's figures from `vllm bench
serve`, pooled over rounds, with each round's change against stock (the spread).

    python -m bench.serve.report RECORDS.json --prefix PREFIX

writes PREFIX.md and PREFIX.serve.json (the records, the judged form) and prints the
markdown; PREFIX names the run in the results folder of bench, as its engine runs do
(serve-<GPU>-<date>).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from . import judge, records
from .records import parse_key

METRICS = (
    ("median_itl_ms", "ITL p50 (ms)", -1),
    ("mean_itl_ms", "ITL mean (ms)", -1),
    ("median_tpot_ms", "TPOT p50 (ms)", -1),
    ("mean_tpot_ms", "TPOT mean (ms)", -1),
    ("median_ttft_ms", "TTFT p50 (ms)", -1),
    ("mean_ttft_ms", "TTFT mean (ms)", -1),
    ("median_tok_s_user", "output tok/s/user p50", 1),
    ("mean_tok_s_user", "output tok/s/user mean", 1),
    ("output_throughput", "output tok/s (all users)", 1),
    ("spec_decode_acceptance_length", "acceptance length", 1),
    ("spec_decode_acceptance_rate", "acceptance rate (%)", 1),
    ("mean_chunks_per_request", "streamed chunks per request", 0),
)


def figures(data: dict[str, Any]) -> dict[tuple[str, str, str], dict[int, dict[str, Any]]]:
    """(runner, shape, arm) -> {round: the shape's figures}."""
    out: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for key, cell in data["cells"].items():
        runner, pair, arm = parse_key(key)
        for shape, kept in cell.get("bench", {}).items():
            out.setdefault((runner, shape, arm), {})[pair] = kept
    return out


def change(value: float, base: float) -> float:
    return 100.0 * (value - base) / base if base else float("nan")


def _pct(x: float) -> str:
    return f"{x:+.1f} %"


def shape_table(rows: dict[str, dict[int, dict[str, Any]]], arms: list[str]) -> list[str]:
    """One shape's table: per metric, stock's pooled mean, each arm's pooled mean, its
    pooled change and every round's change (the spread)."""
    stock = rows.get("stock", {})
    head = ["metric", "stock"] + [f"{a} (pooled; per round)" for a in arms if a != "stock"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, label, _ in METRICS:
        base_rounds = {p: f[name] for p, f in stock.items() if name in f}
        if not base_rounds:
            continue
        base = statistics.fmean(base_rounds.values())
        cells = [label, f"{base:.4g}"]
        for arm in arms:
            if arm == "stock":
                continue
            arm_rounds = {p: f[name] for p, f in rows.get(arm, {}).items() if name in f}
            if not arm_rounds:
                cells.append("-")
                continue
            pooled = statistics.fmean(arm_rounds.values())
            per = [
                _pct(change(v, base_rounds[p]))
                for p, v in sorted(arm_rounds.items())
                if p in base_rounds
            ]
            cells.append(f"{pooled:.4g} ({_pct(change(pooled, base))}; {', '.join(per) or '-'})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(data: dict[str, Any], title: str = "Serve run") -> str:
    meta = data.get("meta", {})
    settings = meta.get("settings", {})
    lines = [f"# {title}", ""]
    lines += [
        f"vLLM {meta.get('vllm')}; arms {', '.join(settings.get('arms', []))}; "
        f"{settings.get('pairs')} rounds; runners {', '.join(settings.get('runners', []))}; "
        f"weights {settings.get('weights')}; KV cache {meta.get('kv_cache_dtype')}.",
        "",
    ]
    if meta.get("kv_cache_fallback"):
        lines += [f"FP8 KV cache dropped: {meta['kv_cache_fallback'].splitlines()[0]}", ""]
    lines += [
        "Server command (each arm):",
        "",
        "```",
        "vllm " + " ".join(meta.get("server_argv", [])),
        "```",
        "",
    ]
    lines += ["## Identity over HTTP", "", "| check | verdict | detail |", "| --- | --- | --- |"]
    for name, ok, detail in judge.verdicts(data):
        lines.append(f"| {name} | {'pass' if ok else 'FAIL'} | {detail[:160]} |")
    errors = [(k, e) for k, c in sorted(data["cells"].items()) for e in c.get("errors", [])]
    if errors:
        lines += ["", "## Errors", ""] + [f"- `{k}`: {e.splitlines()[0][:300]}" for k, e in errors]
    found = figures(data)
    arms = [a for a in settings.get("arms", []) if a]
    for runner in sorted({r for r, _, _ in found}):
        for shape in sorted(
            {s for r, s, _ in found if r == runner}, key=lambda s: (s == "long", s)
        ):
            rows = {arm: found.get((runner, shape, arm), {}) for arm in arms}
            lines += ["", f"## {runner}, shape {shape}", ""]
            lines += shape_table(rows, arms)
    starts = [(k, c["start_s"]) for k, c in sorted(data["cells"].items()) if "start_s" in c]
    if starts:
        lines += ["", "Server starts (s): " + ", ".join(f"{k} {s:.0f}" for k, s in starts)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--prefix", help="write PREFIX.md and PREFIX.serve.json")
    parser.add_argument(
        "--title", default="Serve run: vllm serve per arm, measured by vllm bench serve"
    )
    args = parser.parse_args(argv)
    data = json.loads(Path(args.records).read_text())
    text = markdown(data, args.title)
    if args.prefix:
        Path(args.prefix + ".md").write_text(text)
        Path(args.prefix + ".serve.json").write_text(records.committed_text(data))
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
