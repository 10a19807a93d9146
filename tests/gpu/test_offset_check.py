"""The opt-in offset check (runner_hooks/offset_check.py) on a GPU.

A forward that draws `torch.rand` between two Mamba layers, as vLLM's
VLLM_MOE_ROUTING_SIMULATION_STRATEGY does in every MoE layer, gets seeds that
are not stock's; the check warns, once.  Without such a draw the seeds are
stock's and the check says nothing: it is not a warning that always fires.
"""

from __future__ import annotations

import logging

import pytest
import torch

from .harness import DECODE, NUM_LAYERS, Runner

pytestmark = pytest.mark.gpu

OTHER_DRAW_AFTER = 3
"""The layer after whose SSU call the forward draws torch.rand (an MoE layer's router)."""
WARNING = "between a forward's seed draws and its Mamba SSU call"


def forwards(runner: Runner, other_draw: bool, count: int = 3) -> torch.Tensor:
    """`count` eager forwards; the seeds their SSU calls read, in order."""
    records = []
    for _ in range(count):
        record = runner.new_record()
        with runner.forward(DECODE):
            for k in range(NUM_LAYERS):
                runner.activations.mul_(1.0001).add_(1.0)
                record[k : k + 1].copy_(runner.seed())
                if other_draw and k == OTHER_DRAW_AFTER:
                    torch.rand(64, device=runner.device)
        records.append(record)
    torch.cuda.synchronize()
    return torch.cat(records).cpu()


def stock_and_checked(
    design: str, drawer: str, other_draw: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    seeds = []
    for runner in (Runner(None), Runner(design, drawer=drawer, check_offsets=True)):
        torch.cuda.manual_seed(99)
        seeds.append(forwards(runner, other_draw))
    return seeds[0], seeds[1]


@pytest.mark.parametrize("drawer", ["randint", "kernel"])
@pytest.mark.parametrize("design", ["reset", "baseline"])
def test_a_draw_between_mamba_layers_is_flagged_once(
    design: str, drawer: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="runner_hooks"):
        stock, ours = stock_and_checked(design, drawer, other_draw=True)
    # The seeds up to the other draw are stock's; the later ones are not.
    cut = OTHER_DRAW_AFTER + 1
    assert torch.equal(stock[:cut], ours[:cut])
    assert not torch.equal(stock[cut:NUM_LAYERS], ours[cut:NUM_LAYERS])
    flagged = [r for r in caplog.records if WARNING in r.getMessage()]
    assert len(flagged) == 1, [r.getMessage() for r in caplog.records]
    assert f"Mamba SSU call {cut}" in flagged[0].getMessage()


@pytest.mark.parametrize("drawer", ["randint", "kernel"])
@pytest.mark.parametrize("design", ["reset", "baseline"])
def test_no_other_draw_no_warning(
    design: str, drawer: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="runner_hooks"):
        stock, ours = stock_and_checked(design, drawer, other_draw=False)
    assert torch.equal(stock, ours)
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
