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


def _inductor_kernel(name: str, source: str, configs: list[str]) -> object:
    """An Inductor CachingAutotuner as autotune reads it: its fn and its launchers."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    kernel = CachingAutotuner.__new__(CachingAutotuner)
    kernel.fn = types.SimpleNamespace(__name__=name, src=source)
    kernel.launchers = [types.SimpleNamespace(config=config) for config in configs]
    return kernel


def test_inductor_picks_are_each_compiled_kernels_one_configuration() -> None:
    tuned = _inductor_kernel("triton_poi_fused_add_0", "def a(): pass", ["XBLOCK: 128"])
    same_name = _inductor_kernel("triton_poi_fused_add_0", "def b(): pass", ["XBLOCK: 64"])
    untuned = _inductor_kernel("triton_red_fused_1", "def c(): pass", ["R: 8", "R: 16"])
    picked = autotune.inductor_picks([tuned, same_name, untuned, object()])
    assert sorted(pick["config"] for pick in picked.values()) == ["XBLOCK: 128", "XBLOCK: 64"]
    assert len(picked) == 2, "two kernels of one name, told apart by their source"
    assert all(name.startswith("inductor.triton_poi_fused_add_0@") for name in picked)


def test_engines_whose_inductor_kernels_differ_are_named() -> None:
    first = autotune.inductor_picks([_inductor_kernel("k", "src", ["XBLOCK: 128"])])
    second = autotune.inductor_picks([_inductor_kernel("k", "src", ["XBLOCK: 64"])])
    [(name, seen)] = autotune.differences({"reset/v2/0": first, "floor/v2/0": second}).items()
    assert name.startswith("inductor.k@") and name.endswith("[config]")
    assert seen == {"reset/v2/0": "XBLOCK: 128", "floor/v2/0": "XBLOCK: 64"}
