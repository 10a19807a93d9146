"""The committed form of engine records, and the converter to it.

    python -m bench.engine.compact FILE...

rewrites each FILE in place in its committed form, and says what it did: an identity
record (a run's identity.json, or report.py's <prefix>.identity.json of any earlier
form), a timing record (timing.json), reproduce.py's records (reproduce.json) or a
microbenchmark summary (summary.json).  Timing, reproduce and summary files keep their
content (arms renamed in timing and summary files; a timing profile's kernels named without
their parameter lists, `kernel_name`; Inductor kernels every engine picked alike named once,
not per engine), one entry per line.  It
can be run again on its own output: that output is what it writes.

An identity record in the committed form (FORMAT) stores:
- "chains": each state chain once, by a digest of it: the per-step fingerprints of a
  TP rank's Mamba-2 state (cut to 16 hex digits) and its per-layer sums of the first
  steps.  One run's 54 rank-states hold a dozen distinct chains;
- "records": cell -> its runs, each rank's state naming its chain, with its generator
  offsets and final digest; "decoded" as a string of 0/1 per step;
- per-slot sums only where a cell differs: on a state whose chain parts from its
  cell's stock within the steps that kept them, and on that stock state. The stock
  state's, per step, as {"size", "nonzero": {slot: sum}} (most slots hold no request:
  zero); the differing state's as {"stock_but": {slot: sum}}, its slots unlike stock's
  (as the stock form where the slot counts differ).  They serve only to say which slots
  differ (report.state_difference).

`load` gives back what the judges and report.py read (report.merge_identity's form:
cell -> compact records, each holding its fingerprints again).  Arms renamed since a
record was made get their current names (RENAMES) in every form.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .autotune import INDUCTOR, pick_name

FORMAT = "engine-identity/2"
"""The committed identity form's tag ("format" at the top of the file)."""

CHAIN_KEYS = ("fingerprints", "layer_sums")
"""What a rank's state stores in its chain."""

SHORT = 16


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


STATE_KEYS = ("fingerprints", "layer_sums", "slot_sums", "rng_offsets", "state_sha256")
"""What a record holds per TP rank (worker.py's identity)."""


