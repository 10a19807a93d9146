# Lands in a vLLM source tree as tests/v1/e2e/general/test_mamba_sr_seed_prefetch.py
# (vllm_patch/fork_test.py), for both designs.

# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""VLLM_MAMBA_SR_SEED_PREFETCH through an engine: a small hybrid Nemotron-H
model with stochastic rounding of its fp16 SSM cache samples the same tokens,
with the same logprobs, with the variable set as without it, on both model
runners under CUDA graphs, and loads stock's compiled graphs; under another
engine seed it does not."""

import json
import math
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from vllm.platforms import current_platform

pytestmark = pytest.mark.skipif(
    not current_platform.is_cuda(), reason="seed prefetching needs a CUDA device"
)

PATTERN = "M-M-M*-M-M*-"
CONFIG = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "torch_dtype": "bfloat16",
    "hybrid_override_pattern": PATTERN,
    "num_hidden_layers": len(PATTERN),
    "hidden_size": 1024,
    "vocab_size": 4096,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 128,
    "mamba_num_heads": 32,
    "mamba_head_dim": 64,
    "n_groups": 4,
    "mamba_n_groups": 4,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "mamba_d_conv": 4,
    "chunk_size": 128,
    "mamba_chunk_size": 128,
    "intermediate_size": 1344,
    "mlp_hidden_act": "relu2",
    "mamba_hidden_act": "silu",
    "layer_norm_epsilon": 1e-5,
    "use_conv_bias": True,
    "use_bias": False,
    "residual_in_fp32": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1024,
    "num_nextn_predict_layers": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
ENGAGED = "Prefetching Mamba stochastic-rounding seeds for 5 layers per forward"


def _init_weights(model: torch.nn.Module) -> None:
    """Redraws the dummy weights (uniform +-1e-3, under which the SSM state
    barely reaches the logits) at working scale, from a generator of their own:
    matrices N(0, 1/fan_in), A in -[1, 16], dt in [1e-3, 0.1], norms and D 1."""
    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name in sorted(params):
            param, leaf = params[name], name.rsplit(".", 1)[-1]
            uniform = torch.rand(param.shape, generator=gen, device=device)
            if leaf == "A":
                fresh = -(1 + 15 * uniform)
            elif leaf == "dt_bias":
                dt = torch.exp(math.log(1e-3) + math.log(100) * uniform)
                fresh = dt + torch.log(-torch.expm1(-dt))
            elif leaf == "D" or (param.dim() == 1 and "norm" in name):
                fresh = torch.ones_like(uniform)
            elif param.dim() == 1:
                fresh = torch.zeros_like(uniform)
            else:
                std = 1.0 if "embed" in name else param.shape[-1] ** -0.5
                fresh = std * torch.randn(param.shape, generator=gen, device=device)
            param.copy_(fresh.to(param.dtype))


def _generate(model: str, env: dict[str, str], seed: int, results: Any) -> None:
    """One engine, in a process of its own: the token ids and logprobs of
    8 sampled requests, 16 tokens each."""
    os.environ.update(env)
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model,
        load_format="dummy",
        skip_tokenizer_init=True,
        seed=seed,
        attention_backend="TRITON_ATTN",
        mamba_backend="flashinfer",
        mamba_ssm_cache_dtype="float16",
        enable_mamba_cache_stochastic_rounding=True,
        mamba_cache_philox_rounds=5,
        max_model_len=256,
        max_num_seqs=8,
        kv_cache_memory_bytes=1 << 30,
        cudagraph_capture_sizes=[1, 2, 4, 8],
    )
    llm.apply_model(_init_weights)
    prompts = [
        {"prompt_token_ids": [(37 * i + 11 * j) % 4000 + 3 for j in range(8 + 5 * i)]}
        for i in range(8)
    ]
    params = [
        SamplingParams(
            temperature=1.0, seed=i, max_tokens=16, logprobs=0, ignore_eos=True
        )
        for i in range(8)
    ]
    found = []
    for output in llm.generate(prompts, params):
        tokens = list(output.outputs[0].token_ids)
        logprobs = []
        for token, top in zip(tokens, output.outputs[0].logprobs or []):
            assert top is not None
            logprobs.append(top[token].logprob)
        found.append((tokens, logprobs))
    results.put(found)


def _engine_outputs(model: Path, env: dict[str, str], seed: int) -> list[Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_generate, args=(str(model), env, seed, results))
    process.start()
    outputs = results.get(timeout=900)
    process.join()
    assert process.exitcode == 0
    return outputs


@pytest.mark.parametrize("runner", ["0", "1"], ids=["v1_runner", "v2_runner"])
def test_outputs_match_stock(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], runner: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    env = {"VLLM_USE_V2_MODEL_RUNNER": runner, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    off = {**env, "VLLM_MAMBA_SR_SEED_PREFETCH": "0"}
    on = {**env, "VLLM_MAMBA_SR_SEED_PREFETCH": "1"}
    stock = _engine_outputs(tmp_path, off, seed=0)
    assert ENGAGED not in "".join(capfd.readouterr())
    prefetched = _engine_outputs(tmp_path, on, seed=0)
    log = "".join(capfd.readouterr())
    assert ENGAGED in log
    if os.environ.get("VLLM_DISABLE_COMPILE_CACHE", "0") == "0":
        # The variable is not in the compile cache's hash: stock's graphs load.
        assert "Directly load" in log
    other_seed = _engine_outputs(tmp_path, off, seed=1)
    assert prefetched == stock
    # The comparison can fail: the SR seeds of another engine seed change it.
    assert other_seed != stock
