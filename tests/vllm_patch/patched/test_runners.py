"""The reset design's call sites in both model runners, driven on the CPU.

Each test runs a real runner method of the patched tree on a stand-in runner
(object.__new__ plus the attributes that method reads) up to the model call,
where a stand-in model records the forward that the runner has told the seed
prefetcher of (through ssu_dispatch.sr_seed_forward) at that moment, and stops the
method.  Taking any call site out leaves the prefetcher untold there, and its test
fails.  The stand-ins carry what either tested release
(SR_PREFETCH_PATCHED_RELEASE) reads; a case a release cannot run is skipped, naming it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from vllm.config.compilation import CUDAGraphMode
from vllm.model_executor.layers.mamba.ops import ssu_dispatch

from tests.vllm_patch.patched.conftest import at_least, only_in, since

pytestmark = only_in("reset")

if ssu_dispatch.__dict__.get("sr_seed_forward") is not None:
    from vllm.v1.worker import gpu_model_runner as v1
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu import model_runner as v2

PROBE = "model.layers.0.mixer"
FULL, PIECEWISE, NONE = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE
V2_DBO = since("0.30.0", "DBO (micro-batching) in the V2 runner")


class StopForward(Exception):
    """Raised by the stand-in model once it has seen the prefetcher's state."""


@dataclass(frozen=True)
class ForwardInfo:
    """A forward as a runner sees it: whether its batch has decode tokens, is
    micro-batched, is a FULL graph's capture or replay."""

    runs_ssu: bool
    micro_batched: bool = False
    full_cudagraph: bool = False


class ForwardHooks:
    """Stands in for the attached seed prefetcher: `current` is the forward it was
    told of (`("forward", full_cudagraph)`), None between forwards; `active`: one is
    attached (VLLM_MAMBA_SR_SEED_PREFETCH set), else sr_seed_forward does nothing."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.current: tuple[str, bool] | None = None
        self.captures: list[object] = []
        """Each forward's `captures` key, in order."""
        self.replays: list[object] = []
        """The graphs `replay` was told of, in order."""

    @contextlib.contextmanager
    def forward(self, full_cudagraph: bool = False, captures: object = None) -> Iterator[None]:
        assert self.current is None, "forwards do not nest"
        self.current = ("forward", full_cudagraph)
        self.captures.append(captures)
        try:
            yield
        finally:
            self.current = None

    def replay(self, graph: object) -> None:
        assert self.current is None, "a replay runs outside any forward"
        self.replays.append(graph)


class ModelStandIn:
    """Records `hooks.current` when called; then stops the runner, or returns `output`."""

    def __init__(self, hooks: ForwardHooks, output: torch.Tensor | None = None) -> None:
        self.hooks = hooks
        self.output = output
        self.seen: list[tuple[str, bool] | None] = []

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.seen.append(self.hooks.current)
        if self.output is None:
            raise StopForward
        return self.output


@contextlib.contextmanager
def no_context(*args: Any, **kwargs: Any) -> Iterator[None]:
    yield


def stand_in_runner(cls: type, **attributes: Any) -> Any:
    runner = object.__new__(cls)
    runner.__dict__.update(attributes)
    return runner


def metadata(decodes: int) -> dict[str, Any]:
    return {
        PROBE: SimpleNamespace(num_decodes=decodes),
        "model.layers.1.attn": object(),
    }


@pytest.fixture(autouse=True)
def probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """As initialize_mamba_ssu_backend leaves it for a model with Mamba-2 layers."""
    monkeypatch.setattr(ssu_dispatch, "_mamba2_probe_layer", PROBE)


@pytest.fixture(params=["flag-on", "flag-off"])
def hooks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> ForwardHooks:
    """The attached prefetcher (VLLM_MAMBA_SR_SEED_PREFETCH set), or none (unset)."""
    hooks = ForwardHooks(active=request.param == "flag-on")
    if hooks.active:
        monkeypatch.setattr(ssu_dispatch, "_sr_seed_prefetcher", hooks)
    return hooks


def opened(hooks: ForwardHooks, info: ForwardInfo) -> tuple[str, bool] | None:
    """What the model sees as the forward the prefetcher was told of: none without
    a prefetcher, for a prefill-only or a micro-batched forward."""
    if not hooks.active or not info.runs_ssu or info.micro_batched:
        return None
    return ("forward", info.full_cudagraph)