def rank_states(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's per-rank states, each with its "rank", in rank order; a
    record of a run before TP (one state, at its top level) is rank 0's."""
    if "ranks" in record:
        return record["ranks"]
    return [{"rank": 0, **{name: record[name] for name in STATE_KEYS if name in record}}]


def _compact_state(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": state["rank"],
        "fingerprints": [f[:SHORT] for f in state["fingerprints"]],
        "layer_sums": [[x[:SHORT] for x in step] for step in state.get("layer_sums", [])],
        "slot_sums": [[x[:8] for x in step] for step in state.get("slot_sums", [])],
        "rng_offsets": state.get("rng_offsets"),
        "state_sha256": state["state_sha256"],
    }


def compact_record(record: dict[str, Any]) -> dict[str, Any]:
    if "error" in record:
        return {"error": record["error"]}
    ranks = [_compact_state(state) for state in rank_states(record)]
    return {
        "steps": record["steps"],
        "decode_steps": record["decode_steps"],
        "start_s": round(record.get("start_s", 0.0), 1),
        "decoded": record.get("decoded"),
        "tp": len(ranks),
        "ranks": ranks,
        "sanity": record.get("sanity"),
        # Serving configurations' evidence (records before them have none).
        **{name: record[name] for name in SERVING_KEYS if name in record},
        "tokens_sha256": _sha(record["tokens"]),
        "logprobs_sha256": _sha(record["logprobs"]),
    }


SERVING_KEYS = ("cached_tokens", "block_size", "counters")
"""What a record holds about its serving configuration, kept whole (worker.py's identity)."""


def first_difference(a: Sequence[str], b: Sequence[str]) -> int | None:
    """The first step whose state fingerprints differ (or where one run is longer), or None."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return step
    return None if len(a) == len(b) else min(len(a), len(b))


RENAMES: dict[str, str] = {
    # Engine arms (arms.py): the reset design's arm is named after the design.
    "reset-kernel": "reset",
    "reset-kernel-single": "reset-single",
    # Microbenchmark variants (bench/variants.py).
    "baseline": "forward-context",
    **{
        f"explicit-{plan}-{drawer}": f"reset-{plan}-{drawer}"
        for plan in ("current_stream", "single", "geometric", "per_seed")
        for drawer in ("kernel", "randint")
    },
}
"""Old arm and variant name -> the name it has now."""


def rename(name: str) -> str:
    """An arm, variant, cell ("arm/runner/...") or engagement key's current name."""
    head, sep, rest = name.partition("/")
    return RENAMES.get(head, head) + sep + rest


def _renamed(value: Any) -> Any:
    """`value` with every dict key and string that is an old arm name (or starts a
    cell's name with one) renamed."""
    if isinstance(value, dict):
        return {rename(k) if isinstance(k, str) else k: _renamed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed(v) for v in value]
    if isinstance(value, str) and value.partition("/")[0] in RENAMES:
        return rename(value)
    return value


def _digest(chain: dict[str, Any]) -> str:
    blob = json.dumps([chain.get(k) for k in CHAIN_KEYS], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _sparse(sums: list[str]) -> dict[str, Any]:
    return {
        "size": len(sums),
        "nonzero": {str(i): s for i, s in enumerate(sums) if s.strip("0")},
    }


def _differing(stock: list[str], sums: list[str]) -> dict[str, Any]:
    if len(stock) != len(sums):
        return _sparse(sums)
    pairs = enumerate(zip(stock, sums, strict=True))
    return {"stock_but": {str(i): s for i, (t, s) in pairs if s != t}}


def _dense(step: dict[str, Any] | list[str]) -> list[str]:
    if isinstance(step, list):
        return step
    width = len(next(iter(step["nonzero"].values()), "00000000"))
    return [step["nonzero"].get(str(i), "0" * width) for i in range(step["size"])]


def _states(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The dicts of a record that hold a rank's state: each of "ranks", or the
    record itself for a run before TP."""
    return record.get("ranks", [record])


def _parting_step(stock: dict[str, Any], state: dict[str, Any]) -> int | None:
    """The step `state` parts from `stock` at, where both kept per-slot sums of it
    (what report.slots_differing reads), else None."""
    step = first_difference(stock["fingerprints"], state["fingerprints"])
    kept = min(len(stock.get("slot_sums") or []), len(state.get("slot_sums") or []))
    return step if step is not None and step < kept else None


def _packed_chain(chain: dict[str, Any]) -> dict[str, Any]:
    """A chain as stored: the fingerprints as one string where each is SHORT hex
    digits; each step's layer sums as [sum, layers] runs (layers that share a
    KV-cache tensor have the same sums)."""
    out = dict(chain)
    prints = chain.get("fingerprints")
    if prints and all(len(f) == SHORT for f in prints):
        out["fingerprints"] = "".join(prints)
    runs = []
    for step in chain.get("layer_sums", []):
        step_runs: list[list[Any]] = []
        for value in step:
            if step_runs and step_runs[-1][0] == value:
                step_runs[-1][1] += 1
            else:
                step_runs.append([value, 1])
        runs.append(step_runs)
    if "layer_sums" in chain:
        out["layer_sums"] = runs
    return out


def _unpacked_chain(chain: dict[str, Any]) -> dict[str, Any]:
    out = dict(chain)
    prints = chain.get("fingerprints")
    if isinstance(prints, str):
        out["fingerprints"] = [prints[i : i + SHORT] for i in range(0, len(prints), SHORT)]
    if "layer_sums" in chain:
        out["layer_sums"] = [
            [value for value, n in step for _ in range(n)] for step in chain["layer_sums"]
        ]
    return out


def _stock_cell(cell: str) -> str:
    return "stock/" + cell.partition("/")[2]


def unpacked(data: dict[str, Any]) -> dict[str, Any]:
    """{"records": cell -> [compact records], "engagement"} of any identity form:
    a run's identity.json (one record per cell), report.py's earlier compact form
    (a list per cell) or the committed form; arms renamed, meta kept."""
    meta = {k: v for k, v in data.items() if k not in ("records", "engagement", "chains")}
    meta.pop("format", None)
    chains = data.get("chains", {})
    records: dict[str, list[dict[str, Any]]] = {}
    for cell, runs in data["records"].items():
        runs = runs if isinstance(runs, list) else [runs]
        out = []
        for record in runs:
            record = json.loads(json.dumps(record))  # a copy
            if data.get("format") == FORMAT:
                if isinstance(record.get("decoded"), str):
                    record["decoded"] = [c == "1" for c in record["decoded"]]
                for state in _states(record):
                    if "chain" in state:
                        state.update(_unpacked_chain(chains[state.pop("chain")]))
            elif "tokens_sha256" not in record and "error" not in record:
                record = compact_record(record)
            out.append(record)
        records.setdefault(rename(cell), []).extend(out)
    if data.get("format") == FORMAT:
        _dense_slot_sums(records)
    return _renamed({"records": records, "engagement": data.get("engagement", {})}) | meta


def _dense_slot_sums(records: dict[str, list[dict[str, Any]]]) -> None:
    """Each state's stored per-slot sums as report.py reads them: a list by step, None
    at a step not kept; a state other than its cell's stock holds the slots where it
    differs from that stock's (its first run's state of the same rank)."""
    for stock_first in (True, False):
        for cell, runs in records.items():
            stock_runs = records.get(_stock_cell(cell)) or [{}]
            for record in runs:
                if (record is stock_runs[0]) != stock_first or "error" in record:
                    continue
                bases = _states(stock_runs[0]) if "error" not in stock_runs[0] else []
                for index, state in enumerate(_states(record)):
                    if not isinstance(state.get("slot_sums"), dict):
                        continue
                    kept = {}
                    for step, sums in state["slot_sums"].items():
                        if "stock_but" in sums:
                            base = bases[index]["slot_sums"][int(step)]
                            kept[int(step)] = [
                                sums["stock_but"].get(str(i), v) for i, v in enumerate(base)
                            ]
                        else:
                            kept[int(step)] = _dense(sums)
                    state["slot_sums"] = [kept.get(i) for i in range(max(kept) + 1)]


def packed(data: dict[str, Any]) -> dict[str, Any]:
    """The committed form of an identity record of any form (unpacked's input)."""
    plain = unpacked(data)
    records = plain["records"]
    # The states whose per-slot sums a verdict reads: those parting from their
    # cell's stock (its first run, what report.py compares against) early, and that stock.
    keep: dict[int, set[int]] = {}
    base: dict[int, dict[str, Any]] = {}  # a state -> its cell's stock state
    for cell, runs in records.items():
        stock_runs = records.get(_stock_cell(cell))
        if not stock_runs or "error" in stock_runs[0]:
            continue
        stock_states = _states(stock_runs[0])
        for record in runs:
            if "error" in record or record is stock_runs[0]:
                continue
            for a, b in zip(stock_states, _states(record), strict=False):
                step = _parting_step(a, b)
                if step is not None:
                    keep.setdefault(id(a), set()).add(step)
                    keep.setdefault(id(b), set()).add(step)
                    base[id(b)] = a
    chains: dict[str, dict[str, Any]] = {}
    out: dict[str, list[dict[str, Any]]] = {}
    for cell, runs in sorted(records.items()):
        out[cell] = []
        for record in runs:
            stored = dict(record)
            if isinstance(stored.get("decoded"), list):
                stored["decoded"] = "".join("1" if d else "0" for d in stored["decoded"])
            if "error" not in record:
                states = []
                for state in _states(record):
                    fields = (
                        state
                        if "ranks" in record
                        else {k: state[k] for k in STATE_KEYS if k in state}
                    )
                    chain = {k: fields[k] for k in CHAIN_KEYS if k in fields}
                    name = _digest(chain)
                    if chains.setdefault(name, chain) != chain:
                        raise ValueError(f"two chains of digest {name}")
                    kept = {k: v for k, v in fields.items() if k not in CHAIN_KEYS}
                    kept["chain"] = name
                    sums = kept.pop("slot_sums", None)
                    if id(state) in keep:
                        stock = base.get(id(state))
                        kept["slot_sums"] = {
                            str(step): _sparse(sums[step])
                            if stock is None
                            else _differing(stock["slot_sums"][step], sums[step])
                            for step in sorted(keep[id(state)])
                        }
                    states.append(kept)
                if "ranks" in record:
                    stored["ranks"] = states
                else:
                    stored = {k: v for k, v in stored.items() if k not in STATE_KEYS}
                    stored.update(states[0])
            out[cell].append(stored)
    meta = {k: v for k, v in plain.items() if k not in ("records", "engagement")}
    return {
        "format": FORMAT,
        **meta,
        "engagement": plain["engagement"],
        "chains": {name: _packed_chain(chain) for name, chain in sorted(chains.items())},
        "records": out,
    }


def kernel_name(name: str) -> str:
    """A profiled kernel's name without its trailing parameter list: `void f<T>(int*, ...)`
    is `void f<T>`; a name whose parenthesis follows a space (`Memcpy DtoD (Device ->
    Device)`) is kept whole."""
    if not name.endswith(")"):
        return name
    depth = 0
    for at in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[at], 0)
        if depth == 0:
            break
    head = name[:at]
    return head if head and not head[-1].isspace() else name


def _short_kernels(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a timing record) with each profile's kernels under kernel_name, the
    launches and µs of kernels that then share a name summed, in first-seen order."""
    for runner in data["runners"].values():
        for per_bs in (runner.get("profile") or {}).values():
            for profile in per_bs.values():
                if "kernels" not in profile:
                    continue  # a profile that failed: {"error": ...}
                merged: dict[str, list[Any]] = {}
                for name, launches, device_us in profile["kernels"]:
                    short = kernel_name(name)
                    if short in merged:
                        merged[short][1] += launches
                        merged[short][2] = round(merged[short][2] + device_us, 2)
                    else:
                        merged[short] = [short, launches, device_us]
                profile["kernels"] = list(merged.values())
    return data


def _short_autotune(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a timing record, and each run merged into it) with the Inductor kernels
    that every engine picked alike left out of the engines' picks, and named once
    instead (autotune.pick_name), under "inductor_alike" (report.autotune_markdown counts them)."""
    for part in [data, *data.get("runs", [])]:
        kept = part.get("autotune")
        if not kept:
            continue
        apart = set(kept.get("differences", {}))
        alike: set[str] = set()
        for ranks in kept["picks"].values():
            for picks in ranks if isinstance(ranks, list) else []:
                for kernel in [k for k in picks if k.startswith(INDUCTOR)]:
                    keys = [key for key in picks[kernel] if pick_name(kernel, key) not in apart]
                    alike.update(pick_name(kernel, key) for key in keys)
                    for key in keys:
                        del picks[kernel][key]
                    if not picks[kernel]:
                        del picks[kernel]
        if alike:
            kept["inductor_alike"] = sorted(alike | set(kept.get("inductor_alike", [])))
    return data


def _line(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def dumps(value: Any, depth: int) -> str:
    """JSON with dicts indented `depth` levels deep, everything below one line per
    entry: a reviewer reads it entry by entry, and no number gets a line of its own."""

    def render(v: Any, level: int) -> str:
        if level >= depth or not isinstance(v, dict) or not v:
            return _line(v)
        pad = " " * (level + 1)
        items = ",\n".join(f"{pad}{json.dumps(k)}: {render(x, level + 1)}" for k, x in v.items())
        return "{\n" + items + "\n" + " " * level + "}"

    return render(value, 0) + "\n"


def dumps_identity(data: dict[str, Any]) -> str:
    """The committed identity form as text: one chain, one cell per line."""
    return dumps(data, 2)


def load(path: Path | str) -> dict[str, Any]:
    """An identity record of any form, unpacked."""
    return unpacked(json.loads(Path(path).read_text()))


def kind(data: Any) -> str:
    """ "identity", "timing", "reproduce" (reproduce.py's records) or "summary" (a
    microbenchmark's rows)."""
    if isinstance(data, list):
        return "summary"
    if "records" in data:
        return "identity"
    if "runners" in data:
        return "timing"
    if "variants" in data:
        return "reproduce"
    raise ValueError("neither an identity, timing or reproduce record nor a summary")


def converted(text: str) -> str:
    """A record file's text in its committed form."""
    data = json.loads(text)
    what = kind(data)
    if what == "identity":
        return dumps_identity(packed(data))
    if what == "timing":
        return dumps(_short_autotune(_short_kernels(_renamed(data))), 4)
    if what == "reproduce":
        return dumps(data, 3)
    return "[\n" + ",\n".join(_line(row) for row in _renamed(data)) + "\n]\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        try:
            before = path.read_text()
            after = converted(before)
        except (OSError, ValueError, KeyError) as error:
            print(f"{path}: not converted: {type(error).__name__}: {error}", file=sys.stderr)
            status = 1
            continue
        if after == before:
            print(f"{path}: already in the committed form")
            continue
        path.write_text(after)
        print(f"{path}: {len(before.encode())} -> {len(after.encode())} bytes")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
