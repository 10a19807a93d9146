"""The identity record's digests of an engine's Mamba-2 state, read on each rank
(worker.py sends them there through collective_rpc): per-layer and per-slot sums,
the fingerprint of a step, the state's sha256, the generator's offset, and the sanity
figures of the sampled tokens."""

from __future__ import annotations

import hashlib
import math
from typing import Any


def _mamba_caches(net: Any) -> list[Any]:
    """Per Mamba-2 layer, in the model's order (layers.0 first, then layers.2:
    named_modules' order), its (conv state, SSM state) tensors: first
    dimension the cache slot (vLLM's block id)."""
    from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

    return [module.kv_cache for _, module in net.named_modules() if isinstance(module, MambaMixer2)]


def _ssm_states(net: Any) -> list[Any]:
    return [cache[1] for cache in _mamba_caches(net)]


def _request_slots(state: Any) -> Any:
    """A state tensor without slot 0: vLLM's null block, which no request holds.
    A padded CUDA-graph batch (V2 FULL) reads and writes its padding entries
    there, from stale input buffers: bits no request ever reads, and not the
    same from process to process."""
    return state[1:]


def zero_states(net: Any) -> int:
    """Zeroes every Mamba-2 layer's conv and SSM state, every slot; returns the
    layer count.  Profile, warm-up and capture forwards leave bits of their own
    in slots no request holds yet; from zero, a slot differs only where a
    request's (or padding's) forward wrote different bits (with prefix
    caching, a request holds a slot per block of its tokens)."""
    import torch

    caches = _mamba_caches(net)
    for cache in caches:
        for tensor in cache:
            tensor.zero_()
    torch.cuda.synchronize()
    return len(caches)


_WEIGHTS: dict[int, Any] = {}


def _weights(n: int, which: int) -> Any:
    """Odd int64 weights, fixed per (length, which): a single changed 32-bit word
    changes a weighted sum."""
    import torch

    key = n * 2 + which
    if key not in _WEIGHTS:
        gen = torch.Generator().manual_seed(which + 1)
        w = torch.randint(0, 2**62, (n,), generator=gen, dtype=torch.int64) * 2 + 1
        _WEIGHTS[key] = w.cuda()
    return _WEIGHTS[key]


def layer_sums(net: Any) -> list[str]:
    """Per Mamba-2 layer, in layer order, its fp16 SSM state in every slot a
    request can hold, as two 64-bit weighted sums of its 32-bit words (on the
    GPU; integer sums do not depend on order), as 32 hex digits.

    vLLM's hybrid KV cache lets one layer of each KV-cache group share a
    tensor, each group on blocks of its own: a layer's tensor, every slot,
    holds other layers' states (and attention blocks) too.  So the sums cover
    every layer's state, and layers that share a tensor give the same sums."""
    import torch

    torch.cuda.synchronize()
    sums = []
    for state in _ssm_states(net):
        words = _request_slots(state).contiguous().view(-1).view(torch.int32).to(torch.int64)
        both = b"".join(
            int((words * _weights(words.numel(), which)).sum().item()).to_bytes(
                8, "little", signed=True
            )
            for which in (0, 1)
        )
        sums.append(both.hex())
    return sums


def slot_sums(net: Any) -> list[str]:
    """Per cache slot (the state tensors' first dimension), a 64-bit weighted
    sum of its 32-bit words over every Mamba-2 layer, as 16 hex digits: which
    slots differ tells a difference in a request's state from one in slots no
    request holds (written only by warm-up and capture forwards)."""
    import torch

    torch.cuda.synchronize()
    total = None
    for state in _ssm_states(net):
        rows = state.contiguous().view(state.shape[0], -1).view(torch.int32).to(torch.int64)
        per_slot = (rows * _weights(rows.shape[1], 0)).sum(dim=1)
        total = per_slot if total is None else total + per_slot
    return [] if total is None else [f"{int(v) & (2**64 - 1):016x}" for v in total.tolist()]


def rng_offset(_net: Any = None) -> int:
    """Where the default CUDA generator (the SR seeds' source) stands: two
    processes that took the same draws report the same offset."""
    import torch

    return int(torch.cuda.default_generators[torch.cuda.current_device()].get_offset())


def state_fingerprint(sums: list[str]) -> str:
    """One digest of every layer's sums."""
    return hashlib.sha256(bytes.fromhex("".join(sums))).hexdigest()


def state_sha256(net: Any) -> str:
    """sha256 of the bytes of every Mamba-2 layer's SSM state in every slot a
    request can hold, in layer order."""
    import torch

    torch.cuda.synchronize()
    digest = hashlib.sha256()
    for state in _ssm_states(net):
        digest.update(
            _request_slots(state).contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
        )
    return digest.hexdigest()


def sanity(finals: dict[str, Any]) -> dict[str, Any]:
    """What rules out a trivial agreement (every process sampling from NaN
    logits agrees too): whether every sampled token's logprob is finite, and
    the fewest distinct token ids any request sampled."""
    logprobs = [
        entry.logprob
        for c in finals.values()
        for position in (c.logprobs or [])
        for entry in position.values()
    ]
    return {
        "finite_logprobs": bool(logprobs) and all(math.isfinite(v) for v in logprobs),
        "fewest_distinct_tokens": min((len(set(c.token_ids)) for c in finals.values()), default=0),
    }


def _logprobs(output: Any) -> list[list[Any]]:
    """Per generated position: (token id, logprob as float.hex()) pairs, sorted."""
    return [
        sorted([token, float(entry.logprob).hex()] for token, entry in position.items())
        for position in (output.logprobs or [])
    ]
