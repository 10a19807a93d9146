"""A captured forward that consumes fewer than N seeds is never silent, and never
stops an engine where stock would run: a warning says so, unless a side stream of
its draws (the forward-context design's) was left unjoined, which CUDA itself
refuses at the end of the capture. The reset design draws on the forward's own
stream, so its captures end cleanly (tests/gpu/test_prefetch_identity.py). A
forward that fails for its own reasons fails with its own error, eagerly and
under a capture begun before or after its forward, and leaves the generator where
stock's leaves it.

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

from .harness import FORWARD_CONTEXT_PLANS, require_drawer

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from tests.gpu.harness import FULL_GRAPH, Runner

    runner = Runner("forward-context", sys.argv[1])
    runner.decode()
    record = runner.new_record()
    graph = torch.cuda.CUDAGraph()
    chain = []
    try:
        with torch.cuda.graph(graph), runner.forward(FULL_GRAPH):
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


@pytest.mark.parametrize("sync_plan", FORWARD_CONTEXT_PLANS)
def test_forward_context_capture_that_leaves_seeds_warns_or_fails_in_cuda(sync_plan: str) -> None:
    chain, stderr = run_script(SCRIPT, sync_plan)
    if not chain:  # the one event its seed waited on covered every draw: joined
        assert "captured forward took fewer than the 12 seeds" in stderr, stderr
        return
    names = [name for name, _ in chain]
    messages = " | ".join(message for _, message in chain)
    assert "UnjoinedCaptureError" in names or "capture" in messages.lower(), chain


BODY_FAILS = textwrap.dedent(
    """
    import json, sys
    import torch
    from runner_hooks.core.prefetch import SeedPrefetch
    from tests.gpu.harness import DECODE, FULL_GRAPH, Runner

    class ModelFailed(Exception):
        pass

    drawer, mode, rewind = sys.argv[1], sys.argv[2], sys.argv[3] == "rewind"
    if not rewind:  # the control's bug
        SeedPrefetch._rewind = lambda self, offsets: None
    runner = Runner("reset", drawer=drawer)
    runner.decode()
    record = runner.new_record()
    torch.cuda.synchronize()
    before = torch.cuda.get_rng_state()
    raised = None
    try:
        if mode == "v1":  # the forward begun before the capture, as V1 captures
            graph = torch.cuda.CUDAGraph()
            with runner.forward(FULL_GRAPH), torch.cuda.graph(graph):
                runner.layers(record, calls=3)
                raise ModelFailed("out of memory in layer 4")
        elif mode == "v2":  # the forward begun inside the capture, as V2 captures
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
    # A failed capture leaves the generator where it was, as stock's (whose draws
    # were the graph's); the next forward works: its seeds are what stock draws
    # from here.
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
        "unmoved": bool(torch.equal(before, state)),
        "next_equal": ours == stock,
        "same_state_after": bool(torch.equal(after_ours, torch.cuda.get_rng_state())),
    }))
    """
)


def body_fails(drawer: str, mode: str, rewind: bool = True) -> dict[str, object]:
    """What BODY_FAILS printed, for the reset design with `drawer`, in `mode`."""
    if drawer == "triton":
        require_drawer("triton")
    result, stderr = run_script(BODY_FAILS, drawer, mode, "rewind" if rewind else "norewind")
    assert isinstance(result, dict), (result, stderr)
    result["stderr"] = stderr
    return result


@pytest.mark.parametrize("mode", ["eager", "v1", "v2"])
@pytest.mark.parametrize("drawer", ["randint", "triton"])
def test_an_error_in_the_forward_propagates_as_itself(drawer: str, mode: str) -> None:
    result = body_fails(drawer, mode)
    assert result["raised"] == ["ModelFailed", "out of memory in layer 4", "None"], result
    assert result["next_equal"] and result["same_state_after"], result
    if mode != "eager":
        assert result["unmoved"], result


def test_the_failed_capture_test_fails_without_the_rewind() -> None:
    """The control: a V1 capture that raised leaves the generator 4N offsets on
    without the rewind as its forward ends."""
    result = body_fails("randint", "v1", rewind=False)
    assert result["raised"] == ["ModelFailed", "out of memory in layer 4", "None"], result
    assert not result["unmoved"], result
