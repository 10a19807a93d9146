"""The (seed, offset) pairs the Triton seed draw is checked on against torch.

`pairs(count)` is deterministic: the edge cases first (seeds at and above 2**32 and
2**63, offsets whose counter carries into the high word within a forward's draws,
offsets near 2**64), then random seeds below 2**64 and offsets, multiples of 4, below
2**40 and below 2**64. The GPU test draws stock's values from each pair
(tests/gpu/test_randint_seeds.py); `python -m tests.randint_pairs OUT` writes them for
the first FIXTURE_PAIRS pairs as the fixture the CPU test runs the kernel against
under Triton's interpreter (tests/test_randint_seeds_cpu.py).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

EDGE_SEEDS = (0, 1, 42, 2**32 - 1, 2**32, 2**32 + 5, 2**63 - 1, 2**63, 2**64 - 1)
EDGE_OFFSETS = (
    0,
    4,
    4 * (2**32 - 1),  # counter 2**32 - 1: the next draw's carries
    4 * (2**32 - 20),  # the carry in the middle of a forward's 40 draws
    2**34,
    4 * (2**33 - 3),  # a carry from bit 32 to 33
    2**62,
    2**64 - 4 * 64,  # the largest counters that still fit 64 bits
)
FIXTURE_PAIRS = 160
FIXTURE_SEEDS_PER_PAIR = 8
FIXTURE = Path(__file__).parent / "fixtures" / "randint_seeds.json"


def pairs(count: int) -> list[tuple[int, int]]:
    """`count` (seed, offset) pairs, the edge cases' product first."""
    found = [(seed, offset) for offset in EDGE_OFFSETS for seed in EDGE_SEEDS]
    rng = random.Random(56)
    while len(found) < count:
        seed = rng.getrandbits(64) if rng.random() < 0.5 else rng.getrandbits(33)
        bits = 40 if rng.random() < 0.5 else 64
        found.append((seed, 4 * rng.getrandbits(bits - 2)))
    return found[:count]


def stock_values(seed: int, offset: int, n: int) -> list[int]:
    """What n `torch.randint(0, 2**32, (1,))` calls on cuda:0 return from (seed, offset)."""
    import torch

    torch.cuda.init()  # which fills default_generators
    generator = torch.cuda.default_generators[0]
    generator.manual_seed(seed)
    generator.set_offset(offset)
    return [int(torch.randint(0, 2**32, (1,), device="cuda:0").item()) for _ in range(n)]


def write_fixture(path: Path) -> None:
    import torch

    cases = [
        {"seed": s, "offset": o, "values": stock_values(s, o, FIXTURE_SEEDS_PER_PAIR)}
        for s, o in pairs(FIXTURE_PAIRS)
    ]
    made = {
        "made_by": "python -m tests.randint_pairs tests/fixtures/randint_seeds.json",
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cases": cases,
    }
    path.write_text(json.dumps(made, indent=0) + "\n")


if __name__ == "__main__":
    write_fixture(Path(sys.argv[1]))
