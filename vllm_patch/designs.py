"""The two designs, as `sr-prefetch` presents them: a summary and the commit message.

What each design changes is in targets/ (the operations) and landing/ (the code);
what it adds is the vendored package (vendor.py) and the fork's test
(fork_test.py).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from . import vendor
from .releases import Design


@dataclass(frozen=True)
class DesignSpec:
    """How a design is described to its users."""

    design: Design
    summary: str
    commit_message: str


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
  initialize_mamba_ssu_backend, right after its early return for configs
  without Mamba layers, attaches a prefetcher only when all hold:
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
a MambaSRSeedHook registered as it is built if VLLM_MAMBA_SR_SEED_PREFETCH
is set, and runs every forward of the target model inside
forward_hooks.forward(ForwardInfo(...)). With the variable unset nothing is
registered, and the runner passes None instead of building a ForwardInfo:
forward(None) is a shared context that does nothing. runs_ssu says
whether the batch has Mamba decode tokens (batch_runs_mamba_ssu reads one
Mamba-2 layer's metadata: false for prefill-only batches and the profile
run), micro_batched whether DBO splits it, full_cudagraph whether it is a
FULL graph capture or replay. The seeds are drawn as the forward begins,
before its first layer; for a FULL graph at the first SSU call, inside the
capture, and a replay replays them. VLLM_MAMBA_SR_SEED_DRAWER (auto,
default; kernel; randint) picks how they are drawn; envs.py declares it
next to VLLM_MAMBA_SR_SEED_PREFETCH, hashed alike, and
VLLM_MAMBA_SR_SEED_CHECK (both designs) turns on the check that nothing
else draws from the generator between a forward's Mamba layers. The relay
is registered once, because
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
- V2 gpu/model_runner.py, execute_model: forward_info is built before the
  branch that replays a FULL graph or calls the model; the replay statement
  (run_fullgraph, no Python forward) runs inside the hooks, and the hooks
  join the other branch's set_forward_context (PIECEWISE, eager, DBO). Only
  the replay statement is re-indented. _dummy_run (profile, warm-up, DP
  dummy) runs through execute_model too.
- V2 gpu/cudagraph_utils.py, ModelCudaGraphManager.capture: forward_fn
  (warm-up, PIECEWISE capture, and FULL capture, which the base loop runs
  with cg_mode NONE inside torch.cuda.graph) and, where the release has
  it (0.30.0 on), ubatch_forward_fn (DBO FULL capture); the runner passes
  its hooks to capture(). Speculators
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

DESIGNS: dict[Design, DesignSpec] = {
    Design.RESET: DesignSpec(
        Design.RESET,
        "explicit reset: the model runners wrap every forward in ForwardHooks",
        _commit_message(_RESET_MESSAGE.replace("{package}", vendor.VENDORED_PACKAGE)),
    ),
    Design.FORWARD_CONTEXT: DesignSpec(
        Design.FORWARD_CONTEXT,
        "forward-context identity (the baseline): no runner edits",
        _commit_message(_FORWARD_CONTEXT_MESSAGE.replace("{package}", vendor.VENDORED_PACKAGE)),
    ),
}
