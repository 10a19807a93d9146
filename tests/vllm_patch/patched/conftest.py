"""Fixtures for tests that run inside a patched vLLM tree, on the CPU.

test_patched_vllm.py applies a design to a copy of a release's pristine tree and
runs this directory with that tree first on PYTHONPATH, so `import vllm` is the
patched source, over the pure-Python dependencies of the installed vLLM.  It names
the design and the release in the environment; `since` skips what a release lacks.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm
import vllm.triton_utils
from vllm.model_executor.layers.mamba.ops import ssu_dispatch
from vllm.platforms import current_platform
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec

from vllm_patch import releases

TREE = Path(os.environ["SR_PREFETCH_PATCHED_TREE"])
DESIGN = os.environ["SR_PREFETCH_PATCHED_DESIGN"]
RELEASE = os.environ["SR_PREFETCH_PATCHED_RELEASE"]

if Path(vllm.__file__).resolve().parent != (TREE / "vllm").resolve():
    raise RuntimeError(f"imported vllm from {vllm.__file__}, not from the patched tree {TREE}")
if releases.base_of(vllm.__version__)[0].version != RELEASE:
    raise RuntimeError(f"the patched tree {TREE} is vLLM {vllm.__version__}, not {RELEASE}")


def at_least(version: str) -> bool:
    """Whether the patched tree's release is `version` (a supported release) or newer."""
    return releases.get(RELEASE).key >= releases.get(version).key


def since(version: str, feature: str) -> pytest.MarkDecorator:
    """Skips a test in releases before `version`, which brought `feature`."""
    return pytest.mark.skipif(
        not at_least(version), reason=f"vLLM {RELEASE} has no {feature} (added in {version})"
    )


def only_in(design: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(design != DESIGN, reason=f"the {design} design only")


def kv_cache_config(mamba2: int = 0, mamba1: int = 0, draft_mamba2: int = 0) -> KVCacheConfig:
    """A real KVCacheConfig with `mamba2` Mamba-2 and `mamba1` Mamba-1 layers, and
    `draft_mamba2` Mamba-2 layers of a draft model in the Mamba-2 layers' group, named
    as vLLM's draft-model proposer loads them."""
    groups = []
    for count, mamba_type, prefix in (
        (mamba2, MambaAttentionBackendEnum.MAMBA2, "mixer2"),
        (mamba1, MambaAttentionBackendEnum.MAMBA1, "mixer1"),
    ):
        if count:
            spec = MambaSpec(
                block_size=16,
                shapes=((1,),),
                dtypes=(torch.float16,),
                mamba_type=mamba_type,
            )
            names = [f"model.layers.{i}.{prefix}" for i in range(count)]
            if mamba_type is MambaAttentionBackendEnum.MAMBA2:
                names += [f"draft_model.model.layers.{i}.mixer" for i in range(draft_mamba2)]
            groups.append(KVCacheGroupSpec(names, spec))
    return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=groups)


class KernelStandIn:
    """Stands in for FlashInfer's SSU kernel (and ReplaySSM's): records each call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(kwargs)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> KernelStandIn:
    """A stand-in `flashinfer` package, so FlashInferSSUBackend builds on the CPU."""
    stand_in = KernelStandIn()
    mamba = types.ModuleType("flashinfer.mamba")
    mamba.selective_state_update = stand_in  # type: ignore[attr-defined]
    checkpointing = types.ModuleType("flashinfer.mamba.checkpointing_ssu")
    checkpointing.checkpointing_ssu = stand_in  # type: ignore[attr-defined]
    package = types.ModuleType("flashinfer")
    package.mamba = mamba  # type: ignore[attr-defined]
    for name, module in (
        ("flashinfer", package),
        ("flashinfer.mamba", mamba),
        ("flashinfer.mamba.checkpointing_ssu", checkpointing),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    return stand_in


@pytest.fixture
def cuda_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM believes it runs on CUDA (MambaConfig refuses stochastic rounding elsewhere)."""
    monkeypatch.setattr(current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(current_platform, "is_device_capability_family", lambda *a: True)


@pytest.fixture(autouse=True)
def fresh_ssu_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no SSU backend or prefetcher, and leaves none behind."""
    names = (
        "_mamba_ssu_backend",
        "_sr_seed_prefetcher",
        "_flashinfer_replayssm_kernel",
    )
    for name in (*names, "_mamba2_probe_layer"):
        if hasattr(ssu_dispatch, name):
            monkeypatch.setattr(ssu_dispatch, name, None)
    monkeypatch.delenv("VLLM_MAMBA_SR_SEED_PREFETCH", raising=False)


@pytest.fixture
def prefetcher_spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of seeds of each prefetcher the design attaches.

    The forward-context design's real prefetcher is built (inactive without CUDA);
    the reset design's Triton, which vLLM reports missing without a GPU, is taken as
    there, and its SeedPrefetch, which allocates on the device, is recorded instead
    of built, as a stand-in that says its number of seeds (the prefetcher then takes
    none)."""
    made: list[int] = []
    if DESIGN == "reset":
        monkeypatch.setattr(vllm.triton_utils, "HAS_TRITON", True)
        monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)

        def seed_prefetch(owner: str, num_seeds: int, *args: Any) -> types.SimpleNamespace:
            made.append(num_seeds)
            return types.SimpleNamespace(num_seeds=num_seeds)

        monkeypatch.setattr(ssu_dispatch, "SeedPrefetch", seed_prefetch)
        return made
    real: Callable[..., Any] = ssu_dispatch.ForwardContextSeedPrefetcher

    def spy(*args: Any, **kwargs: Any) -> Any:
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ssu_dispatch, "ForwardContextSeedPrefetcher", spy)
    return made
