"""The Triton seed draw's kernel (runner_hooks/core/randint_seeds.py), run on the CPU by
Triton's interpreter, against the values torch's CUDA generator gave on a GPU
(tests/fixtures/randint_seeds.json, written by tests/randint_pairs.py)."""

from __future__ import annotations

import json

import pytest

from .child import run_child
from .randint_pairs import FIXTURE, FIXTURE_PAIRS, pairs

pytest.importorskip("triton", reason="the seed draw's kernel needs triton")

CHILD = """
import json
import sys

import torch

from runner_hooks.core.randint_seeds import randint_seeds_at

cases = json.loads(open(sys.argv[1]).read())["cases"]
shift = int(sys.argv[2])
values = []
for case in cases:
    out = torch.empty(len(case["values"]), dtype=torch.int64)
    randint_seeds_at(out, case["seed"], case["offset"] + shift)
    values.append(out.tolist())
print(json.dumps(values))
"""


def fixture_cases() -> list[dict[str, object]]:
    return json.loads(FIXTURE.read_text())["cases"]


def interpreted(offset_shift: int = 0) -> list[list[int]]:
    """The kernel's values for every fixture case, its offset moved by `offset_shift`."""
    child = run_child(
        CHILD, str(FIXTURE), str(offset_shift), timeout=300, env={"TRITON_INTERPRET": "1"}
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout)


def test_the_fixture_holds_the_pairs_it_names() -> None:
    """torch's values for the first FIXTURE_PAIRS pairs, the edge cases among them."""
    cases = fixture_cases()
    assert [(c["seed"], c["offset"]) for c in cases] == pairs(FIXTURE_PAIRS)
    assert any(c["seed"] >= 2**32 for c in cases)
    assert any(c["offset"] // 4 % 2**32 + len(c["values"]) > 2**32 for c in cases), (
        "no case whose counter carries into the high word"
    )


def test_the_kernel_gives_torchs_values() -> None:
    cases = fixture_cases()
    got = interpreted()
    wrong = [(c["seed"], c["offset"]) for c, v in zip(cases, got, strict=True) if v != c["values"]]
    assert not wrong, f"{len(wrong)} of {len(cases)} cases differ, first {wrong[:3]}"


def test_the_comparison_can_fail() -> None:
    """The control: one draw further on, every case differs, and equals torch's next."""
    cases = fixture_cases()
    got = interpreted(offset_shift=4)
    assert all(v != c["values"] for c, v in zip(cases, got, strict=True))
    assert all(v[:-1] == c["values"][1:] for c, v in zip(cases, got, strict=True))
