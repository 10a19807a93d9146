"""vLLM's own benchmark client, `vllm bench serve`, on one shape: its arguments (random
dataset, streaming completions, --ignore-eos, a fixed output length, temperature 1 and
top_p 0.95, per-request details saved) and the figures this harness reads from its
--save-result JSON.

The client runs in this process (vllm.benchmarks.serve.main, imported once from the
stock copy, the code `vllm bench serve` runs), so a shape costs no vLLM import.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .server import SERVED_NAME
from .settings import TEMPERATURE, TOP_P, Shape

# The figures kept per shape, as vllm bench serve names them in its result JSON.
KEPT = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "output_throughput",
    "request_throughput",
    "max_concurrency",
    "num_prompts",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
    "spec_decode_num_drafts",
    "spec_decode_draft_tokens",
    "spec_decode_accepted_tokens",
    "spec_decode_per_position_acceptance_rates",
)
DATASET_SEED = 0


class BenchFailed(RuntimeError):
    """vllm bench serve raised, or its requests failed: the message says how many and why."""


def argv(shape: Shape, port: int, tokenizer: Path, result: Path, warmups: int) -> list[str]:
    """`vllm bench serve` arguments (after `bench serve`) for one shape."""
    return [
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        SERVED_NAME,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--seed",
        str(DATASET_SEED),
        "--num-prompts",
        str(shape.num_prompts),
        "--random-input-len",
        str(shape.input_len),
        "--random-output-len",
        str(shape.output_len),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--max-concurrency",
        str(shape.concurrency),
        "--request-rate",
        "inf",
        "--temperature",
        str(TEMPERATURE),
        "--top-p",
        str(TOP_P),
        "--num-warmups",
        str(warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
        "--disable-tqdm",
    ]


def vllm_client() -> Callable[[list[str]], dict]:
    """vllm.benchmarks.serve.main over parsed arguments, as `vllm bench serve` calls it."""
    from vllm.benchmarks import serve as vllm_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    vllm_serve.add_cli_args(parser)

    def run(arguments: list[str]) -> dict:
        return vllm_serve.main(parser.parse_args(arguments))

    return run


def per_user(result: dict[str, Any]) -> list[float]:
    """Output tok/s each request's user saw after its first token: (tokens - 1) over the
    sum of its inter-chunk gaps, as aiperf's output token throughput per user."""
    rates = []
    for length, gaps in zip(result.get("output_lens", []), result.get("itls", []), strict=False):
        span = sum(gaps)
        if length > 1 and span > 0:
            rates.append((length - 1) / span)
    return rates


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The kept figures of one result JSON, plus tok/s per user (p50, mean), the
    chunks per request (a streamed chunk holds each verify step's accepted tokens) and
    each request's median ITL."""
    kept = {name: result[name] for name in KEPT if name in result}
    rates = per_user(result)
    if rates:
        kept["median_tok_s_user"] = statistics.median(rates)
        kept["mean_tok_s_user"] = statistics.fmean(rates)
    chunks = [len(gaps) + 1 for gaps in result.get("itls", [])]
    if chunks:
        kept["mean_chunks_per_request"] = statistics.fmean(chunks)
    medians = [statistics.median(gaps) * 1000 for gaps in result.get("itls", []) if gaps]
    if medians:
        # Per request, in order: a server whose steps change pace between requests
        # shows it here, where the pooled percentiles hide it.
        kept["request_median_itl_ms"] = [round(m, 3) for m in medians]
    errors = [e for e in result.get("errors", []) if e]
    if errors:
        kept["first_error"] = errors[0][:500]
    return kept


def check(shape: Shape, kept: dict[str, Any]) -> None:
    """BenchFailed where not every request of the shape completed."""
    if kept.get("failed") or kept.get("completed") != shape.num_prompts:
        raise BenchFailed(
            f"{shape.name}: {kept.get('completed')} of {shape.num_prompts} requests completed; "
            f"first error: {kept.get('first_error', 'none recorded')} (read the server log)"
        )
