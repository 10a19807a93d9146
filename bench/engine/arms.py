"""The arms the engine runs compare, the serving configurations they run in,
and the settings every engine shares.

An arm is a vLLM copy (stock, or patched with one design) plus the
environment its process starts with; VLLM_MAMBA_SR_SEED_* are read once per
process (vLLM caches its envs after engine start), so every arm needs a
process of its own.  The controls are stock with a perturbation that the
identity check must see.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from vllm_patch.releases import Design

from .envs import TORCH_DETERMINISTIC_ENV

STOCK_SITE = "stock"
"""The SR_ENGINE_SITES key (client.SITES_ENV) of vLLM as released; a patched copy's key
is its design's value."""


class Runner(str, enum.Enum):
    V1 = "v1"
    V2 = "v2"

    @property
    def env(self) -> dict[str, str]:
        return {"VLLM_USE_V2_MODEL_RUNNER": "1" if self is Runner.V2 else "0"}


class GraphMode(str, enum.Enum):
    """vLLM's CUDA-graph mode of a run; EAGER is enforce_eager=True."""

    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"
    PIECEWISE = "PIECEWISE"
    EAGER = "eager"
    # FULL graphs for uniform decode batches, every other step eager.
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"


class Perturb(str, enum.Enum):
    """The negative controls' change to stock."""

    NONE = "none"
    # XOR 1 into the seed of one SSU call in every N (layer 0 of every
    # decode forward), by wrapping ssu_dispatch's torch.randint.
    ONE_SEED = "one-seed"
    # Another LLM(seed=...): every draw of the default generator moves.
    GENERATOR_SEED = "generator-seed"
    # No draw at all: every SR seed is one constant tensor (the timing's floor).
    NO_DRAW = "no-draw"
    # NO_DRAW plus one one-element draw from the default generator per forward
    # (the timing's floor-rng).
    ONE_DRAW = "one-draw"


@dataclass(frozen=True)
class Arm:
    name: str
    copy: Design | None
    """The design of the patched vLLM copy the arm imports; None: vLLM as released."""
    env: dict[str, str] = field(default_factory=dict)
    perturb: Perturb = Perturb.NONE
    control: bool = False
    what: str = ""
    # A drawer other than the reset design's as it lands (the Triton draw): the
    # worker attaches bench.variants' ResetPrefetcherByName with it in its place
    # before the engine starts.
    drawer: str | None = None

    @property
    def site(self) -> str:
        """The arm's key of SR_ENGINE_SITES (client.SITES_ENV)."""
        return STOCK_SITE if self.copy is None else self.copy.value

    @property
    def draws_before_replays(self) -> bool:
        """Whether the arm runs the reset design's prefetcher, which draws each FULL
        graph replay's seeds eagerly just before it (runner_hooks/core/reset.py):
        the patched copy's, or bench.variants' in its place (drawer), or
        the plugin's, which the flag engages in stock vLLM (PLUGIN)."""
        if self.env.get("VLLM_MAMBA_SR_SEED_PREFETCH") != "1":
            return False
        return self.copy is Design.RESET or self.copy is None

    @property
    def microbench(self) -> str:
        """The microbenchmark's variant with this arm's seed path (bench/variants.py)."""
        if self.perturb in (Perturb.NO_DRAW, Perturb.ONE_DRAW):
            return self.name  # floor, floor-rng
        if self.env.get("VLLM_MAMBA_SR_SEED_PREFETCH") != "1":
            return "stock"
        if self.copy is Design.FORWARD_CONTEXT:
            return "forward-context"
        return f"reset-{self.drawer or 'triton'}"


