"""The engine runs' model: Nemotron 3 Super's shapes, one TP4 rank's work per rank, random weights.

The shapes are read from the public config of
nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 (SUPER below: the fields the
Mamba-2, attention and MLP layers use), the model the seed document measured
(40 Mamba-2 layers, TP4).  `model_config(tp)` is the model vLLM splits over
`tp` ranks so that every rank runs what one of SUPER's four ranks runs: the
head counts, groups, vocabulary and MLP width are SUPER's / 4 x tp (SUPER's
own at TP 4; at TP 1 one GPU runs one TP4 rank), the rest is kept.  One
change is forced: the latent-MoE layers ("E") become dense relu2 MLPs
("-"), because the vLLM bundle on the GPU machine carries no MoE ops.  Their
width, the shared expert's per rank (5376 / 4 = 1344), also reads about as
many weight bytes per token as one rank's share of an NVFP4 "E" layer at
batch size 1 (22 routed experts + shared expert + latent projections,
~174M parameters / 4 ranks / 2 per byte ~ 22 MB vs 2 x 4096 x 1344 x 2 B =
22 MB), so the stand-in costs about what the MoE layer would.

vLLM's dummy weights (uniform +-1e-3) make greedy decoding loop on two
tokens, so `init_weights` redraws them after load from a fixed seed at
working scale, on a generator of its own (the default CUDA generator, which
the seeds come from, is left alone), seeded per rank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

SOURCE = "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16"

# From SOURCE's config.json: the fields the layers are built from.
SUPER: dict[str, Any] = {
    "hybrid_override_pattern": (
        "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
    ),
    "hidden_size": 4096,
    "vocab_size": 131072,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "chunk_size": 128,
    "moe_shared_expert_intermediate_size": 5376,
    "mlp_hidden_act": "relu2",
    "layer_norm_epsilon": 1e-5,
}
SUPER_TP = 4
"""SUPER's tensor-parallel size in the seed document: model_config's per-rank shares are its."""
TP_SIZES = (1, 2, 4, 8)
"""The sizes model_config splits evenly (SUPER's 2 KV heads: split, or one replica per rank)."""
WEIGHT_SEED = 1234


def model_config(tp: int = 1) -> dict[str, Any]:
    """config.json of the model served at tensor-parallel size `tp`: per rank,
    one of SUPER's TP4 ranks (32 Mamba-2 heads, 2 groups, 8 attention heads,
    1 KV head); MoE layers as dense MLPs."""
    if tp not in TP_SIZES:
        raise ValueError(f"the model splits over {TP_SIZES} ranks; got tensor-parallel size {tp}")
    pattern = SUPER["hybrid_override_pattern"].replace("E", "-")
    n_groups = SUPER["n_groups"] // SUPER_TP * tp
    return {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "torch_dtype": "bfloat16",
        "hybrid_override_pattern": pattern,
        "num_hidden_layers": len(pattern),
        "hidden_size": SUPER["hidden_size"],
        "vocab_size": SUPER["vocab_size"] // SUPER_TP * tp,
        "num_attention_heads": SUPER["num_attention_heads"] // SUPER_TP * tp,
        # One KV head per rank: SUPER's 2 split at TP 2, replicated beyond
        # (vLLM gives each rank one replica), as at TP4.
        "num_key_value_heads": min(SUPER["num_key_value_heads"], tp),
        "head_dim": SUPER["head_dim"],
        "mamba_num_heads": SUPER["mamba_num_heads"] // SUPER_TP * tp,
        "mamba_head_dim": SUPER["mamba_head_dim"],
        # Both spellings: the HF config.json's and vLLM's NemotronHConfig's.
        "n_groups": n_groups,
        "mamba_n_groups": n_groups,
        "ssm_state_size": SUPER["ssm_state_size"],
        "conv_kernel": SUPER["conv_kernel"],
        "mamba_d_conv": SUPER["conv_kernel"],
        "chunk_size": SUPER["chunk_size"],
        "mamba_chunk_size": SUPER["chunk_size"],
        "intermediate_size": SUPER["moe_shared_expert_intermediate_size"] // SUPER_TP * tp,
        "mlp_hidden_act": SUPER["mlp_hidden_act"],
        "mamba_hidden_act": "silu",
        "layer_norm_epsilon": SUPER["layer_norm_epsilon"],
        "use_conv_bias": True,
        "mamba_conv_bias": True,
        "use_bias": False,
        "mamba_proj_bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "residual_in_fp32": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "num_nextn_predict_layers": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def mamba2_layers(config: dict[str, Any] | None = None) -> int:
    """How many SSU calls a decode forward makes on each rank: the Mamba-2 layers."""
    return (config or model_config())["hybrid_override_pattern"].count("M")


MTP_PATTERN = "*"
"""The MTP drafter's layers: one attention layer (SUPER's is "*E"; the GPU
machine's vLLM bundle has no MoE ops)."""


def mtp_model_config(tp: int = 1) -> dict[str, Any]:
    """model_config(tp) with one MTP layer: vLLM (0.20.0 and 0.26.0 alike)
    serves a nemotron_h config with num_nextn_predict_layers > 0 and
    speculative method "mtp" with NemotronHMTPModel as the drafter, built
    from mtp_hybrid_override_pattern."""
    return {
        **model_config(tp),
        "num_nextn_predict_layers": 1,
        "mtp_hybrid_override_pattern": MTP_PATTERN,
    }


def mtp_model_dir(folder: str | Path) -> Path:
    """Where write_model_dir(folder, ...) puts the MTP variant: beside it."""
    folder = Path(folder)
    return folder.with_name(folder.name + "-mtp")


def write_model_dir(folder: Path, tp: int = 1) -> Path:
    """A model directory vLLM can load with load_format="dummy" (config.json
    only), and its MTP variant at mtp_model_dir(folder); returns the first."""
    variants = ((folder, model_config(tp)), (mtp_model_dir(folder), mtp_model_config(tp)))
    for where, config in variants:
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def init_weights(model: Any, seed: int = WEIGHT_SEED) -> int:
    """Redraws every parameter of a loaded NemotronH model in place; returns the count.

    Matrices ~ N(0, 1/fan_in) (embeddings N(0, 1)), so activations keep unit
    scale; Mamba-2 A = -U(1, 16), dt_bias so that softplus(dt_bias) spans
    [1e-3, 0.1] (Mamba-2's initialisation), D and every norm weight 1, biases
    0.  Parameters are visited in name order and drawn from a CUDA generator
    seeded with `seed`, so every process given that seed gets the same weights.
    """
    import torch

    params = dict(model.named_parameters())
    device = next(iter(params.values())).device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name in sorted(params):
            param = params[name]
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A":
                fresh = -(1 + 15 * torch.rand(param.shape, generator=gen, device=device))
            elif leaf == "dt_bias":
                dt = torch.exp(
                    math.log(1e-3)
                    + (math.log(0.1) - math.log(1e-3))
                    * torch.rand(param.shape, generator=gen, device=device)
                )
                fresh = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
            elif leaf == "D" or (param.dim() == 1 and "norm" in name):
                fresh = torch.ones(param.shape, device=device)
            elif param.dim() == 1:
                fresh = torch.zeros(param.shape, device=device)
            else:
                std = 1.0 if "embed" in name else 1 / math.sqrt(param.shape[-1])
                fresh = std * torch.randn(
                    param.shape, generator=gen, device=device, dtype=torch.float32
                )
            param.copy_(fresh.to(param.dtype))
    return len(params)
