"""bench/engine/autotune.py: the Triton autotuning picks an engine reports."""

from __future__ import annotations

import sys
import types

import pytest

from . import autotune


def _fake_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `triton` package with the part autotune uses: the autotuner's class."""
    triton = types.ModuleType("triton")
    runtime = types.ModuleType("triton.runtime")
    autotuner = types.ModuleType("triton.runtime.autotuner")

    class Autotuner:
        def __init__(self, cache: dict) -> None:
            self.cache = cache

    autotuner.Autotuner = Autotuner
    for name, module in {
        "triton": triton,
        "triton.runtime": runtime,
        "triton.runtime.autotuner": autotuner,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


def test_picks_are_the_mamba_autotuners_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_triton(monkeypatch)
    from triton.runtime.autotuner import Autotuner

    bmm = types.ModuleType("vllm.model_executor.layers.mamba.ops.ssd_bmm")
    bmm._bmm_chunk_fwd_kernel = Autotuner({(256, 128, False): "BLOCK_SIZE_M: 64, num_warps: 4"})
    bmm.untuned = Autotuner({})
    other = types.ModuleType("vllm.model_executor.layers.fused_moe.fused_moe")
    other.kernel = Autotuner({(1,): "x"})
    picked = autotune.picks({bmm.__name__: bmm, other.__name__: other, "gone": None})
    assert picked == {
        "ssd_bmm._bmm_chunk_fwd_kernel": {"(256, 128, False)": "BLOCK_SIZE_M: 64, num_warps: 4"}
    }


def test_differences_name_each_key_whose_pick_is_not_everyones() -> None:
    same = {"k": {"(1,)": "A", "(2,)": "B"}}
    assert autotune.differences({"e0": same, "e1": same}) == {}
    found = autotune.differences({"e0": same, "e1": {"k": {"(1,)": "A", "(2,)": "C"}}})
    assert found == {"k[(2,)]": {"e0": "B", "e1": "C"}}
    missing = autotune.differences({"e0": same, "e1": {"k": {"(1,)": "A"}}})
    assert missing == {"k[(2,)]": {"e0": "B", "e1": "-"}}
