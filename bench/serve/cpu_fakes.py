"""Stand-ins for the GPU parts, for the CPU tests: a fake `vllm serve` (an HTTP server
with /health, /metrics and /v1/completions whose tokens depend on the prompt and seed,
and whose logprobs the one-seed control changes; streamed, a request's tokens come
FAKE_ITL_S apart and add to the ITL histogram of /metrics), and a fake `vllm bench
serve` that writes a result JSON like vLLM's.

    python -m bench.serve.cpu_fakes --port P [--kv fp8]
FAKE_FAIL_KV (a KV dtype: exit at start with it), FAKE_START_S (seconds before /health),
FAKE_ITL_S (seconds between streamed tokens; default 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _tokens(prompt: list[int], seed: int, n: int) -> list[int]:
    digest = hashlib.sha256(json.dumps([prompt, seed]).encode()).digest()
    return [4 + (digest[i % 32] * 131 + i) % 1000 for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    arm = "stock"
    itl_s = 0.0
    itl_sum = 0.0
    itl_count = 0

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/metrics":
            labels = '{engine="0",model_name="sr-serve"}'
            self._send(
                200,
                "vllm:spec_decode_num_drafts_total 10\n"
                f"vllm:inter_token_latency_seconds_sum{labels} {Handler.itl_sum}\n"
                f"vllm:inter_token_latency_seconds_count{labels} {Handler.itl_count}\n",
                "text/plain",
            )
        else:
            self._send(404, "{}")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens = _tokens(body["prompt"], body["seed"], body["max_tokens"])
        if body.get("stream"):
            self._stream(tokens)
            return
        shift = 1e-3 if self.arm == "control-one-seed" else 0.0
        logprobs = [-1.0 - t / 1000 - shift for t in tokens]
        choice = {
            "text": "",
            "finish_reason": "length",
            "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": logprobs},
        }
        self._send(200, json.dumps({"choices": [choice]}))

    def _stream(self, tokens: list[int]) -> None:
        """Server-sent events, one token each, FAKE_ITL_S apart; then the usage and [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, token in enumerate(tokens):
            if i:
                time.sleep(Handler.itl_s)
            chunk = {"choices": [{"text": f" w{token}", "index": 0}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        Handler.itl_sum += Handler.itl_s * (len(tokens) - 1)
        Handler.itl_count += len(tokens) - 1
        usage = {"choices": [], "usage": {"completion_tokens": len(tokens)}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


def serve(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kv", default="auto")
    args = parser.parse_args(argv)
    print(f"fake server, arm {os.environ.get('SR_ENGINE_ARM')}, kv {args.kv}", flush=True)
    if os.environ.get("FAKE_FAIL_KV") == args.kv:
        print(f"ValueError: kv cache dtype {args.kv} is not supported here", flush=True)
        return 1
    if os.environ.get("VLLM_MAMBA_SR_SEED_PREFETCH") == "1":
        print(
            "INFO Prefetching Mamba stochastic-rounding seeds for 40 layers per forward", flush=True
        )
    time.sleep(float(os.environ.get("FAKE_START_S", "0")))
    Handler.arm = os.environ.get("SR_ENGINE_ARM", "stock")
    Handler.itl_s = float(os.environ.get("FAKE_ITL_S", "0"))
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
    return 0


def result(num_prompts: int, output_len: int, gap_s: float) -> dict:
    """A vllm bench serve result JSON (--save-detailed) of equal requests: 4 tokens per
    streamed chunk, each chunk gap_s after the last."""
    chunks = output_len // 4
    itl = [gap_s] * (chunks - 1)
    return {
        "completed": num_prompts,
        "failed": 0,
        "duration": 1.0,
        "output_throughput": num_prompts * output_len / 1.0,
        "median_itl_ms": gap_s * 1e3,
        "mean_itl_ms": gap_s * 1e3,
        "median_tpot_ms": gap_s * 1e3 / 4,
        "mean_tpot_ms": gap_s * 1e3 / 4,
        "median_ttft_ms": 20.0,
        "mean_ttft_ms": 21.0,
        "spec_decode_acceptance_length": 4.0,
        "output_lens": [output_len] * num_prompts,
        "itls": [itl] * num_prompts,
        "errors": [""] * num_prompts,
        "generated_texts": ["x"] * num_prompts,
    }


class FakeClient:
    """vllm bench serve's stand-in: writes result() where --result-dir/--result-filename
    say, with a gap per arm read from the port's server (gaps[port] or 0.01)."""

    def __init__(
        self, gap_for: dict[int, float] | None = None, stop_after: int | None = None
    ) -> None:
        self.calls: list[list[str]] = []
        self.gap_for = gap_for or {}
        self.stop_after = stop_after

    def __call__(self, argv: list[str]) -> dict:
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            from .run import Stopped

            raise Stopped("the fake time limit")
        self.calls.append(argv)
        arg = dict(zip(argv, [*argv[1:], ""], strict=True))
        port = int(arg["--port"])
        data = result(
            int(arg["--num-prompts"]), int(arg["--random-output-len"]), self.gap_for.get(port, 0.01)
        )
        Path(arg["--result-dir"], arg["--result-filename"]).write_text(json.dumps(data))
        return data


if __name__ == "__main__":
    sys.exit(serve())
