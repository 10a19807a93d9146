"""What the patch changes in a vLLM v0.33.0 tree, per design.

Each change to an existing file is an anchored edit: an exact text that must
occur exactly once in the file, and what replaces it.  Anchors are whole
statements of the v0.33.0 source, chosen so that a fork whose edits do not
touch them still takes the patch, and so that a failing anchor names the
place that moved.  New files (the vendored package, the fork's test) are
produced, not listed here: see `vendor.py` and `fork_test.py`.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from . import fork_test, vendor

RESET = "reset"
FORWARD_CONTEXT = "forward-context"

ENVS = "vllm/envs.py"
SSU_DISPATCH = "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py"
V1_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
V2_RUNNER = "vllm/v1/worker/gpu/model_runner.py"
V2_CUDAGRAPH = "vllm/v1/worker/gpu/cudagraph_utils.py"


@dataclass(frozen=True)
class Edit:
    """`anchor`, found exactly once in the pristine file, becomes `replacement`."""

    why: str
    anchor: str
    replacement: str


def insert_after(why: str, anchor: str, text: str) -> Edit:
    return Edit(why, anchor, anchor + text)


def insert_before(why: str, anchor: str, text: str) -> Edit:
    return Edit(why, anchor, text + anchor)


@dataclass(frozen=True)
class FileEdits:
    """The edits to one existing file, applied in order; their anchors do not overlap."""

    path: str
    edits: tuple[Edit, ...]


@dataclass(frozen=True)
class Design:
    """One way of patching vLLM: edits to existing files, and the files it adds."""

    name: str
    summary: str
    file_edits: tuple[FileEdits, ...]
    commit_message: str

    def added_files(self) -> dict[str, bytes]:
        """Tree-relative path -> bytes of every file the design adds, produced now."""
        files = vendor.vendored_files()
        files[fork_test.PATH] = fork_test.render(self.name).encode("utf-8")
        return files


# --- vllm/envs.py ----------------------------------------------------------------

_PREFETCH_DECLARATION = "    VLLM_MAMBA_SR_SEED_PREFETCH: bool = False\n"
_DRAWER_DECLARATION = (
    '    VLLM_MAMBA_SR_SEED_DRAWER: Literal["auto", "kernel", "randint"] = "auto"\n'
)
_PREFETCH_DEFINITION = """\
    # If set to 1, the FlashInfer Mamba SSU backend draws a forward's
    # stochastic-rounding seeds up front instead of one torch.randint before
    # every SSU call. The seeds are identical to stock.
    # No effect without --enable-mamba-cache-stochastic-rounding.
    "VLLM_MAMBA_SR_SEED_PREFETCH": lambda: bool(
        int(os.getenv("VLLM_MAMBA_SR_SEED_PREFETCH", "0"))
    ),
"""
_DRAWER_DEFINITION = """\
    # How VLLM_MAMBA_SR_SEED_PREFETCH draws a forward's seeds: "kernel", all of
    # them in one launch of a small CUDA op built on first use; "randint", the
    # stock calls on a side stream; "auto", the kernel where it builds, else
    # randint (the log says which, and why).
    "VLLM_MAMBA_SR_SEED_DRAWER": env_with_choices(
        "VLLM_MAMBA_SR_SEED_DRAWER", "auto", ["auto", "kernel", "randint"]
    ),
