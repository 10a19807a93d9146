"""A captured forward that consumes fewer than N seeds is never silent, and never
stops an engine where stock would run: a warning says so, unless a side stream of
its draws was left unjoined, which CUDA itself refuses at the end of the capture.
A forward that fails for its own reasons fails with its own error.

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

from bench.sync import SYNC_PLANS

from .harness import require_drawer

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
        # the forward-context design learns of a forward's end only from the next one
        runner.decode()
    except Exception as error:
        while error is not None:
            chain.append([type(error).__name__, str(error)])
            error = error.__cause__ or error.__context__
    print(json.dumps(chain))
    """
)


def run_script(script: str, *args: str) -> tuple[object, str]:
    """The JSON the script printed last, and its stderr (where warnings are logged)."""
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


def failure_chain(design: str, sync_plan: str, hook_inside: bool) -> list[list[str]]:
    """The exception chain the script ended with, outermost first ([] if none)."""
    chain, _ = run_script(SCRIPT, design, sync_plan, "1" if hook_inside else "0")
    return chain  # type: ignore[return-value]


@pytest.mark.parametrize("sync_plan", sorted(SYNC_PLANS))
def test_forward_context_capture_that_leaves_seeds_warns_or_fails_in_cuda(sync_plan: str) -> None:
    chain, stderr = run_script(SCRIPT, "forward-context", sync_plan, "1")
    if not SYNC_PLANS[sync_plan].side_stream:
        assert chain == [], chain
        assert "captured forward consumed 1 of the 12" in stderr, stderr
        return
    if not chain:  # the one event its seed waited on covered every draw: joined
        assert "captured forward consumed 1 of the 12" in stderr, stderr
        return
    names = [name for name, _ in chain]
    messages = " | ".join(message for _, message in chain)
    assert "UnjoinedCaptureError" in names or "capture" in messages.lower(), chain


def test_reset_capture_inside_the_hook_names_the_prefetcher() -> None:
    """Hook outside the capture (V1): CUDA fails the capture, and that error
    propagates as itself (the forward's body failed); the log says why."""
    chain, stderr = run_script(SCRIPT, "reset", "per_seed", "0")
    assert chain and chain[0][0] != "UnjoinedCaptureError", chain
    assert "capture" in " ".join(message for _, message in chain).lower(), chain
    assert "UnjoinedCaptureError" in stderr and "consumed 1 of the 12" in stderr, stderr


BODY_FAILS = textwrap.dedent(
    """
    import json, sys
    import torch
    from tests.gpu.harness import DECODE, FULL_GRAPH, Runner

    class ModelFailed(Exception):
        pass

    sync_plan, drawer, captured = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    runner = Runner("reset", sync_plan, drawer)
    runner.decode()
    record = runner.new_record()
    raised = None
    try:
        if captured:  # the hook inside the capture, as V2 captures
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), runner.forward(FULL_GRAPH):
                runner.layers(record, calls=3)
                raise ModelFailed("out of memory in layer 4")
        else:
            with runner.forward(DECODE):
                runner.layers(record, calls=3)
                raise ModelFailed("out of memory in layer 4")
    except Exception as error:
        raised = [type(error).__name__, str(error), repr(error.__context__)]
    # The next forward works: its seeds are what stock draws from here.
    torch.cuda.synchronize()
    state = torch.cuda.get_rng_state()
    ours = runner.decode().cpu().tolist()
    torch.cuda.synchronize()
    after_ours = torch.cuda.get_rng_state()
    torch.cuda.set_rng_state(state)
    stock = Runner(None).decode().cpu().tolist()
    torch.cuda.synchronize()
    print(json.dumps({
        "raised": raised,
        "next_equal": ours == stock,
        "same_state_after": bool(torch.equal(after_ours, torch.cuda.get_rng_state())),
    }))
    """
)


@pytest.mark.parametrize("captured", [False, True], ids=["eager", "captured"])
@pytest.mark.parametrize("drawer", ["randint", "kernel"])
@pytest.mark.parametrize("sync_plan", sorted(SYNC_PLANS))
def test_an_error_in_the_forward_propagates_as_itself(
    sync_plan: str, drawer: str, captured: bool
) -> None:
    if drawer == "kernel":
        require_drawer("kernel")
    result, stderr = run_script(BODY_FAILS, sync_plan, drawer, "1" if captured else "0")
    assert result["raised"] == [  # type: ignore[index]
        "ModelFailed",
        "out of memory in layer 4",
        "None",
    ], (result, stderr)
    assert result["next_equal"] and result["same_state_after"], (result, stderr)  # type: ignore[index]
