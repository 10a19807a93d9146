"""Host µs per SSU call of the seed site, flag off: stock against the patch.

With VLLM_MAMBA_SR_SEED_PREFETCH unset no prefetcher is attached
(`_sr_seed_prefetcher` is None), and FlashInferSSUBackend.__call__ asks
`sr_rand_seed(device)` where stock calls `torch.randint(0, 2**32, (1,),
device=device)` inline. Timed, per call: stock's inline draw; the landed
`sr_rand_seed` (vllm_patch/landing/ssu_gate.py, which asks `prefetched_sr_seed()`,
run over the module state the patch leaves with the flag off); and `DIRECT`, the same
function reading `_sr_seed_prefetcher` itself. Each is timed with torch's randint
(`real`) and with a stand-in that returns one tensor (`bare`: the site's own cost,
which randint's ~µs would otherwise bury). CPU only.

    python -m bench.flag_off_ssu [--rounds 60] [--calls 5000] [--out PREFIX]

Interleaved rounds shuffled with a fixed seed, one sample per variant per round
(the mean over `--calls` calls); medians with 95% bootstrap intervals, IQRs and
each variant's µs over its stock, paired (bench/flag_off.py's summary).
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import flag_off, stats

LANDING = Path(__file__).resolve().parents[1] / "vllm_patch" / "landing"
DIRECT = """
def sr_rand_seed(device):
    prefetcher = _sr_seed_prefetcher
    if prefetcher is not None:
        seed = prefetcher.next_seed()
        if seed is not None:
            return seed
    return torch.randint(0, 2**32, (1,), device=device)
"""
"""The function reading the attribute itself: one function call less than the landed one."""


def _functions(path: Path, names: set[str]) -> ast.Module:
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    return ast.Module(body=body, type_ignores=[])


class BareTorch:
    """torch with a randint that returns one tensor: the site's cost alone."""

    def __init__(self) -> None:
        self._seed = torch.zeros(1, dtype=torch.int64)

    def randint(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._seed


GATE = LANDING / "ssu_gate.py"


def seed_site(torch_module: Any, source: str | ast.Module, filename: str) -> Any:
    """`source`'s sr_rand_seed over the flag-off module state (prefetched_sr_seed
    from landing/ssu_gate.py)."""
    namespace: dict[str, Any] = {"torch": torch_module, "_sr_seed_prefetcher": None}
    gate = _functions(GATE, {"prefetched_sr_seed"})
    exec(compile(gate, str(GATE), "exec"), namespace)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["sr_rand_seed"]


def variants() -> dict[str, Callable[[torch.device], object]]:
    landed = _functions(GATE, {"sr_rand_seed"})
    table: dict[str, Callable[[torch.device], object]] = {}
    for kind, torch_module in (("real", torch), ("bare", BareTorch())):

        def stock(device: torch.device, torch_module: Any = torch_module) -> object:
            return torch_module.randint(0, 2**32, (1,), device=device)

        table[f"stock ({kind})"] = stock
        table[f"flag-off, landed ({kind})"] = seed_site(torch_module, landed, str(GATE))
        table[f"flag-off, attribute read ({kind})"] = seed_site(torch_module, DIRECT, "DIRECT")
    return table


def measure(rounds: int, calls: int, seed: int = 0) -> dict[str, list[float]]:
    """Seconds per call, one sample of every variant per round, shuffled."""
    table = variants()
    device = torch.device("cpu")
    samples: dict[str, list[float]] = {name: [] for name in table}
    for round_index in range(rounds):
        order = list(table)
        stats.seeded_rng(seed, "flag-off-ssu", round_index).shuffle(order)
        for name in order:
            call = table[name]
            began = time.perf_counter_ns()
            for _ in range(calls):
                call(device)
            samples[name].append((time.perf_counter_ns() - began) / calls / 1e9)
    return samples


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """flag_off.summarize per kind (real, bare), each against its own stock."""
    rows: dict[str, dict[str, Any]] = {}
    for kind in ("real", "bare"):
        mine = {n: v for n, v in samples.items() if n.endswith(f"({kind})")}
        keyed = {("stock" if n.startswith("stock") else n): v for n, v in mine.items()}
        for name, row in flag_off.summarize(keyed).items():
            rows[f"stock ({kind})" if name == "stock" else name] = row
    return rows


def main(argv: list[str] | None = None) -> int:
    return flag_off.cli(
        argv,
        "bench.flag_off_ssu",
        "calls",
        5000,
        measure,
        summarize,
        "per SSU call at the seed site",
        __doc__.splitlines()[0],
    )


if __name__ == "__main__":
    raise SystemExit(main())