FORWARDS = [
    pytest.param(NONE, False, 2, id="eager-decode"),
    pytest.param(NONE, False, 0, id="eager-prefill-only"),
    pytest.param(PIECEWISE, False, 2, id="piecewise"),
    pytest.param(FULL, False, 2, id="full-graph"),
    pytest.param(FULL, True, 2, id="micro-batched"),
]


@pytest.mark.parametrize(("mode", "ubatched", "decodes"), FORWARDS)
def test_v1_execute_model(
    hooks: ForwardHooks,
    monkeypatch: pytest.MonkeyPatch,
    mode: CUDAGraphMode,
    ubatched: bool,
    decodes: int,
) -> None:
    monkeypatch.setattr(v1, "set_forward_context", no_context)
    slices = [SimpleNamespace(num_tokens=2)] * 2 if ubatched else None
    monkeypatch.setattr(v1, "maybe_create_ubatch_slices", lambda *a: (slices, slices))
    attn_metadata = [metadata(0), metadata(decodes)] if ubatched else metadata(decodes)
    model = ModelStandIn(hooks)
    runner = stand_in_runner(
        v1.GPUModelRunner,
        execute_model_state=None,
        speculative_config=None,
        synchronize_input_prep=no_context,
        _update_states=lambda scheduler_output: None,
        cache_config=SimpleNamespace(kv_sharing_fast_prefill=False, mamba_cache_mode="none"),
        # Read before the forward by 0.26.0.
        routed_experts_initialized=False,
        cascade_attn_enabled=False,
        calculate_kv_scales=False,
        input_batch=SimpleNamespace(num_reqs=2, req_ids=["a", "b"]),
        # max_num_sampled_tokens joined the returned tuple in 0.28.0.
        _prepare_inputs=lambda *a: (None, None, 1) if at_least("0.28.0") else (None, None),
        _determine_batch_execution_and_padding=lambda **kw: (
            mode,
            SimpleNamespace(num_tokens=4, num_reqs=2),
            ubatched,
            None,
            None,
        ),
        _allow_microbatching=lambda *a: ubatched,
        parallel_config=SimpleNamespace(num_ubatches=2),
        attn_groups=[],
        kv_cache_config=SimpleNamespace(kv_cache_groups=[]),
        _get_slot_mappings=lambda **kw: (None, None),
        _build_attention_metadata=lambda **kw: (attn_metadata, None),
        _preprocess=lambda *a: (None, None, None, None, {}, None),
        model_config=SimpleNamespace(is_encoder_decoder=False),
        eplb_state=None,
        _prepare_padding_mask=lambda *a: None,
        vllm_config=None,
        maybe_get_kv_connector_output=no_context,
        _model_forward=model,
    )
    scheduler_output = SimpleNamespace(
        total_num_scheduled_tokens=4,
        num_scheduled_tokens={"a": 2, "b": 2},
        scheduled_encoder_inputs={},
        scheduled_spec_decode_tokens={},
    )
    with pytest.raises(StopForward):
        runner.execute_model(scheduler_output)
    assert model.seen == [
        opened(
            hooks,
            ForwardInfo(runs_ssu=decodes > 0, micro_batched=ubatched, full_cudagraph=mode == FULL),
        )
    ]
    assert hooks.current is None


DUMMY_RUNS = [
    pytest.param(NONE, False, None, id="profile-run"),
    pytest.param(NONE, False, 2, id="warm-up"),
    pytest.param(PIECEWISE, False, 2, id="piecewise-capture"),
    pytest.param(FULL, False, 2, id="full-capture"),
    pytest.param(FULL, True, 2, id="micro-batched-capture"),
]


