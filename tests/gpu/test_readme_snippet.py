"""runner_hooks/README.md's example, run as written: its seeds are stock's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parents[2] / "runner_hooks" / "README.md"


def snippet() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    return block


def test_the_readme_example_draws_stocks_seeds() -> None:
    torch.cuda.manual_seed(7)
    before = torch.cuda.get_rng_state()
    names: dict[str, object] = {}
    exec(snippet(), names)
    after = torch.cuda.get_rng_state()
    torch.cuda.set_rng_state(before)
    stock = [torch.randint(0, 2**32, (1,), device="cuda") for _ in range(40)]
    assert torch.equal(torch.cat(names["seeds"]), torch.cat(stock))  # type: ignore[arg-type]
    assert torch.equal(torch.cuda.get_rng_state(), after)