ON = {"VLLM_MAMBA_SR_SEED_PREFETCH": "1"}
STOCK = Arm("stock", None, what="vLLM as released")
# Stock again, in a process of its own: for the identity check, the positive
# control (two stock processes must agree, or no arm can be judged); for the
# timing, an A/A pair that shows what noise alone "saves".
STOCK_AGAIN = Arm("stock-again", None, what="stock, another process")
ARMS: tuple[Arm, ...] = (
    STOCK,
    STOCK_AGAIN,
    Arm(
        "flag-off",
        Design.RESET,
        {"VLLM_MAMBA_SR_SEED_PREFETCH": "0"},
        what="patched (reset design), VLLM_MAMBA_SR_SEED_PREFETCH=0",
    ),
    Arm(
        "reset",
        Design.RESET,
        dict(ON),
        what="reset design as it lands: the Triton drawer on the forward's stream, "
        "each forward's seeds drawn before its capture or replay (no RNG inside any graph)",
    ),
    Arm(
        "reset-randint",
        Design.RESET,
        dict(ON),
        what="reset design, randint drawer",
        drawer="randint",
    ),
    Arm(
        "forward-context",
        Design.FORWARD_CONTEXT,
        dict(ON),
        what="forward-context design: forwards told apart by the ForwardContext's identity",
    ),
)
CONTROLS: tuple[Arm, ...] = (
    Arm(
        "control-one-seed",
        None,
        perturb=Perturb.ONE_SEED,
        control=True,
        what="stock, one SR seed in every 40 XOR 1",
    ),
    Arm(
        "control-generator-seed",
        None,
        perturb=Perturb.GENERATOR_SEED,
        control=True,
        what="stock, LLM(seed=1) instead of 0",
    ),
)
# The timing's floor: what a step costs with no seed drawn at all, so that
# an arm's saving reads as a share of what the draws cost ("recovered").  Its
# seeds are wrong, so the identity check does not run it.
FLOOR = Arm(
    "floor",
    None,
    perturb=Perturb.NO_DRAW,
    what="stock, every SR seed one constant tensor: no draws",
)
# The drawing floor: the floor plus one one-element draw per forward, at its
# first SSU call (inside the graph where captured, so its replay also runs
# torch's prologue for a graph that draws): the least a path that draws
# stock's seeds from the default generator can cost.
FLOOR_RNG = Arm(
    "floor-rng",
    None,
    perturb=Perturb.ONE_DRAW,
    what="the floor plus one one-element draw per forward",
)
# Stock vLLM with this package's vllm.general_plugins plugin (vllm_patch/plugin.py)
# engaged: the reset design as it lands, served from memory, no file of the copy
# changed.  Its own check is tests/gpu/test_plugin_engine.py; the file patch's runs
# (ARMS) leave it out.
PLUGIN = Arm(
    "plugin",
    None,
    dict(ON),
    what="stock vLLM, the sr_seed_prefetch plugin engaged (reset design)",
)
TIMING_ARMS = (*ARMS, FLOOR, FLOOR_RNG)
# Every arm the identity check runs, in its table's order.
IDENTITY_ARMS = ARMS + CONTROLS
NAMED_ONLY_ARMS = (PLUGIN,)
"""The arms the timing and the identity run only where SR_ENGINE_ARMS or
SR_ENGINE_IDENTITY_ARMS names them. What the out-of-graph and checked-once arms
tried is what the reset design does by default (runner_hooks/core/prefetch.py,
reset.py), so its arm "reset" runs it; RETIRED_ARMS names their committed records."""
RETIRED_ARMS: dict[str, str] = {
    "reset-single": "reset design, one-kernel drawer on a side stream (single sync "
    "plan), which a graph that draws nothing cannot wait on",
    "reset-outside-graph": "reset design, every forward's seeds drawn eagerly as its "
    "hook fires, before captures and replays alike, into one buffer the graphs read: "
    "no RNG inside any graph (now the reset design's default)",
    "reset-checked-once": "reset design, the capture and stream checks once per "
    "forward, not once per SSU call (now the reset design's default)",
}
"""Arms no run takes any more, by name -> what they were: their committed records
(bench/results/engine-nvidia-h200-20261203d-plugin-optin, and the
engine-nvidia-h200-20261204e-outside-graph ones) stay history, to be judged and
reported as they were made."""
BY_NAME = {arm.name: arm for arm in (*IDENTITY_ARMS, FLOOR, FLOOR_RNG, *NAMED_ONLY_ARMS)}

# What two processes of the same code need to compute the same bits: the
# first Triton autotuning pick in the shared cache is every later engine's
# (identity._leaders lets stock pick first), and Python's hashing is fixed.
# TORCHINDUCTOR_DETERMINISTIC does not hold under torch 2.11 on its own
# (compilation_config carries Inductor's deterministic mode); how each
# setting was found: bench/results/engine-harness-history.md.
DETERMINISTIC_ENV = {
    "TRITON_CACHE_AUTOTUNING": "1",
    "TORCHINDUCTOR_DETERMINISTIC": "1",
    "PYTHONHASHSEED": "0",
}
# The identity run's engines only (not the timing's: the fills are kernels of
# their own): torch.use_deterministic_algorithms(True, warn_only=True) with
# torch.utils.deterministic.fill_uninitialized_memory, set by the worker
# before vLLM loads, and the cuBLAS workspace that mode asks for.
IDENTITY_ENV = {
    **DETERMINISTIC_ENV,
    TORCH_DETERMINISTIC_ENV: "1",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
}

