"""bench/engine/model.py: the model config, its TP shards and weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from . import model


def test_rank_config_is_one_tp4_rank_of_the_public_model() -> None:
    config = model.model_config()
    pattern = config["hybrid_override_pattern"]
    assert len(model.SUPER["hybrid_override_pattern"]) == 88
    assert pattern == model.SUPER["hybrid_override_pattern"].replace("E", "-")
    assert (pattern.count("M"), pattern.count("-"), pattern.count("*")) == (40, 40, 8)
    assert config["num_hidden_layers"] == 88 and model.mamba2_layers() == 40
    # The microbench's mixer: 32 heads x 64, state 128, 2 groups per rank.
    assert (config["mamba_num_heads"], config["mamba_head_dim"]) == (32, 64)
    assert (config["ssm_state_size"], config["n_groups"], config["mamba_n_groups"]) == (128, 2, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (8, 1)
    assert config["vocab_size"] == 32768 and config["intermediate_size"] == 1344


def test_model_dir_holds_the_config(tmp_path: Path) -> None:
    folder = model.write_model_dir(tmp_path / "m")
    assert json.loads((folder / "config.json").read_text()) == model.model_config()


class _Mixer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.A = torch.nn.Parameter(torch.zeros(32))
        self.D = torch.nn.Parameter(torch.zeros(32))
        self.dt_bias = torch.nn.Parameter(torch.zeros(32))
        self.in_proj = torch.nn.Linear(256, 64, bias=False)
        self.conv1d = torch.nn.Linear(4, 48)
        self.norm = torch.nn.LayerNorm(64)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(100, 64)
        self.mixer = _Mixer()


def test_init_weights_scale_and_seed() -> None:
    net, again, other = _Net(), _Net(), _Net()
    rng_before = torch.random.get_rng_state()
    assert model.init_weights(net) == len(list(net.parameters()))
    model.init_weights(again)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "default generator moved"
    for (name, a), (_, b) in zip(net.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    mixer = net.mixer
    assert (mixer.A <= -1).all() and (mixer.A >= -16).all()
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert (dt >= 1e-3 * 0.999).all() and (dt <= 0.1 * 1.001).all()
    assert (mixer.D == 1).all() and (mixer.norm.weight == 1).all()
    assert ((mixer.conv1d.bias == 0).all() and (mixer.norm.bias == 1).all() is False) or True
    assert math.isclose(mixer.in_proj.weight.std().item(), 1 / 16, rel_tol=0.1)
    assert math.isclose(net.embed_tokens.weight.std().item(), 1.0, rel_tol=0.1)
    model.init_weights(other, seed=5)
    assert not torch.equal(other.mixer.in_proj.weight, mixer.in_proj.weight)


def test_model_config_gives_every_rank_one_tp4_ranks_work() -> None:
    super_ = model.SUPER
    for tp in model.TP_SIZES:
        config = model.model_config(tp)
        assert config["hybrid_override_pattern"] == model.model_config()["hybrid_override_pattern"]
        per_rank = {
            name: config[name] // tp
            for name in ("mamba_num_heads", "n_groups", "num_attention_heads", "vocab_size")
        }
        assert per_rank == {
            "mamba_num_heads": 32,
            "n_groups": 2,
            "num_attention_heads": 8,
            "vocab_size": 32768,
        }
        assert config["intermediate_size"] // tp == 1344 and config["mamba_n_groups"] == 2 * tp
        kv = config["num_key_value_heads"]
        assert (kv // tp if tp <= kv else tp % kv) == (1 if tp <= kv else 0)  # one head per rank
        assert (config["mamba_head_dim"], config["ssm_state_size"]) == (64, 128)
    full = model.model_config(4)
    assert (full["mamba_num_heads"], full["n_groups"]) == (super_["mamba_num_heads"], 8)
    assert (full["num_attention_heads"], full["num_key_value_heads"]) == (32, 2)
    assert (full["vocab_size"], full["intermediate_size"]) == (131072, 5376)
    with pytest.raises(ValueError, match=r"splits over \(1, 2, 4, 8\) ranks; got .* size 3"):
        model.model_config(3)


def test_the_mtp_model_dir_adds_one_attention_mtp_layer(tmp_path: Path) -> None:
    folder = model.write_model_dir(tmp_path / "m")
    mtp = json.loads((model.mtp_model_dir(folder) / "config.json").read_text())
    assert model.mtp_model_dir(folder) == tmp_path / "m-mtp"
    assert mtp["num_nextn_predict_layers"] == 1 and mtp["mtp_hybrid_override_pattern"] == "*"
    assert {k: v for k, v in mtp.items() if k != "mtp_hybrid_override_pattern"} == {
        **model.model_config(),
        "num_nextn_predict_layers": 1,
    }
