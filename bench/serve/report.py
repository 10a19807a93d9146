"""A serve run's records as markdown: the settings and server command, the identity
verdicts (judge.py), and per runner and shape each arm's figures from `vllm bench
serve`: its mean over all blocks and rounds, and its change against stock per block
pair (each block against stock's block of the same round and index, which ran next to
it in the rotation): the median, min..max and count of those changes; then each
server's ITL p50 block by block, so that a change of pace shows.

    python -m bench.serve.report RECORDS.json --prefix PREFIX

writes PREFIX.md and PREFIX.serve.json (the records, the judged form) and prints the
markdown; PREFIX names the run in the results folder of bench, as its engine runs do
(serve-<GPU>-<date>).  Records of the one-server-at-a-time layout read as one block
per shape and round.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from . import judge, records
from .records import blocks_of, parse_key, starts_of

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


Blocks = dict[int, list[dict[str, Any]]]
"""round -> the blocks of one arm's shape in that round."""


def figures(data: dict[str, Any]) -> dict[tuple[str, str, str], Blocks]:
    """(runner, shape, arm) -> {round: the shape's blocks}."""
    out: dict[tuple[str, str, str], Blocks] = {}
    for key, cell in data["cells"].items():
        runner, pair, arm = parse_key(key)
        for shape, entry in cell.get("bench", {}).items():
            out.setdefault((runner, shape, arm), {})[pair] = blocks_of(entry)
    return out


def change(value: float, base: float) -> float:
    return 100.0 * (value - base) / base if base else float("nan")


def _pct(x: float) -> str:
    return f"{x:+.1f} %"


def values(rounds: Blocks, name: str) -> list[float]:
    return [b[name] for blocks in rounds.values() for b in blocks if name in b]


def paired(arm: Blocks, stock: Blocks, name: str) -> list[float]:
    """The arm's change against stock per block pair: each of its blocks against stock's
    block of the same round and index (pairs without a finite change left out)."""
    out = []
    for pair, blocks in sorted(arm.items()):
        base = {b["block"]: b[name] for b in stock.get(pair, []) if name in b}
        for block in sorted(blocks, key=lambda b: b["block"]):
            if name in block and block["block"] in base:
                out.append(change(block[name], base[block["block"]]))
    return [c for c in out if not math.isnan(c)]


def shape_table(rows: dict[str, Blocks], arms: list[str]) -> list[str]:
    """One shape's table: per metric, stock's mean over its blocks and rounds, and each
    arm's mean with its paired changes against stock (median; min..max; pairs)."""
    stock = rows.get("stock", {})
    head = ["metric", "stock"] + [a for a in arms if a != "stock"]
    lines = [
        "Each arm: mean over blocks and rounds (change against stock's block of the same "
        "round and index: median; min..max; pairs).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for name, label, _ in METRICS:
        base = values(stock, name)
        if not base:
            continue
        cells = [label, f"{statistics.fmean(base):.4g}"]
        for arm in arms:
            if arm == "stock":
                continue
            own = values(rows.get(arm, {}), name)
            if not own:
                cells.append("-")
                continue
            changes = paired(rows.get(arm, {}), stock, name)
            spread = (
                f"{_pct(statistics.median(changes))}; {min(changes):+.1f}..{max(changes):+.1f} "
                f"%; {len(changes)}"
                if changes
                else "no pairs"
            )
            cells.append(f"{statistics.fmean(own):.4g} ({spread})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def phase_lines(rows: dict[str, Blocks], arms: list[str]) -> list[str]:
    """Per server (round, arm, start), its blocks' ITL p50 in block order."""
    lines = []
    for pair in sorted({p for arm_rounds in rows.values() for p in arm_rounds}):
        for arm in arms:
            servers: dict[int, list[dict[str, Any]]] = {}
            for block in rows.get(arm, {}).get(pair, []):
                servers.setdefault(block.get("start", 0), []).append(block)
            for start, blocks in sorted(servers.items()):
                itl = ", ".join(
                    f"b{b['block']} {b['median_itl_ms']:.3f}"
                    for b in sorted(blocks, key=lambda b: b["block"])
                    if "median_itl_ms" in b
                )
                lines.append(f"- p{pair} {arm}, start {start}: {itl or '-'}")
    return ["ITL p50 (ms) per block, per server:", "", *lines] if lines else []


def markdown(data: dict[str, Any], title: str = "Serve run") -> str:
    meta = data.get("meta", {})
    settings = meta.get("settings", {})
    lines = [f"# {title}", ""]
    lines += [
        f"vLLM {meta.get('vllm')}; arms {', '.join(settings.get('arms', []))}; "
        f"{settings.get('pairs')} rounds"
        + (f" of {settings['blocks']} blocks" if "blocks" in settings else "")
        + f"; runners {', '.join(settings.get('runners', []))}; "
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
            lines += ["", *phase_lines(rows, arms)]
    starts = [
        f"{key} {', '.join(f'{s:.0f}' for s in starts_of(cell))}"
        for key, cell in sorted(data["cells"].items())
        if starts_of(cell)
    ]
    if starts:
        lines += ["", "Server starts (s, each start of the cell's server): " + "; ".join(starts)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--prefix", help="write PREFIX.md and PREFIX.serve.json")
    parser.add_argument(
        "--title", default="Serve run: vllm serve per arm, measured by vllm bench serve"
    )
    args = parser.parse_args(argv)
    try:
        data = json.loads(Path(args.records).read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"serve report: {args.records}: {error}") from None
    try:
        text, committed = markdown(data, args.title), records.committed_text(data)
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise SystemExit(
            f"serve report: {args.records} is not a serve run's records ({error!r}): give "
            "the serve.json that `tests/gpu/vllm/engine.sh serve` writes"
        ) from None
    if args.prefix:
        Path(args.prefix + ".md").write_text(text)
        Path(args.prefix + ".serve.json").write_text(committed)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