def v1_dummy_run_runner(
    hooks: ForwardHooks,
    monkeypatch: pytest.MonkeyPatch,
    mode: CUDAGraphMode,
    ubatched: bool,
    attn_metadata: Any,
    **attributes: Any,
) -> Any:
    """A stand-in V1 runner whose _dummy_run reaches the model call."""
    monkeypatch.setattr(v1, "set_forward_context", no_context)
    monkeypatch.setattr(v1, "prepare_dcp_dummy_context_metadata", lambda **kw: None)
    monkeypatch.setattr(v1, "get_pp_group", lambda: SimpleNamespace(is_first_rank=True))
    slices = [SimpleNamespace(num_tokens=2)] * 2 if ubatched else None
    monkeypatch.setattr(v1, "maybe_create_ubatch_slices", lambda *a: (slices, slices))
    return stand_in_runner(
        v1.GPUModelRunner,
        vllm_config=SimpleNamespace(
            model_config=SimpleNamespace(multimodal_config=None),
            parallel_config=SimpleNamespace(num_ubatches=2),
        ),
        uniform_decode_query_len=1,
        max_num_tokens=64,
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        _determine_batch_execution_and_padding=lambda **kw: (
            mode,
            SimpleNamespace(num_tokens=4, num_reqs=4),
            ubatched,
            None,
            None,
        ),
        dcp_world_size=1,
        parallel_config=SimpleNamespace(cp_kv_cache_interleave_size=1),
        _get_slot_mappings=lambda **kw: (None, None),
        synchronize_input_prep=no_context,
        optimistic_seq_lens_cpu=torch.zeros(8, dtype=torch.int32),
        seq_lens=torch.zeros(8, dtype=torch.int32),
        _get_cumsum_and_arange=lambda tokens, out: np.cumsum(tokens),
        query_pos=SimpleNamespace(np=np.zeros(64, dtype=np.int32)),
        query_start_loc=SimpleNamespace(np=np.zeros(9, dtype=np.int32), copy_to_gpu=lambda: None),
        input_batch=SimpleNamespace(block_table=SimpleNamespace(commit_block_table=lambda n: None)),
        _build_attention_metadata=lambda **kw: (attn_metadata, None),
        speculative_config=None,
        lora_config=None,
        maybe_dummy_run_with_lora=no_context,
        _init_model_kwargs=lambda *a, **kw: {},  # num_reqs= from 0.30.0
        uses_xdrope_dim=0,  # read by 0.26.0
        supports_mm_inputs=False,
        model_config=SimpleNamespace(is_encoder_decoder=False),
        enable_prompt_embeds=False,
        input_ids=SimpleNamespace(gpu=torch.zeros(64, dtype=torch.long)),
        uses_mrope=False,
        positions=torch.zeros(64, dtype=torch.long),
        _prepare_padding_mask=lambda *a: None,
        maybe_randomize_inputs=no_context,
        **attributes,
    )


@pytest.mark.parametrize(("mode", "ubatched", "decodes"), DUMMY_RUNS)
def test_v1_dummy_run(
    hooks: ForwardHooks,
    monkeypatch: pytest.MonkeyPatch,
    mode: CUDAGraphMode,
    ubatched: bool,
    decodes: int | None,
) -> None:
    if decodes is None:
        attn_metadata = None
    else:
        attn_metadata = [metadata(decodes)] * 2 if ubatched else metadata(decodes)
    model = ModelStandIn(hooks)
    runner = v1_dummy_run_runner(hooks, monkeypatch, mode, ubatched, attn_metadata, model=model)
    with pytest.raises(StopForward):
        runner._dummy_run(
            4,
            cudagraph_runtime_mode=mode,
            is_profile=decodes is None,
            force_attention=decodes is not None,
            uniform_decode=decodes is not None,
        )
    assert model.seen == [
        opened(
            hooks,
            ForwardInfo(
                runs_ssu=bool(decodes), micro_batched=ubatched, full_cudagraph=mode == FULL
            ),
        )
    ]
    assert hooks.current is None