"""


def _env_edits(declarations: str, definitions: str) -> FileEdits:
    """The env vars a design reads, declared for type checkers and defined;
    not in ignored_factors, so they are part of the compile cache hash."""
    return FileEdits(
        ENVS,
        (
            insert_after(
                "declare the env vars for type checkers",
                "    VLLM_ENABLE_HPC_OPS: bool = False\n",
                declarations,
            ),
            insert_after(
                "define the env vars, part of the compile cache hash",
                '    "VLLM_ENABLE_HPC_OPS": lambda: bool('
                'int(os.getenv("VLLM_ENABLE_HPC_OPS", "0"))),\n',
                definitions,
            ),
        ),
    )


# The seed document's design draws with randint only; ours lets users pick.
_FORWARD_CONTEXT_ENV_EDITS = _env_edits(_PREFETCH_DECLARATION, _PREFETCH_DEFINITION)
_RESET_ENV_EDITS = _env_edits(
    _PREFETCH_DECLARATION + _DRAWER_DECLARATION,
    _PREFETCH_DEFINITION + _DRAWER_DEFINITION,
)

# --- ssu_dispatch.py: what both designs share ------------------------------------

_SSU_IMPORT_ANCHOR = "from vllm.logger import init_logger\n"

_SSU_ENVS_IMPORT = insert_before(
    "import vllm.envs for the gate",
    "from vllm.config.mamba import MambaBackendEnum, MambaConfig, MambaSSUAlgorithm\n",
    "import vllm.envs as envs\n",
)

_SSU_CALL = Edit(
    "FlashInferSSUBackend.__call__ takes rand_seed from the prefetcher, else inline",
    """\
        rand_seed = (
            torch.randint(0, 2**32, (1,), device=state.device)
            if self._mamba_config.enable_stochastic_rounding
            else None
        )
        self._kernel(
""",
    """\
        rand_seed = (
            self._next_rand_seed(state.device)
            if self._mamba_config.enable_stochastic_rounding
            else None
        )
        self._kernel(
""",
)

_SSU_NEXT_RAND_SEED = insert_before(
    "FlashInferSSUBackend._next_rand_seed: the prefetched seed or the stock draw",
    """\
    @property
    def name(self) -> str:
        return "flashinfer"
""",
    '''\
    def _next_rand_seed(self, device: torch.device) -> torch.Tensor:
        """This call's stochastic-rounding seed: the prefetched one when a
        prefetcher is attached and has it, else drawn inline exactly as stock
        (outside a forward, beyond the forward's N calls, ...)."""
        if _sr_seed_prefetcher is not None:
            seed = _sr_seed_prefetcher.next_seed()
            if seed is not None:
                return seed
        return torch.randint(0, 2**32, (1,), device=device)

''',
)

_SSU_GLOBALS_ANCHOR = "_mamba_ssu_backend: MambaSSUBackend | None = None\n"

_SSU_ATTACH_CALL = insert_after(
    "initialize_mamba_ssu_backend attaches the seed prefetcher where it applies",
    """\
    if use_replayssm:
        logger.info("Using %s ReplaySSM backend.", backend.value)
""",
    "    _attach_sr_seed_prefetcher(mamba_config, kv_cache_config, use_replayssm)\n",
)

_SSU_HELPERS_ANCHOR = "\n\ndef get_mamba_ssu_backend() -> MambaSSUBackend:\n"

_SSU_GATE = '''

def _mamba2_layer_names(kv_cache_config: KVCacheConfig) -> list[str]:
    """This rank's Mamba-2 layers, each of which calls the SSU once per forward
    whose batch has decode tokens."""
    return [
        layer_name
        for group in kv_cache_config.kv_cache_groups
        if isinstance(group.kv_cache_spec, MambaSpec)
        and group.kv_cache_spec.mamba_type == MambaAttentionBackendEnum.MAMBA2
        for layer_name in group.layer_names
    ]


def _sr_seed_prefetch_blocker(
    mamba_config: MambaConfig,
    kv_cache_config: KVCacheConfig,
    use_replayssm: bool,
) -> str | None:
    """Why VLLM_MAMBA_SR_SEED_PREFETCH cannot apply here, or None if it can."""
    if not envs.VLLM_MAMBA_SR_SEED_PREFETCH:
        return "VLLM_MAMBA_SR_SEED_PREFETCH is not set"
    if not mamba_config.enable_stochastic_rounding:
        return "stochastic rounding is off"
    if not isinstance(_mamba_ssu_backend, FlashInferSSUBackend):
        # The Triton kernel draws its seeds itself.
        return "the Mamba SSU backend is not FlashInfer"
    if use_replayssm:
        # ReplaySSM has its own SSU call and seed draw, left as they are.
        return "ReplaySSM is on"
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return "the platform is not CUDA"
    if any(
        isinstance(group.kv_cache_spec, MambaSpec)
        and group.kv_cache_spec.mamba_type == MambaAttentionBackendEnum.MAMBA1
        for group in kv_cache_config.kv_cache_groups
    ):
        # Mamba-1 layers call the same SSU, but N counts Mamba-2 layers only.
        return "the model has Mamba-1 layers"
    if not _mamba2_layer_names(kv_cache_config):
        return "the model has no Mamba-2 layers"
    return None


def _attach_sr_seed_prefetcher(
    mamba_config: MambaConfig,
    kv_cache_config: KVCacheConfig,
    use_replayssm: bool,
) -> None:
    """Attaches a seed prefetcher to the SSU backend where it applies, else
    none. Runs for each KV cache config (memory profiling, then the real one),
    so it replaces whatever the previous run attached."""
    global _sr_seed_prefetcher
    mamba2_layers = _mamba2_layer_names(kv_cache_config)
    _sr_seed_prefetcher = None
    blocker = _sr_seed_prefetch_blocker(mamba_config, kv_cache_config, use_replayssm)
    if blocker is not None:
        if envs.VLLM_MAMBA_SR_SEED_PREFETCH:
            logger.info_once(
                "VLLM_MAMBA_SR_SEED_PREFETCH is set but unused: %s.", blocker
            )
        return
    num_layers = len(mamba2_layers)
    _sr_seed_prefetcher = {construct}
    logger.info_once(
        "Prefetching Mamba stochastic-rounding seeds for %d layers per forward.",
        num_layers,
    )
'''

# --- ssu_dispatch.py: the explicit-reset design -----------------------------------

_RESET_SSU = FileEdits(
    SSU_DISPATCH,
    (
        _SSU_ENVS_IMPORT,
        insert_after(
            "import the vendored hook contract and prefetcher",
            _SSU_IMPORT_ANCHOR,
            """\
from vllm.model_executor.layers.mamba.ops.sr_seed_prefetch import (
    ForwardInfo,
    SRSeedPrefetcher,
)
""",
        ),
        _SSU_NEXT_RAND_SEED,
        _SSU_CALL,
        insert_after(
            "module state: the attached prefetcher, and the layer whose metadata "
            "tells whether a batch runs the SSU",
            _SSU_GLOBALS_ANCHOR,
            """\

# Hands FlashInferSSUBackend its pre-drawn stochastic-rounding seeds; attached
# by initialize_mamba_ssu_backend where VLLM_MAMBA_SR_SEED_PREFETCH applies.
_sr_seed_prefetcher: SRSeedPrefetcher | None = None
# A Mamba-2 layer of the KV cache config, whose attention metadata tells
# batch_runs_mamba_ssu whether a batch has decode tokens.
_mamba2_probe_layer: str | None = None
""",
        ),
        _SSU_ATTACH_CALL,
        insert_before(
            "the gate, the runner-facing hook relay, and batch_runs_mamba_ssu",
            _SSU_HELPERS_ANCHOR,
            _SSU_GATE.replace(
                "    global _sr_seed_prefetcher\n",
                "    global _sr_seed_prefetcher, _mamba2_probe_layer\n",
            )
            .replace(
                "    _sr_seed_prefetcher = None\n",
                "    _mamba2_probe_layer = mamba2_layers[0] if mamba2_layers else None\n"
                "    _sr_seed_prefetcher = None\n",
            )
            .replace(
                "{construct}",
                "SRSeedPrefetcher(\n"
                '        num_layers, "cuda", drawer=envs.VLLM_MAMBA_SR_SEED_DRAWER\n'
                "    )",
            )
            + '''

class MambaSRSeedHook:
    """Tells the attached seed prefetcher where each forward begins and ends.

    A model runner registers one on its ForwardHooks as it is built. The
    prefetcher behind it is replaced each time initialize_mamba_ssu_backend
    runs (memory profiling, then the real KV cache), and a registered hook
    cannot be taken back, so the runner holds this stable relay instead.
    """

    def on_forward_begin(self, info: ForwardInfo) -> None:
        if _sr_seed_prefetcher is not None:
            _sr_seed_prefetcher.on_forward_begin(info)

    def on_forward_end(self, info: ForwardInfo) -> None:
        if _sr_seed_prefetcher is not None:
            _sr_seed_prefetcher.on_forward_end(info)


def batch_runs_mamba_ssu(
    attn_metadata: dict[str, Any] | list[dict[str, Any]] | None,
) -> bool:
    """Whether a forward with this attention metadata calls the Mamba SSU.

    MambaMixer2 calls it only when its batch has decode tokens: prefill-only
    batches, and the profile run (no Mamba metadata), call it zero times. The
    decode/prefill split belongs to the batch, so one Mamba-2 layer's metadata
    tells for all. A list holds one dict per micro-batch.
    """
    if _mamba2_probe_layer is None or attn_metadata is None:
        return False
    per_ubatch = attn_metadata if isinstance(attn_metadata, list) else [attn_metadata]
    return any(
        (metadata := per_layer.get(_mamba2_probe_layer)) is not None
        and metadata.num_decodes > 0
        for per_layer in per_ubatch
    )
''',
        ),
        insert_after(
            "typing.Any for batch_runs_mamba_ssu's signature",
            "from functools import cache\n",
            "from typing import Any\n",
        ),
    ),
)

# --- ssu_dispatch.py: the forward-context (seed document) design -----------------

_FORWARD_CONTEXT_SSU = FileEdits(
    SSU_DISPATCH,
    (
        _SSU_ENVS_IMPORT,
        insert_before(
            "import the forward context, which tells one forward from the next",
            _SSU_IMPORT_ANCHOR,
            """\
from vllm.forward_context import (
    ForwardContext,
    get_forward_context,
    is_forward_context_available,
)
""",
        ),
        insert_after(
            "import the vendored prefetcher",
            _SSU_IMPORT_ANCHOR,
            """\
from vllm.model_executor.layers.mamba.ops.sr_seed_prefetch import (
    ForwardContextSeedPrefetcher,
)
""",
        ),
        insert_after(
            "import DBO's thread registry, which tells micro-batches apart",
            "from vllm.v1.kv_cache_interface import KVCacheConfig, MambaSpec\n",
            "from vllm.v1.worker.ubatching import dbo_enabled\n",
        ),
        _SSU_NEXT_RAND_SEED,
        _SSU_CALL,
        insert_after(
            "module state: the attached prefetcher",
            _SSU_GLOBALS_ANCHOR,
            """\

# Hands FlashInferSSUBackend its pre-drawn stochastic-rounding seeds; attached
# by initialize_mamba_ssu_backend where VLLM_MAMBA_SR_SEED_PREFETCH applies.
_sr_seed_prefetcher: ForwardContextSeedPrefetcher | None = None
""",
        ),
        _SSU_ATTACH_CALL,
        insert_before(
            "the gate, and how the prefetcher sees forwards and micro-batches",
            _SSU_HELPERS_ANCHOR,
            _SSU_GATE.replace(
                "{construct}",
                """ForwardContextSeedPrefetcher(
        num_layers,
        "cuda",
        current_forward=_current_forward_context,
        is_micro_batched=_in_micro_batch,
    )""",
            )
            + '''

def _current_forward_context() -> ForwardContext | None:
    """The forward context being run, which tells one forward from the next."""
    return get_forward_context() if is_forward_context_available() else None


def _in_micro_batch(forward_context: ForwardContext) -> bool:
    """Whether the SSU runs in a DBO micro-batch. Each micro-batch runs on its
    own thread under its own forward context, which carries no mark of it;
    the ubatching module knows while micro-batch threads run."""
    return dbo_enabled()
''',
        ),
    ),
)

# --- the model runners: the explicit-reset design only ----------------------------

_RUNNER_IMPORTS = Edit(
    "import the hook contract and the SSU's hook relay",
    """\
from vllm.model_executor.layers.mamba.ops.ssu_dispatch import (
    initialize_mamba_ssu_backend,
)
""",
    """\
from vllm.model_executor.layers.mamba.ops.sr_seed_prefetch import (
    ForwardHooks,
    ForwardInfo,
)
from vllm.model_executor.layers.mamba.ops.ssu_dispatch import (
    MambaSRSeedHook,
    batch_runs_mamba_ssu,
    initialize_mamba_ssu_backend,
)
""",
)

_RUNNER_HOOKS_INIT = """\

        # Every forward of the target model runs inside
        # self.forward_hooks.forward(); the Mamba SSU seed prefetcher learns
        # from it where each forward begins and ends.
        self.forward_hooks = ForwardHooks()
        self.forward_hooks.register(MambaSRSeedHook())
"""

_V1_RUNNER = FileEdits(
    V1_RUNNER,
    (
        _RUNNER_IMPORTS,
        insert_after(
            "the runner owns its forward hooks, with the seed hook registered",
            "        # self.kv_cache_config: KVCacheConfig\n",
            _RUNNER_HOOKS_INIT,
        ),
        insert_after(
            "execute_model: the model forward runs inside the hooks",
            """\
            self.maybe_get_kv_connector_output(
                scheduler_output,
                defer_finalize=defer_kv_connector_finalize,
            ) as kv_connector_output,
""",
            """\
            self.forward_hooks.forward(
                ForwardInfo(
                    runs_ssu=batch_runs_mamba_ssu(attn_metadata),
                    micro_batched=ubatch_slices_padded is not None,
                    full_cudagraph=cudagraph_mode == CUDAGraphMode.FULL,
                )
            ),
""",
        ),
        Edit(
            "_dummy_run: profile, warm-up, capture and DP dummy forwards run inside the hooks",
            """\
                    slot_mapping=slot_mappings,
                    is_padding=is_padding,
                ),
            ):
                outputs = self.model(
""",
            """\
                    slot_mapping=slot_mappings,
                    is_padding=is_padding,
                ),
                self.forward_hooks.forward(
                    ForwardInfo(
                        runs_ssu=batch_runs_mamba_ssu(attn_metadata),
                        micro_batched=ubatch_slices_padded is not None,
                        full_cudagraph=cudagraph_runtime_mode == CUDAGraphMode.FULL,
                    )
                ),
            ):
                outputs = self.model(
""",
        ),
    ),
)

_V2_RUN_MODEL = """\
        if batch_desc.cg_mode == CUDAGraphMode.FULL:
            # Use explicit cudagraph replay for FULL mode.
            # NOTE(woosuk): Here, we don't need to pass the input tensors,
            # because they are already copied to the CUDA graph input buffers.
            assert self.cudagraph_manager is not None
            self.kv_connector.pre_forward(
                scheduler_output, input_batch, attn_metadata=attn_metadata
            )
            model_output = self.cudagraph_manager.run_fullgraph(batch_desc)
        else:
            # For piecewise and eager mode, just call model().
            batch_descriptor = BatchDescriptor(
                num_tokens=input_batch.num_tokens_after_padding,
                has_lora=self.lora_config is not None,
                num_active_loras=batch_desc.num_active_loras,
            )

            with set_forward_context(
                attn_metadata,
                self.vllm_config,
                num_tokens=input_batch.num_tokens_after_padding,
                cudagraph_runtime_mode=batch_desc.cg_mode,
                num_tokens_across_dp=dp_sync_state
                and dp_sync_state.num_tokens_across_dp,
                batch_descriptor=batch_descriptor,
                ubatch_slices=ubatch_slices,
                slot_mapping=slot_mappings_by_layer,
                skip_compiled=skip_compiled,
                is_padding=input_batch.is_padding,
            ):
                self.kv_connector.pre_forward(scheduler_output, input_batch)
                if ubatch_state is not None:
                    assert self.ubatch_runner is not None
                    model_output = self.ubatch_runner.run(
                        self.model, model_inputs, ubatch_state
                    )
                elif batch_desc.cg_mode == CUDAGraphMode.PIECEWISE:
                    # Run the PIECEWISE graph (compiled PW cudagraph or breakable
                    # cudagraph, chosen inside run_pw_graph). cg_mode is only
                    # PIECEWISE after the cudagraph manager exists.
                    assert self.cudagraph_manager is not None
                    model_output = self.cudagraph_manager.run_pw_graph(
                        self.model, model_inputs
                    )
                else:
                    # Eager (NONE): call the raw model directly.
                    model_output = self.model(**model_inputs)
"""

_V2_RUNNER = FileEdits(
    V2_RUNNER,
    (
        _RUNNER_IMPORTS,
        insert_after(
            "the runner owns its forward hooks, with the seed hook registered",
            """\
        # Dual batch overlap. Created in initialize_kv_cache(), once everything
        # it runs the microbatched forward with exists.
        self.ubatch_runner: UBatchRunner | None = None
""",
            _RUNNER_HOOKS_INIT,
        ),
        Edit(
            "execute_model: every forward, _dummy_run's too, runs inside the hooks; "
            "a FULL graph replay as well, so none goes unannounced",
            "        # Run model.\n" + _V2_RUN_MODEL,
            """\
        # Run model, inside the forward hooks (a FULL graph replay too).
        forward_info = ForwardInfo(
            runs_ssu=batch_runs_mamba_ssu(
                attn_metadata
                if ubatch_state is None
                else [ctx.attn_metadata for ctx in ubatch_state.forward_contexts]
            ),
            micro_batched=ubatch_state is not None,
            full_cudagraph=batch_desc.cg_mode == CUDAGraphMode.FULL,
        )
        with self.forward_hooks.forward(forward_info):
"""
            + textwrap.indent(_V2_RUN_MODEL, "    ", lambda line: line.strip() != ""),
        ),
        insert_after(
            "capture_model hands the hooks to the graph manager's capture",
            """\
                        lora_capture_hook=create_lora_capture_hook(
                            self.lora_config, self
                        ),
""",
            "                        forward_hooks=self.forward_hooks,\n",
        ),
    ),
)

_V2_CUDAGRAPH = FileEdits(
    V2_CUDAGRAPH,
    (
        insert_after(
            "import the hook contract and batch_runs_mamba_ssu",
            "from vllm.logger import init_logger\n",
            """\
from vllm.model_executor.layers.mamba.ops.sr_seed_prefetch import (
    ForwardHooks,
    ForwardInfo,
)
from vllm.model_executor.layers.mamba.ops.ssu_dispatch import batch_runs_mamba_ssu
""",
        ),
        Edit(
            "ModelCudaGraphManager.capture takes the runner's forward hooks",
            """\
        lora_capture_hook: Callable[[int, int, int], None] | None = None,
        progress_bar_desc: str = "Capturing CUDA graphs",
    ) -> None:
        \"\"\"Capture CUDA graphs for model forward pass.\"\"\"
""",
            """\
        lora_capture_hook: Callable[[int, int, int], None] | None = None,
        progress_bar_desc: str = "Capturing CUDA graphs",
        *,
        forward_hooks: ForwardHooks,
    ) -> None:
        \"\"\"Capture CUDA graphs for model forward pass.

        Every warm-up and capture forward runs inside `forward_hooks`.
        \"\"\"
""",
        ),
        Edit(
            "DBO capture: the micro-batched forward runs inside the hooks",
            """\
                    store_capture_output(num_tokens, finish())
""",
            """\
                    with forward_hooks.forward(
                        ForwardInfo(
                            runs_ssu=batch_runs_mamba_ssu(
                                [c.attn_metadata for c in ubatch_state.forward_contexts]
                            ),
                            micro_batched=True,
                            full_cudagraph=(
                                desc.cg_mode == CUDAGraphMode.FULL and not warmup
                            ),
                        )
                    ):
                        model_output = finish()
                    store_capture_output(num_tokens, model_output)
""",
        ),
        Edit(
            "warm-up, PIECEWISE and FULL capture forwards run inside the hooks",
            """\
                with set_forward_context(
                    attn_metadata,
                    self.vllm_config,
                    num_tokens=num_tokens,
                    cudagraph_runtime_mode=cg_mode,
                    num_tokens_across_dp=num_tokens_across_dp,
                    slot_mapping=slot_mappings,
                    batch_descriptor=batch_descriptor,
                    is_padding=is_padding,
                ):
""",
            """\
                with (
                    set_forward_context(
                        attn_metadata,
                        self.vllm_config,
                        num_tokens=num_tokens,
                        cudagraph_runtime_mode=cg_mode,
                        num_tokens_across_dp=num_tokens_across_dp,
                        slot_mapping=slot_mappings,
                        batch_descriptor=batch_descriptor,
                        is_padding=is_padding,
                    ),
                    forward_hooks.forward(
                        ForwardInfo(
                            runs_ssu=batch_runs_mamba_ssu(attn_metadata),
                            # The capture loop runs a FULL capture with
                            # cg_mode NONE, as it runs the warm-up.
                            full_cudagraph=(
                                desc.cg_mode == CUDAGraphMode.FULL and not warmup
                            ),
                        )
                    ),
                ):
""",
        ),
    ),
)

_COMMON_MESSAGE = """\
Stock FlashInferSSUBackend.__call__ launches torch.randint(0, 2**32, (1,))
before every SSU kernel when Mamba cache stochastic rounding is on: a tiny
non-PDL kernel on the critical path of every Mamba-2 layer, about 40 per
decode step on Nemotron-H. With VLLM_MAMBA_SR_SEED_PREFETCH=1 (default off)
a forward's N seeds are drawn up front, with the same generator advances in
the same order, and the k-th SSU call of the forward takes seed k; where the
seeds are drawn on a side CUDA stream, it first waits on an event that
covers seed k. Seed values are identical to stock, eagerly and over CUDA
graph replays.

- vllm/envs.py: VLLM_MAMBA_SR_SEED_PREFETCH (bool, default 0), hashed into
  the compile cache key like its neighbours.
- ssu_dispatch.py: FlashInferSSUBackend.__call__ takes rand_seed from the
  attached prefetcher and draws inline exactly as stock when none is
  attached or it has no seed for the call (outside a forward, beyond N
  calls, a DBO micro-batch); the kernel call is unchanged.
  initialize_mamba_ssu_backend attaches a prefetcher only when all hold:
  the env var is set, stochastic rounding is on, the backend is FlashInfer,
  ReplaySSM is off, the platform is CUDA and the model has no Mamba-1
  layers. N is the number of Mamba-2 layers in this rank's KV cache config.
  It logs once, naming N, when it engages, and says why not when the env
  var is set but a condition fails.
- {package}/:
  the hook contract and the prefetchers, vendored from runner_hooks by
  sr-prefetch (edit them there).
- tests/kernels/mamba/test_sr_seed_prefetch.py: eager, calls beyond N,
  CUDA graph capture and three replays, fallback outside a forward; each
  compares every seed with stock's.

Limitations: no other user of the default CUDA generator may run between
the Mamba-2 layers of a forward (true of vLLM's models today), or the seeds
shift (they stay valid random seeds). N counts every Mamba-2 layer of the
rank's KV cache config, a drafter's too: a drafter with Mamba-2 layers
would leave seeds unconsumed (a warning eagerly, an error under capture).
"""

_SUBJECT = "[Mamba] Draw a forward's stochastic-rounding seeds up front"


def _commit_message(body: str) -> str:
    """The subject and `body`, its paragraphs and "- " items refilled to 72 columns."""

    def fill(text: str, bullet: bool) -> str:
        indents = {"initial_indent": "- ", "subsequent_indent": "  "} if bullet else {}
        return textwrap.fill(" ".join(text.split()), 72, break_on_hyphens=False, **indents)

    blocks = []
    for paragraph in body.strip().split("\n\n"):
        head, *items = paragraph.split("\n- ")
        lines = [fill(head.removeprefix("- "), head.startswith("- "))]
        blocks.append("\n".join(lines + [fill(item, True) for item in items]))
    return f"{_SUBJECT}\n\n" + "\n\n".join(blocks) + "\n"


_RESET_MESSAGE = (
    _COMMON_MESSAGE
    + """
Forwards are delimited by the model runner: it owns a ForwardHooks, with
a MambaSRSeedHook registered as it is built, and runs every forward of the
target model inside forward_hooks.forward(ForwardInfo(...)). runs_ssu says
whether the batch has Mamba decode tokens (batch_runs_mamba_ssu reads one
Mamba-2 layer's metadata: false for prefill-only batches and the profile
run), micro_batched whether DBO splits it, full_cudagraph whether it is a
FULL graph capture or replay. The seeds are drawn as the forward begins,
before its first layer; for a FULL graph at the first SSU call, inside the
capture, and a replay replays them. VLLM_MAMBA_SR_SEED_DRAWER (auto,
default; kernel; randint) picks how they are drawn; envs.py declares it
next to VLLM_MAMBA_SR_SEED_PREFETCH, hashed alike. The relay is registered once, because
initialize_mamba_ssu_backend runs once per KV cache config (memory
profiling, then the real one) and replaces the prefetcher. The N seeds come
from one kernel (csrc/stock_seeds.cu, compiled on first use; a wheel build
must ship it as package data) where it builds, else from N randint calls.

Call sites, the fewest that cover every forward of the target model:
- V1 gpu_model_runner.py, execute_model: around _model_forward, next to
  set_forward_context. Every scheduled forward: eager, PIECEWISE, and FULL
  graph replay (CUDAGraphWrapper replays inside the call), micro-batched
  (UBatchWrapper splits inside the call).
- V1 gpu_model_runner.py, _dummy_run: around self.model(...). The profile
  run, warm-up, DP dummy batches and every capture (profile_run,
  capture_model and _warmup_and_capture all come here; CUDAGraphWrapper
  captures FULL graphs inside the call). The drafter's dummy_run follows,
  outside the hooks.
- V2 gpu/model_runner.py, execute_model: around the whole "Run model" block,
  so the FULL replay (run_fullgraph, no Python forward), DBO, PIECEWISE and
  eager forwards are all announced; _dummy_run (profile, warm-up, DP dummy)
  runs through execute_model too. The block is re-indented: review it with
  git show -w.
- V2 gpu/cudagraph_utils.py, ModelCudaGraphManager.capture: forward_fn
  (warm-up, PIECEWISE capture, and FULL capture, which the base loop runs
  with cg_mode NONE inside torch.cuda.graph) and ubatch_forward_fn (DBO
  FULL capture); the runner passes its hooks to capture(). Speculators
  capture through the base CudaGraphManager and run their own forwards
  outside these sites, so drafters never fire the hooks.
"""
)

_FORWARD_CONTEXT_MESSAGE = (
    _COMMON_MESSAGE
    + """
Forwards are told apart by the identity of vLLM's ForwardContext (held by
weakref): the first SSU call under a context not seen before draws that
forward's seeds. DBO micro-batches (micro-batch threads registered with
vllm.v1.worker.ubatching) draw inline. No model runner changes.
"""
)

DESIGNS: dict[str, Design] = {
    RESET: Design(
        RESET,
        "explicit reset: the model runners wrap every forward in ForwardHooks",
        (
            _RESET_ENV_EDITS,
            _RESET_SSU,
            _V1_RUNNER,
            _V2_RUNNER,
            _V2_CUDAGRAPH,
        ),
        _commit_message(_RESET_MESSAGE.replace("{package}", vendor.VENDORED_PACKAGE)),
    ),
    FORWARD_CONTEXT: Design(
        FORWARD_CONTEXT,
        "forward-context identity (the seed document's baseline): no runner edits",
        (_FORWARD_CONTEXT_ENV_EDITS, _FORWARD_CONTEXT_SSU),
        _commit_message(_FORWARD_CONTEXT_MESSAGE.replace("{package}", vendor.VENDORED_PACKAGE)),
    ),
}

PRISTINE_SHA256: dict[str, str] = {
    ENVS: "a9f665c49da1d8852c19a192f5d5848f0e38f4f56c76b5fafe0c17398945b357",
    SSU_DISPATCH: "9f1317938d29f156eefa464543bfeea6154daa24872147bd2adc9243c2de067f",
    V1_RUNNER: "3ba41733f7062b9b70801025ee263979a0b11b8c0cea418d5d18caa26de6524d",
    V2_RUNNER: "9145e2601f9e93db5e6c7e648c6741cff55f2a49f046800f79311e4977550121",
    V2_CUDAGRAPH: "1ff1655db4ca85ad2efcd8de9b3de37f053eb68d1d22202d45301c11866b0d40",
}
"""sha256 of the v0.33.0 files the designs change: outside git, a file that
differs from these has local edits."""
