"""The paired schedule of an A/A or A/B run through two resident servers: pair i sends
its prompt to A then B when i is even, B then A when odd (requests go A B B A A B B A
...), so each server goes first equally often and neighbours in time fall on both.

Both requests of a pair carry the same prompt and sampling seed; every pair has a fresh
prompt whose first token no other pair's has, so no pair finds another's blocks in a
server's prefix cache.  Runs swap the servers' core sets (core_set_of).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

SERVERS = ("A", "B")
FIRST_ID = 4  # ids below are the tokenizer's special tokens (tokenizer.py)
SEED_RANGE = 2**31


class ScheduleError(ValueError):
    """A schedule that cannot be made with the arguments given."""


class TooManyPairs(ScheduleError):
    def __init__(self, n_pairs: int, ids: int) -> None:
        super().__init__(
            f"{n_pairs} pairs need as many distinct first tokens but only {ids} ids are"
            " usable: run fewer pairs per run or use a larger vocabulary"
        )


@dataclass(frozen=True)
class Pair:
    """One pair: its index, the order its two requests go in, the prompt and the seed."""

    index: int
    order: tuple[str, str]
    prompt: tuple[int, ...]
    seed: int


def order(index: int) -> tuple[str, str]:
    """("A", "B") for an even pair, ("B", "A") for an odd one."""
    return SERVERS if index % 2 == 0 else (SERVERS[1], SERVERS[0])


def pairs(
    n_pairs: int, seed: int, vocab_size: int, prompt_len: int, first_id: int = FIRST_ID
) -> list[Pair]:
    """n_pairs pairs in order; prompts of prompt_len ids in [first_id, vocab_size), the
    same for the same arguments in every process."""
    if prompt_len < 1 or n_pairs < 0:
        raise ScheduleError(
            f"prompt_len {prompt_len} and n_pairs {n_pairs}: give prompt_len >= 1, n_pairs >= 0"
        )
    if n_pairs > vocab_size - first_id:
        raise TooManyPairs(n_pairs, max(vocab_size - first_id, 0))
    rng = random.Random(seed)
    schedule = []
    for i, first in enumerate(rng.sample(range(first_id, vocab_size), n_pairs)):
        rest = tuple(rng.randrange(first_id, vocab_size) for _ in range(prompt_len - 1))
        schedule.append(Pair(i, order(i), (first, *rest), rng.randrange(SEED_RANGE)))
    return schedule


def requests(schedule: Iterable[Pair]) -> Iterator[tuple[str, Pair]]:
    """The schedule as requests, one (server, pair) at a time, in the order they go."""
    for pair in schedule:
        for server in pair.order:
            yield server, pair


def core_set_of(run: int, server: str) -> int:
    """The core set (0 or 1) a server gets in run `run`: A gets run % 2, B the other."""
    if server not in SERVERS:
        raise ScheduleError(f"server {server!r}: name one of {SERVERS}")
    return (run + SERVERS.index(server)) % 2


def assign(run: int, sets: list[list[int]]) -> dict[str, list[int]]:
    """{"A": cpus, "B": cpus} for run `run` from two core sets (cores.core_sets)."""
    if len(sets) != 2:
        raise ScheduleError(f"{len(sets)} core sets given: give the two servers' sets")
    return {server: sets[core_set_of(run, server)] for server in SERVERS}
