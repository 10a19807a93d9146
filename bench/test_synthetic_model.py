"""The synthetic step calls the SSU as FlashInfer requires and vLLM does (CPU, stand-in SSU)."""

from __future__ import annotations

import pytest
import torch

from .cpu_fakes import LayoutCheckingSsu
from .synthetic_model import NULL_SLOT, DecodeModel, MixerShape
from .variants import FloorSource, StockSource, run_step

CPU = torch.device("cpu")


def make_model(ssu: LayoutCheckingSsu, *, gemms: bool, batch_size: int = 2, layers: int = 3):
    return DecodeModel(
        MixerShape(), num_layers=layers, batch_size=batch_size, gemms=gemms, device=CPU, ssu=ssu
    )


@pytest.mark.parametrize("gemms", [False, True])
@pytest.mark.parametrize("batch_size", [1, 8])
def test_forward_passes_flashinfer_layout_checks_and_records_seeds(gemms, batch_size):
    ssu = LayoutCheckingSsu()
    model = make_model(ssu, gemms=gemms, batch_size=batch_size)
    record = torch.zeros(model.num_layers, dtype=torch.int64)
    run_step(model, StockSource(CPU), record=record)
    assert ssu.seeds == record.tolist()
    assert len(set(ssu.seeds)) == model.num_layers


def test_default_shape_is_one_tp4_rank_of_nemotron_h():
    shape = MixerShape()
    assert (shape.nheads, shape.head_dim, shape.dstate, shape.ngroups) == (32, 64, 128, 2)
    assert shape.philox_rounds == 5
    assert shape.conv_dim == 32 * 64 + 2 * 2 * 128
    assert shape.in_proj_dim == 2 * 32 * 64 + 2 * 2 * 128 + 32


def test_slots_skip_the_null_block():
    model = make_model(LayoutCheckingSsu(), gemms=False, batch_size=4)
    assert model.slots.shape == (4, 1)
    assert NULL_SLOT not in model.slots.tolist()
    assert all(layer.state.size(0) == 5 for layer in model.layers)


def test_floor_hands_every_layer_the_same_seed():
    ssu = LayoutCheckingSsu()
    model = make_model(ssu, gemms=False)
    floor = FloorSource(CPU)
    run_step(model, floor)
    run_step(model, floor)
    assert len(set(ssu.seeds)) == 1


def test_building_the_model_leaves_the_default_generator_alone():
    state = torch.get_rng_state()
    make_model(LayoutCheckingSsu(), gemms=True, layers=1)
    assert torch.equal(state, torch.get_rng_state())
