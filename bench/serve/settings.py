"""What a serve run covers, read from the SR_SERVE_* variables (envs.py): runners,
arms, rounds, blocks, the bench shapes and the server's options."""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass, field

from bench.engine import arms as engine_arms
from bench.engine.arms import Arm, Runner

from . import envs

CONTROL = engine_arms.BY_NAME["control-one-seed"]
MEASURED = ("stock", "reset", "forward-context")
LONG_INPUT_LEN = 10000
LONG_NUM_PROMPTS = 10
TEMPERATURE = 1.0
TOP_P = 0.95
RESIDENT_GPU_SHARE = 0.8
"""The GPU memory share all of a round's resident servers ask for together (see
Settings.gpu_memory_utilization)."""


class SettingsError(ValueError):
    """An SR_SERVE_* variable holds a value the harness cannot use; the message says which."""


@dataclass(frozen=True)
class Shape:
    """One `vllm bench serve` run: the random dataset at one concurrency."""

    name: str
    concurrency: int
    num_prompts: int
    input_len: int
    output_len: int


@dataclass(frozen=True)
class Settings:
    runners: tuple[Runner, ...] = (Runner.V1,)
    arms: tuple[Arm, ...] = tuple(engine_arms.BY_NAME[name] for name in MEASURED)
    pairs: int = 2
    control_pairs: tuple[int, ...] = (1,)
    shapes: tuple[Shape, ...] = ()
    long_pairs: tuple[int, ...] | None = None  # None: every round
    blocks: int = 4
    warmups: int = 2
    identity: bool = True
    kv_cache_dtype: str = "fp8"
    weights: str = "random"
    spec_tokens: int = 7
    async_scheduling: bool = True
    prefix_caching: bool = True  # in align mode
    kv_cache_bytes: int = 16 << 30
    extra_args: tuple[str, ...] = ()
    torch_deterministic: str = "0"
    start_timeout: float = 480.0
    budget_s: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def gpu_memory_utilization(self) -> float:
        """--gpu-memory-utilization of every server: RESIDENT_GPU_SHARE over the round's
        resident servers (one per measured arm).  vLLM refuses to start while the GPU's
        free memory is below this share of its total, and the servers started before
        hold theirs; with --kv-cache-memory-bytes set, the KV cache is sized from the
        bytes, not from this share."""
        return math.floor(1000 * RESIDENT_GPU_SHARE / len(self.arms)) / 1000

    def shapes_of(self, pair: int) -> tuple[Shape, ...]:
        """The shapes round `pair` runs: the long one only in long_pairs."""
        return tuple(
            s
            for s in self.shapes
            if s.name != "long" or self.long_pairs is None or pair in self.long_pairs
        )


def _ints(name: str, default: str) -> tuple[int, ...]:
    text = os.environ.get(name, default).strip()
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise SettingsError(f"{name} must be a comma list of integers; got {text!r}") from None


def _int(name: str, default: int) -> int:
    values = _ints(name, str(default)) or (default,)
    if len(values) != 1:
        raise SettingsError(f"{name} takes one integer; got {values}")
    return values[0]


def shapes(
    concurrency: tuple[int, ...], num_prompts: int, input_len: int, output_len: int, long: bool
) -> tuple[Shape, ...]:
    """The concurrency shapes (at least 2 requests per slot), then the seed document's."""
    out = [Shape(f"c{c}", c, max(num_prompts, 2 * c), input_len, output_len) for c in concurrency]
    if long:
        out.append(Shape("long", 1, LONG_NUM_PROMPTS, LONG_INPUT_LEN, output_len))
    return tuple(out)


def from_env() -> Settings:
    """Settings from the environment; SettingsError names a bad variable."""
    runner_names = os.environ.get(envs.RUNNERS_ENV, "v1").split(",")
    try:
        runners = tuple(Runner(name.strip()) for name in runner_names if name.strip())
    except ValueError:
        raise SettingsError(f"{envs.RUNNERS_ENV} takes v1 and/or v2; got {runner_names}") from None
    arm_names = [
        a.strip() for a in os.environ.get(envs.ARMS_ENV, ",".join(MEASURED)).split(",") if a.strip()
    ]
    unknown = [a for a in arm_names if a not in MEASURED]
    if unknown or "stock" not in arm_names:
        raise SettingsError(
            f"{envs.ARMS_ENV} takes {', '.join(MEASURED)} and must hold stock; got {arm_names}"
        )
    arm_names.sort(key=lambda a: a != "stock")  # stock leads every round
    weights = os.environ.get(envs.WEIGHTS_ENV, "random")
    if weights not in ("random", "dummy"):
        raise SettingsError(f"{envs.WEIGHTS_ENV} is random or dummy; got {weights!r}")
    long_pairs = os.environ.get(envs.LONG_PAIRS_ENV, "all")
    budget = os.environ.get(envs.BUDGET_ENV)
    blocks = _int(envs.BLOCKS_ENV, 4)
    if blocks < 1:
        raise SettingsError(f"{envs.BLOCKS_ENV} takes a count of 1 or more; got {blocks}")
    return Settings(
        runners=runners,
        arms=tuple(engine_arms.BY_NAME[a] for a in arm_names),
        pairs=_int(envs.PAIRS_ENV, 2),
        control_pairs=_ints(envs.CONTROL_PAIRS_ENV, "1"),
        shapes=shapes(
            _ints(envs.CONCURRENCY_ENV, "1,8"),
            _int(envs.NUM_PROMPTS_ENV, 16),
            _int(envs.INPUT_LEN_ENV, 1024),
            _int(envs.OUTPUT_LEN_ENV, 128),
            os.environ.get(envs.LONG_ENV, "1") == "1",
        ),
        long_pairs=None if long_pairs == "all" else _ints(envs.LONG_PAIRS_ENV, "1"),
        blocks=blocks,
        warmups=_int(envs.WARMUPS_ENV, 2),
        identity=os.environ.get(envs.IDENTITY_ENV, "1") == "1",
        kv_cache_dtype=os.environ.get(envs.KV_CACHE_DTYPE_ENV, "fp8"),
        weights=weights,
        spec_tokens=_int(envs.SPEC_TOKENS_ENV, 7),
        kv_cache_bytes=_int(envs.KV_CACHE_BYTES_ENV, 16 << 30),
        extra_args=tuple(shlex.split(os.environ.get(envs.EXTRA_ARGS_ENV, ""))),
        torch_deterministic=os.environ.get(envs.TORCH_DETERMINISTIC_ENV, "0"),
        start_timeout=float(os.environ.get(envs.START_TIMEOUT_ENV, "480")),
        budget_s=float(budget) if budget else None,
    )