def test_v1_the_drafters_dummy_run_is_outside_the_hooks(
    hooks: ForwardHooks, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ModelStandIn(hooks, output=torch.zeros(4, 2))
    drafter = object.__new__(v1.EagleProposer)
    drafter.dummy_run = ModelStandIn(hooks)  # type: ignore[method-assign]
    runner = v1_dummy_run_runner(
        hooks,
        monkeypatch,
        NONE,
        False,
        metadata(2),
        model=model,
        drafter=drafter,
        use_aux_hidden_state_outputs=False,
        compilation_config=SimpleNamespace(cudagraph_specialize_lora=False),
    )
    runner.speculative_config = SimpleNamespace(
        use_eagle=lambda: True,
        uses_draft_model=lambda: False,
        uses_extract_hidden_states=lambda: False,
        enforce_eager=True,
    )
    with pytest.raises(StopForward):
        runner._dummy_run(4, force_attention=True, uniform_decode=True)
    assert model.seen == [opened(hooks, ForwardInfo(runs_ssu=True))]
    assert drafter.dummy_run.seen == [None]


V2_FORWARDS = [
    *FORWARDS[:-1],
    pytest.param(NONE, True, 2, id="micro-batched-eager", marks=V2_DBO),
    pytest.param(FULL, True, 2, id="micro-batched-full-graph", marks=V2_DBO),
]
"""A FULL graph (micro-batched or not) is replayed outside the hooks: a replay runs no
Python, and the prefetcher has nothing to do for it (its draws are in the graph)."""


def descriptor(mode: CUDAGraphMode, num_reqs: int, ubatched: bool) -> Any:
    """A BatchExecutionDescriptor; num_ubatches only where DBO exists (0.30.0 on)."""
    return cudagraph_utils.BatchExecutionDescriptor(
        cg_mode=mode, num_tokens=4, num_reqs=num_reqs, **({"num_ubatches": 2} if ubatched else {})
    )


@pytest.mark.parametrize(("mode", "ubatched", "decodes"), V2_FORWARDS)
def test_v2_execute_model(
    hooks: ForwardHooks,
    monkeypatch: pytest.MonkeyPatch,
    mode: CUDAGraphMode,
    ubatched: bool,
    decodes: int,
) -> None:
    model = ModelStandIn(hooks)
    desc = descriptor(mode, 2, ubatched)
    monkeypatch.setattr(v2, "set_forward_context", no_context)
    monkeypatch.setattr(v2, "dispatch_cg_and_sync_dp", lambda *a, **kw: (desc, None))
    monkeypatch.setattr(v2, "build_slot_mappings_by_layer", lambda *a: {})
    dummy_batch = SimpleNamespace(
        input_ids=None,
        positions=None,
        num_tokens=4,
        num_tokens_after_padding=4,
        is_padding=None,
    )
    monkeypatch.setattr(v2.InputBatch, "make_dummy", lambda *a, **kw: dummy_batch)
    contexts = [SimpleNamespace(attn_metadata=metadata(d)) for d in (0, decodes)]
    ubatch_state = SimpleNamespace(
        slices=[SimpleNamespace(num_tokens=2)] * 2, forward_contexts=contexts
    )
    runner = stand_in_runner(
        v2.GPUModelRunner,
        gather_batch_req_state=lambda *a: (None, None),
        lora_config=None,
        is_encoder_decoder=False,
        cudagraph_manager=SimpleNamespace(
            run_fullgraph=model, run_pw_graph=lambda m, inputs: model()
        ),
        parallel_config=SimpleNamespace(data_parallel_size=1, data_parallel_rank=0),
        # Read by 0.26.0.
        dp_size=1,
        dp_rank=0,
        supports_mm_inputs=False,
        ubatch_runner=SimpleNamespace(
            prepare=lambda *a, **kw: ubatch_state, run=lambda *a: model()
        ),
        decode_query_len=1,
        input_buffers=None,
        pcp_manager=None,
        prepare_dummy_attn=lambda *a: ([], []),
        dcp_size=1,
        attn_groups=[],
        model_state=SimpleNamespace(
            prepare_attn=lambda *a, **kw: metadata(decodes),
            prepare_inputs=lambda *a: {},
        ),
        kv_cache_config=None,
        uses_inputs_embeds=False,
        req_states=None,
        is_first_pp_rank=True,
        eplb=SimpleNamespace(prepare_forward=lambda *a: None),
        model_config=None,
        step_timing=SimpleNamespace(record_batch=lambda *a: None, forward_start=lambda: None),
        kv_connector=SimpleNamespace(pre_forward=lambda *a, **kw: None),
        vllm_config=None,
        model=model,
    )
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens={"_dummy_req_0": 2, "_dummy_req_1": 2},
        total_num_scheduled_tokens=4,
        skip_drafts=False,
        scheduled_encoder_inputs={},
    )
    with pytest.raises(StopForward):
        runner.execute_model(scheduler_output, dummy_run=True)
    if mode == FULL:
        # No forward around the replay; its seeds are drawn before it, by key.
        assert model.seen == [None]
        assert hooks.replays == ([desc] if hooks.active else [])
    else:
        assert model.seen == [
            opened(hooks, ForwardInfo(runs_ssu=decodes > 0, micro_batched=ubatched))
        ]
    assert hooks.current is None


