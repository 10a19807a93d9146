"""Before any timing: every variant's seeds must be stock's, value by value.

A variant that skipped a wait or drew in another order could be fast and
wrong; it must not win.  From one generator state, each layer's rand_seed is
recorded over several eager steps and over several replays of a captured
step (`DecodeModel.forward(record=...)` copies the seed on the consumer's
stream right after the SSU that read it, so it is the value the SSU saw), and
compared with stock's from the same state, in the same mode.  The generator
must also be left where stock leaves it, or every later draw would differ.

The graph check replays a graph captured with the recording copies; the
timed graph is captured from the same code without them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .graphs import capture_step
from .synthetic_model import DecodeModel
from .variants import SeedSource, run_step

CHECK_STEPS = 3
"""Steps (eager) or replays (graph) recorded: enough to see the seeds move on
from one forward to the next, as stock's do."""
CHECK_SEED = 20260101
"""The generator state every recording starts from."""


@dataclass(frozen=True)
class SeedRecord:
    """The seeds a run handed to its SSUs, and where it left the generator."""

    seeds: torch.Tensor
    """(steps, layers) int64, on the CPU."""
    rng_state_after: torch.Tensor
    """The default generator's state (seed and offset) after the run, on the CPU."""


def default_generator(device: torch.device) -> torch.Generator:
    """The generator stock's randint draws from on `device` (the CPU's in the CPU unit tests)."""
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or 0]
    return torch.default_generator


def _finish(device: torch.device, seeds: torch.Tensor) -> SeedRecord:
    """Waits for the recorded run; its seeds and generator state, on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return SeedRecord(seeds.cpu(), default_generator(device).get_state())


def record_eager(model: DecodeModel, source: SeedSource, steps: int = CHECK_STEPS) -> SeedRecord:
    """The seeds of `steps` eager steps from CHECK_SEED, enqueued back to back."""
    seeds = torch.zeros(steps, model.num_layers, dtype=torch.int64, device=model.device)
    default_generator(model.device).manual_seed(CHECK_SEED)
    for step in range(steps):
        run_step(model, source, captured=False, record=seeds[step])
    return _finish(model.device, seeds)


def record_graph(model: DecodeModel, source: SeedSource, steps: int = CHECK_STEPS) -> SeedRecord:
    """The seeds of `steps` replays from CHECK_SEED of one captured step, replayed back to back.

    The generator is seeded after the capture: capturing does not advance it,
    and each replay draws at the offset the generator holds when it starts.
    """
    record = torch.zeros(model.num_layers, dtype=torch.int64, device=model.device)
    graph = capture_step(model, source, record=record)
    seeds = torch.zeros(steps, model.num_layers, dtype=torch.int64, device=model.device)
    default_generator(model.device).manual_seed(CHECK_SEED)
    for step in range(steps):
        graph.replay()
        seeds[step].copy_(record)
    return _finish(model.device, seeds)


def mismatch(stock: SeedRecord, got: SeedRecord, limit: int = 4) -> str | None:
    """Why `got` is not stock's, or None when every seed and the final generator state agree."""
    if stock.seeds.shape != got.seeds.shape:
        return f"recorded {tuple(got.seeds.shape)} seeds, stock {tuple(stock.seeds.shape)}"
    wrong = (stock.seeds != got.seeds).nonzero().tolist()
    if wrong:
        shown = "; ".join(
            f"step {step} layer {layer}: {int(got.seeds[step, layer])} "
            f"(stock {int(stock.seeds[step, layer])})"
            for step, layer in wrong[:limit]
        )
        more = f"; and {len(wrong) - limit} more" if len(wrong) > limit else ""
        return f"{len(wrong)} of {stock.seeds.numel()} seeds differ from stock's: {shown}{more}"
    if not torch.equal(stock.rng_state_after, got.rng_state_after):
        return (
            "seeds equal stock's, but the CUDA generator is left elsewhere than stock "
            "leaves it, so every later draw would differ"
        )
    return None


def stock_anomalies(eager: SeedRecord, graph: SeedRecord) -> list[str]:
    """What would make the check itself suspect: stock's own records must agree and move on.

    Captured randint replays the eager sequence (graph-safe Philox offsets),
    and every step draws fresh seeds; were either untrue, equal records would
    prove less than they seem.
    """
    anomalies = []
    if not torch.equal(eager.seeds, graph.seeds):
        anomalies.append("stock's eager seeds and its graph-replay seeds differ")
    for mode, record in (("eager", eager), ("graph", graph)):
        rows = {tuple(row) for row in record.seeds.tolist()}
        if len(rows) != record.seeds.shape[0]:
            anomalies.append(f"stock drew the same seeds in two {mode} steps")
    return anomalies
