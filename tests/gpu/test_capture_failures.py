"""A captured forward that consumes fewer than N seeds fails loudly, never silently.

When the capture itself fails (the side stream was left unjoined), CUDA
reports it at the end of capture; such a failure is run in a subprocess so
that it cannot disturb the CUDA context of the other tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runner_hooks import SYNC_PLANS

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from tests.gpu.harness import FULL_GRAPH, Runner

    design, sync_plan, hook_inside = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    runner = Runner(design, sync_plan)
    runner.decode()
    record = runner.new_record()
    graph = torch.cuda.CUDAGraph()
    chain = []
    try:
        if hook_inside:
            with torch.cuda.graph(graph), runner.forward(FULL_GRAPH):
                runner.layers(record, calls=1)
        else:
            with runner.forward(FULL_GRAPH), torch.cuda.graph(graph):
                runner.layers(record, calls=1)
        runner.decode()  # the baseline learns of a forward's end only from the next one
    except Exception as error:
        while error is not None:
            chain.append([type(error).__name__, str(error)])
            error = error.__cause__ or error.__context__
    print(json.dumps(chain))
    """
)


def failure_chain(design: str, sync_plan: str, hook_inside: bool) -> list[list[str]]:
    """The exception chain the script ended with, outermost first ([] if none)."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, design, sync_plan, "1" if hook_inside else "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("sync_plan", sorted(SYNC_PLANS))
def test_baseline_capture_that_leaves_seeds_fails(sync_plan: str) -> None:
    chain = failure_chain("baseline", sync_plan, hook_inside=True)
    assert chain, "a capture that consumed 1 of N seeds went unnoticed"
    names = [name for name, _ in chain]
    messages = " | ".join(message for _, message in chain)
    ours = "IncompleteSeedBatchError" in names and "ForwardContextSeedPrefetcher" in messages
    cudas = "capture" in messages.lower()
    assert ours or cudas, chain


def test_reset_capture_inside_the_hook_names_the_prefetcher() -> None:
    """Hook outside the capture (V1): CUDA fails the capture, then our error says why."""
    chain = failure_chain("reset", "per_seed", hook_inside=False)
    assert chain[0][0] == "IncompleteSeedBatchError", chain
    assert "SRSeedPrefetcher" in chain[0][1] and "consumed 1 of the 12" in chain[0][1]