# Every engine's, and so every TP rank's (vLLM's multiprocessing executor
# starts the ranks with the engine process's environment): NVLink multicast
# off, in NCCL, torch's symmetric memory and NVSHMEM alike.
MULTICAST_OFF_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

SEED = 0
BATCH_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Serving:
    """An engine's serving options beyond engine_kwargs' common ones: MTP
    speculative decoding, async scheduling, prefix caching (Mamba cache in
    align mode)."""

    name: str
    what: str
    # MTP drafts per verify step (vLLM's speculative_config
    # num_speculative_tokens); 0: no speculative decoding.
    speculative_tokens: int = 0
    # vLLM (0.20.0 and 0.26.0 alike) turns async scheduling on by default, MTP included.
    async_scheduling: bool = True
    prefix_caching: bool = False


PLAIN = Serving("plain", "vLLM's defaults: async scheduling, no MTP, no prefix caching")
SERVINGS: tuple[Serving, ...] = (
    PLAIN,
    Serving("sync", "async scheduling off", async_scheduling=False),
    Serving("mtp3", "MTP, 3 speculative tokens", speculative_tokens=3),
    Serving("mtp7", "MTP, 7 speculative tokens", speculative_tokens=7),
    Serving("prefix", "prefix caching, Mamba cache in align mode", prefix_caching=True),
    Serving(
        "seed-serving",
        "the seed document's: MTP with 7 speculative tokens, async scheduling, "
        "prefix caching in align mode",
        speculative_tokens=7,
        prefix_caching=True,
    ),
)
SERVING_BY_NAME = {serving.name: serving for serving in SERVINGS}
# Prefix caching in align mode caches a Mamba state only at a block boundary
# that a step ends on, and needs max_num_batched_tokens >= the block (the
# attention block that holds one Mamba state: 1056-1136 tokens for
# model.model_config(), the MTP configs' conv state being longer).
PREFIX_MAX_NUM_BATCHED_TOKENS = 2048
PREFIX_MAX_MODEL_LEN = 4096
# Twice engine_kwargs' 1 GiB: blocks of ~1100 tokens in every KV-cache group,
# for prompts of up to 3.6k tokens beside the blocks the cache keeps.
PREFIX_KV_CACHE_BYTES = 2 << 30
# vLLM's GPU worker, set up for the arm first (worker.prepare_rank) in every
# rank's process: at TP 1 the engine's own, under TP one per rank.
WORKER_CLS = "bench.engine.rank_worker.RankWorker"


def engine_kwargs(
    model_dir: str,
    mode: GraphMode,
    seed: int = SEED,
    tp: int = 1,
    serving: Serving = PLAIN,
    step_tokens: int | None = None,
) -> dict:
    """LLM(...) arguments of every run (vLLM 0.20.0 and 0.26.0 take the same):
    the FlashInfer SSU with fp16 state and stochastic rounding (5 Philox
    rounds), as the seed document serves, with graphs for batch sizes 1-8,
    over `tp` tensor-parallel ranks (one process per rank, vLLM's
    multiprocessing executor, where tp > 1), with `serving`'s options
    (serving_kwargs) and, where given, a step budget of `step_tokens`
    (step_tokens_kwargs).

    kv_cache_memory_bytes skips vLLM's memory profiling, so engines on one
    GPU can start side by side, and keeps the state small enough to hash
    every step (1 GiB: a few dozen blocks, 8 requests need 8).
    """
    kwargs = dict(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        seed=seed,
        attention_backend="TRITON_ATTN",
        mamba_backend="flashinfer",
        mamba_ssm_cache_dtype="float16",
        enable_mamba_cache_stochastic_rounding=True,
        mamba_cache_philox_rounds=5,
        max_model_len=1024,
        max_num_seqs=max(BATCH_SIZES),
        # Small enough that long prompts are chunked and share steps with decodes.
        max_num_batched_tokens=256,
        enable_chunked_prefill=True,
        gpu_memory_utilization=0.05,
        kv_cache_memory_bytes=1 << 30,
        tensor_parallel_size=tp,
        worker_cls=WORKER_CLS,
    )
    if tp > 1:
        kwargs["distributed_executor_backend"] = "mp"
    if mode is GraphMode.EAGER:
        kwargs["enforce_eager"] = True
    else:
        kwargs["cudagraph_capture_sizes"] = list(BATCH_SIZES)
        kwargs["compilation_config"] = compilation_config(mode)
    kwargs.update(serving_kwargs(serving, mode))
    if step_tokens is not None:
        kwargs.update(step_tokens_kwargs(step_tokens, kwargs.get("cudagraph_capture_sizes")))
    return kwargs


