"""The identity check over HTTP: the same prompts (token ids), one request at a time,
each with a fixed `seed`, at temperature 1 with logprobs, to every arm's server; the
record holds each request's sampled token ids and their logprobs (as float.hex, so
equality is bit equality).  Patched arms must match stock; the one-seed control must
not; stock must match stock of another round (the positive control).

Requests go one at a time so that every server runs the same batches, and before any
bench shape so that every server's prefix cache starts empty.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from .server import SERVED_NAME

PROMPT_LENGTHS = (12, 300, 40, 1500, 5, 700, 90, 3000)
MAX_TOKENS = 48
PROMPT_SEED = 11
REQUEST_SEED = 1000


def prompts(vocab_size: int) -> list[list[int]]:
    """Token ids 4.. (no special token), the same in every process."""
    rng = random.Random(PROMPT_SEED)
    return [[rng.randrange(4, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def body(prompt: list[int], index: int) -> dict[str, Any]:
    return {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "seed": REQUEST_SEED + index,
        "logprobs": 1,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(
            f"expected 'token_id:N' tokens (return_tokens_as_token_ids); got {token!r}"
        )
    return int(token.split(":", 1)[1])


def request_record(reply: dict[str, Any]) -> dict[str, Any]:
    """One completion's token ids and logprobs (float.hex)."""
    (choice,) = reply["choices"]
    logprobs = choice["logprobs"]
    return {
        "tokens": [_token_id(t) for t in logprobs["tokens"]],
        "logprobs": [float(v).hex() for v in logprobs["token_logprobs"]],
        "finish_reason": choice.get("finish_reason"),
    }


def run(post: Callable[[str, dict], dict], vocab_size: int) -> dict[str, Any]:
    """Every identity request through `post(path, body)`, one at a time; the record."""
    requests = [
        request_record(post("/v1/completions", body(p, i)))
        for i, p in enumerate(prompts(vocab_size))
    ]
    return {"requests": requests, "sanity": sanity(requests)}


def sanity(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the record can show anything: finite logprobs, full lengths, not one token."""
    values = [float.fromhex(v) for r in requests for v in r["logprobs"]]
    return {
        "finite_logprobs": bool(values) and all(math.isfinite(v) for v in values),
        "full_length": all(len(r["tokens"]) == MAX_TOKENS for r in requests),
        "fewest_distinct_tokens": min((len(set(r["tokens"])) for r in requests), default=0),
    }


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Where two identity records first differ ("request i, token j: ..."), or None."""
    if len(a["requests"]) != len(b["requests"]):
        return f"{len(a['requests'])} against {len(b['requests'])} requests"
    for i, (x, y) in enumerate(zip(a["requests"], b["requests"], strict=True)):
        for field in ("tokens", "logprobs"):
            if x[field] != y[field]:
                j = next(
                    (k for k, (u, v) in enumerate(zip(x[field], y[field], strict=False)) if u != v),
                    None,
                )
                if j is None:
                    return f"request {i}: {len(x[field])} against {len(y[field])} {field}"
                return f"request {i}, position {j}: {field} {x[field][j]} against {y[field][j]}"
    return None