def fake_capture_loop(calls: list[tuple[str, CUDAGraphMode]]) -> Callable[..., None]:
    """CudaGraphManager.capture's loop, less CUDA: warm-up, then the capture."""

    def capture(self: Any, create_forward_fn: Callable[..., Any], progress_bar_desc: str) -> None:
        for mode, descs in self._capture_descs.items():
            for desc in descs:
                create_forward_fn(desc, warmup=True)(NONE)
                calls.append(("warm-up", mode))
                if mode == PIECEWISE:
                    create_forward_fn(desc, warmup=True)(PIECEWISE)
                else:
                    # A FULL capture runs the forward with NONE inside torch.cuda.graph.
                    create_forward_fn(desc, warmup=False)(NONE)
                calls.append(("capture", mode))

    return capture


PIECEWISE_CAPTURE_SKIPS_ATTN = not at_least("0.27.0")
"""Through 0.26.0 a PIECEWISE capture without breakable CUDA graphs builds no attention
metadata (prepare_inputs_to_capture's skip_attn): its forward calls no SSU."""


@pytest.mark.parametrize(
    ("mode", "ubatched", "breakable"),
    [
        pytest.param(PIECEWISE, False, False, id="piecewise"),
        pytest.param(PIECEWISE, False, True, id="piecewise-breakable"),
        pytest.param(FULL, False, False, id="full"),
        pytest.param(FULL, True, False, id="micro-batched-full", marks=V2_DBO),
    ],
)
def test_v2_cudagraph_capture(
    hooks: ForwardHooks,
    monkeypatch: pytest.MonkeyPatch,
    mode: CUDAGraphMode,
    ubatched: bool,
    breakable: bool,
) -> None:
    model = ModelStandIn(hooks, output=torch.zeros(4, 2))
    calls: list[tuple[str, CUDAGraphMode]] = []
    monkeypatch.setattr(cudagraph_utils.CudaGraphManager, "capture", fake_capture_loop(calls))
    monkeypatch.setattr(cudagraph_utils, "set_forward_context", no_context)
    monkeypatch.setattr(
        cudagraph_utils,
        "prepare_inputs_to_capture",
        lambda *a, skip_attn=False, **kw: cudagraph_utils.AttentionState(
            None if skip_attn else metadata(2), {}
        ),
    )
    monkeypatch.setattr(cudagraph_utils.InputBatch, "make_dummy", lambda *a, **kw: None)
    contexts = [SimpleNamespace(attn_metadata=metadata(2))] * 2
    desc = descriptor(mode, 4, ubatched)
    manager = stand_in_runner(
        cudagraph_utils.ModelCudaGraphManager,
        use_breakable_cg=breakable,
        breakable_cg_runner=model if breakable else None,
        cudagraph_mode=mode,
        max_num_reqs=4,
        vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=1)),
        dp_size=1,  # an attribute through 0.31.0, then a property of vllm_config
        is_first_pp_rank=True,
        is_last_pp_rank=True,
        hidden_states=None,
        aux_hidden_states=[],
        _capture_descs={mode: [desc]},
        ubatch_runner=SimpleNamespace(
            prepare=lambda *a, **kw: SimpleNamespace(forward_contexts=contexts),
            begin_capturable_run=lambda *a, **kw: model,
        ),
    )
    if mode == PIECEWISE and not breakable and at_least("0.30.0"):
        # From 0.30.0 capture refuses PIECEWISE for a model with no compiled submodule.
        monkeypatch.setattr(cudagraph_utils, "has_compiled_submodule", lambda m: True)
    input_buffers = SimpleNamespace(
        input_ids=torch.zeros(4, dtype=torch.long),
        positions=torch.zeros(4, dtype=torch.long),
        is_padding=torch.zeros(4, dtype=torch.bool),
    )
    manager.capture(
        model,
        SimpleNamespace(prepare_dummy_inputs=lambda *a: {}),
        input_buffers,
        None,
        SimpleNamespace(
            get_dummy_block_tables=lambda n: [],
            get_dummy_slot_mappings=lambda n: [],
            cp_size=1,
        ),
        [],
        None,
    )
    runs_ssu = not (mode == PIECEWISE and not breakable and PIECEWISE_CAPTURE_SKIPS_ATTN)
    assert calls == [("warm-up", mode), ("capture", mode)]
    if ubatched:
        # The DBO capture stays outside the hooks: a micro-batched forward draws inline.
        assert model.seen == [None, None]
    else:
        # Both forwards name the graph; the prefetcher records what a forward begun
        # inside torch.cuda.graph (the FULL capture) took, for its replays.
        assert model.seen == [opened(hooks, ForwardInfo(runs_ssu=runs_ssu))] * 2
        if hooks.active and runs_ssu:
            assert hooks.captures == [desc, desc]
