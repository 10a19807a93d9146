"""bench/engine/state.py: the digests of the Mamba-2 state."""

from __future__ import annotations

import pytest
import torch

from . import state


def test_state_digests_leave_out_the_null_block_and_start_from_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = torch.Generator().manual_seed(0)
    caches = [
        (torch.randn(4, 3, 2, generator=gen), torch.randn(4, 2, 8, generator=gen).half())
        for _ in range(2)
    ]
    monkeypatch.setattr(state, "_mamba_caches", lambda net: caches)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(
        state, "_weights", lambda n, which: torch.arange(n, dtype=torch.int64) * 2 + 1 + which
    )
    sums, sha = state.layer_sums(None), state.state_sha256(None)
    caches[1][1][0] += 1  # slot 0, the null block: no request's state
    assert (state.layer_sums(None), state.state_sha256(None)) == (sums, sha)
    caches[1][1][2, 1, 3] += 1  # one word of a request's slot in layer 1
    changed = state.layer_sums(None)
    assert changed[0] == sums[0] and changed[1] != sums[1]
    assert state.state_sha256(None) != sha
    assert len(state.slot_sums(None)) == 4  # the per-slot view still shows slot 0
    assert state.zero_states(None) == 2
    assert all(not tensor.any() for cache in caches for tensor in cache)


def test_sanity_tells_a_degenerate_run() -> None:
    from types import SimpleNamespace as NS

    def final(tokens: list[int], logprobs: list[float]) -> NS:
        steps = zip(tokens, logprobs, strict=True)
        return NS(token_ids=tokens, logprobs=[{t: NS(logprob=v)} for t, v in steps])

    good = {"r0": final([5, 9, 5], [-1.0, -2.5, -0.5]), "r1": final([3, 4], [-3.0, -1.0])}
    assert state.sanity(good) == {"finite_logprobs": True, "fewest_distinct_tokens": 2}
    nan = {"r0": final([0, 0, 0], [float("nan")] * 3)}
    assert state.sanity(nan) == {"finite_logprobs": False, "fewest_distinct_tokens": 1}