def step_tokens_kwargs(step_tokens: int, capture_sizes: list[int] | None) -> dict:
    """A step budget of `step_tokens` (max_num_batched_tokens), that size also
    captured (beside `capture_sizes`, where graphs are): a mixed batch runs
    vLLM's piecewise graphs, the SSU eager between them, only at a captured
    size or below, and without graphs above the largest."""
    kwargs: dict = {"max_num_batched_tokens": step_tokens}
    if capture_sizes is not None:
        kwargs["cudagraph_capture_sizes"] = sorted({*capture_sizes, step_tokens})
    return kwargs


def serving_kwargs(serving: Serving, mode: GraphMode) -> dict:
    """What `serving` adds to engine_kwargs: nothing for PLAIN; for the others
    stat logging (the identity record's counters) and their options.

    MTP: the model directory's MTP variant (model.mtp_model_dir) holds the
    drafter, and graphs are captured per token count: a verify step of batch
    size b runs b x (1 + K) tokens (vLLM rounds capture sizes up to multiples
    of 1 + K and drops those above the largest given).
    """
    if serving == PLAIN:
        return {}
    # The identity record reads vLLM's spec-decode and prefix-cache counters.
    kwargs: dict = {"disable_log_stats": False}
    if serving.speculative_tokens:
        k = serving.speculative_tokens
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": k}
        if mode is not GraphMode.EAGER:
            kwargs["cudagraph_capture_sizes"] = [bs * (1 + k) for bs in BATCH_SIZES]
    if not serving.async_scheduling:
        kwargs["async_scheduling"] = False
    if serving.prefix_caching:
        kwargs.update(
            enable_prefix_caching=True,
            mamba_cache_mode="align",
            max_num_batched_tokens=PREFIX_MAX_NUM_BATCHED_TOKENS,
            max_model_len=PREFIX_MAX_MODEL_LEN,
            kv_cache_memory_bytes=PREFIX_KV_CACHE_BYTES,
        )
    return kwargs


def compilation_config(mode: GraphMode, *, inductor_deterministic: bool = True) -> dict:
    """A compiled mode's compilation_config.

    Inductor's deterministic mode, through vLLM's inductor_compile_config:
    without it, Inductor picks its reduction kernels' block sizes (RMSNorm's)
    by timing each process, and two stock processes compute different bits.
    TORCHINDUCTOR_DETERMINISTIC=1 (DETERMINISTIC_ENV) does not hold under
    torch 2.11: Dynamo restores torch.use_deterministic_algorithms(False)
    after converting a frame, and that call resets inductor's
    config.deterministic.  vLLM applies inductor_compile_config as a patch
    around each compile, where it holds.

    vLLM also turns on Inductor's combo kernels and benchmarks whether to use
    them: a pick by timing, and benchmarking that deterministic mode refuses
    (raises).  Combo kernels stay on, unbenchmarked; every arm compiles with
    the same settings.

    Deterministic mode still picks each pointwise kernel's launch configuration
    by timing (a pick that changes no bits), once per compile cache, and every
    arm has a cache of its own (client.environment): one kernel's pick moved a
    decode step by ~15 µs between two arms
    (bench/results/engine-nvidia-h200-20261204d-plugin-decode.md).
    `triton.autotune_pointwise` off gives every arm the heuristic's one
    configuration.
    """
    inductor: dict[str, bool] = {"combo_kernels": True, "benchmark_combo_kernel": False}
    if inductor_deterministic:
        inductor["deterministic"] = True
        inductor["triton.autotune_pointwise"] = False
    return {"cudagraph_mode": mode.value, "inductor_compile_config": inductor}
