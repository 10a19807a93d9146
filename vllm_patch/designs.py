"""The two designs, as `sr-prefetch` presents them: a summary, and the commit message
of a release's patch, written as the description of a vLLM pull request.

The message argues its case in sections (Overview, Design, Claims, Validation,
Limitations, the open question of the gate, the build), then lists what the
patch does.  The lists are derived from what makes the patch: the operations of
targets/ (each one's `why`, and the call site it hooks), the variable that
landing/envs.py declares, and the files the patch adds, with their own
docstrings.  The prose is written by hand, but:

- every figure it quotes is read from a committed results file (evidence.py),
  and the message says where and how it was measured, never the file;
- it names no vLLM file, class or function that the derived lists do not name
  (what it says of the build, of the added test and of ReplaySSM is chosen by
  what the patch adds and what the release has);
- it names nothing of this repository: it is vLLM's pull request.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

from . import evidence, fork_test, targets
from .releases import Design, Release
from .syntax import AddImportedNames, FileOperations, InsertStatements, Operation, each_edit
from .targets import envs


@dataclass(frozen=True)
class DesignSpec:
    """How a design is described to its users."""

    design: Design
    summary: str


DESIGNS: dict[Design, DesignSpec] = {
    Design.RESET: DesignSpec(
        Design.RESET,
        "the model runners tell the seed prefetcher where each forward begins and ends",
    ),
    Design.FORWARD_CONTEXT: DesignSpec(
        Design.FORWARD_CONTEXT,
        "a forward is told apart by the identity of vLLM's ForwardContext: no runner edits",
    ),
}

TAG = "[Perf]"
"""The subject's tag, one vLLM's pull requests use: `git am` drops a leading `[...]`
unless given --keep-non-patch (the command export prints does)."""

_SUBJECTS = {
    True: f"{TAG} Draw a forward's Mamba stochastic-rounding seeds in one kernel",
    False: f"{TAG} Draw a forward's Mamba stochastic-rounding seeds up front",
}


def subject(added: Mapping[str, bytes]) -> str:
    """The subject line: "in one kernel" where the patch adds a Triton kernel (the seed
    kernel), "up front" where the seeds are drawn with torch.randint."""
    return _SUBJECTS[_adds_kernel(added)]


def subject_tag(design: Design) -> str:
    """The tag of the subject of `design`'s patch."""
    return TAG


_WIDTH = 72

FOREIGN_NAMES = (
    "sr-prefetch",
    "sr_prefetch",
    "runner_hooks",
    "vllm_patch",
    "seed document",
    "bench/",
    "tests/gpu",
    "floor-rng",
    "off the critical path",
    "env vars",
)
"""What the message never says: this repository's names (it is vLLM's pull request),
and two claims that would be false (the kernel runs on the forward's stream; there is
one variable)."""

_TIME = "median [95% CI]"
_SAVED = "saved vs stock [95% CI]"
_VS_SINGLE = "recovered vs floor-rng [95% CI]"
_DECODE = ((evidence.DECODE, ("v1, replay", "v2, replay")),)
_MTP = (
    (evidence.MTP3, ("v1, replay", "v2, replay")),
    (evidence.MTP7, ("v1, replay",)),
)
_MIXED = (
    (evidence.MIXED_V1, ("v1, forward-gpu",)),
    (evidence.MIXED_V2, ("v2, forward-gpu",)),
)


def figures(design: Design) -> dict[str, evidence.Figure]:
    """Every figure the message of `design` quotes, by the name its prose uses, each
    read from its committed file."""
    e = evidence
    found = {
        "layers": e.quote(e.MTP_RUN, r"(\d+) Mamba-2 layers", 1),
        "steps": e.quote(e.IDENTITY_PLAIN, r"(\d+) / \d+", 1),
        "decode_steps": e.quote(e.IDENTITY_PLAIN, r"\d+ / (\d+)", 1),
        "tokens": e.quote(e.MTP_RUN, r"(\d+)-token steps", 1),
        "decode_stock": e.column_span(_DECODE, "stock", _TIME),
        "decode_no_draws": e.column_span(_DECODE, e.NO_DRAW_ARM, _SAVED),
        "decode_one_draw": e.column_span(_DECODE, e.SINGLE_DRAW_ARM, _SAVED),
        "decode_rounds": e.column_span(_DECODE, "stock", "n"),
        "mtp_stock": e.column_span(_MTP, "stock", _TIME),
        "mtp_one_draw": e.column_span(_MTP, e.SINGLE_DRAW_ARM, _SAVED),
        "mtp_rounds": e.column_span(_MTP, "stock", "n"),
        "mixed_stock": e.column_span(_MIXED, "stock", _TIME),
        "mixed_no_draws": e.column_span(_MIXED, e.NO_DRAW_ARM, _SAVED),
        "mixed_one_draw": e.column_span(_MIXED, e.SINGLE_DRAW_ARM, _SAVED),
        "identity_plain": e.count(e.IDENTITY_PLAIN_LOG, "passed"),
        "identity_020": e.count(e.IDENTITY_020_LOG, "passed"),
        "fork_passed": e.count(e.FORK_TEST_026_LOG, "passed", design.value),
        "fork_skipped": e.count(e.FORK_TEST_026_LOG, "skipped", design.value),
    }
    if design is Design.RESET:
        found |= {
            "identity_serving": e.count(e.IDENTITY_SERVING_LOG, "passed"),
            "identity_reshape": e.count(e.IDENTITY_RESHAPE_LOG, "passed"),
            "identity_reshape_v2": e.count(e.IDENTITY_RESHAPE_V2_LOG, "passed"),
            "identity_triton": e.count(e.IDENTITY_TRITON_LOG, "passed"),
            "decode_saved": e.column_span(_DECODE, e.DEFAULT_ARM, _SAVED),
            "decode_vs_one_draw": e.column_span(_DECODE, e.DEFAULT_ARM, _VS_SINGLE),
            "mtp_saved": e.column_span(_MTP, e.DEFAULT_ARM, _SAVED),
            "mixed_saved": e.column_span(_MIXED, e.DEFAULT_ARM, _SAVED),
        }
    else:
        found["mtp_saved"] = e.column_span(_MTP, e.FORWARD_CONTEXT_ARM, _SAVED)
    return found


MEASURED = (
    "on one H200 with vLLM 0.26.0, on a single-GPU model with the layer shapes of "
    "one TP4 rank of Nemotron 3 Super ({layers} Mamba-2 layers, random weights)"
)
"""Where every figure was measured, in words (the message names no results file)."""

WHERE = "on one H200 with vLLM 0.26.0"
"""MEASURED once it has been said."""


def commit_message(
    design: Design,
    release: Release,
    originals: Mapping[str, str],
    added: Mapping[str, bytes],
) -> str:
    """The commit message of `design`'s patch on `release`: a pull-request description.

    originals: the release's text of each file the design's operations change; added:
    the files the patch adds (path -> content), as patch.py makes them.
    """
    derived = _derived_blocks(design, release, originals, added)
    derived_text = " ".join(" ".join(derived).split())
    facts = _Facts(design, release, originals, added, derived_text)
    f = {name: str(figure) for name, figure in figures(design).items()}
    f["measured"] = MEASURED.format(**f)
    f["where"] = WHERE
    # The sections of vLLM's pull-request template (.github/PULL_REQUEST_TEMPLATE.md),
    # Details split by topic, then what AGENTS.md asks of an AI-assisted PR.
    blocks = [
        *_section("Overview", _overview(facts), f),
        *_section("Claims", _claims(facts), f),
        *_section("Validation", _validation(facts), f),
        *_section("Details", _design(facts), f),
        *_section("Limitations", _limitations(facts), f),
        *_section("Gating: opt-in, or on by default?", _gating(facts), f),
        *(_section("Build", _build(facts), f) if facts.kernel else []),
        *_section("Duplicate-work check", _duplicates(), f),
        *_section("AI assistance", _assistance(), f),
        *derived,
    ]
    return f"{subject(added)}\n\n" + "\n\n".join(_refill(block) for block in blocks) + "\n"


@dataclass(frozen=True)
class _Facts:
    """What the prose may say of one patch: read off its design, the release, and what
    the derived lists name."""

    design: Design
    release: Release
    originals: Mapping[str, str]
    added: Mapping[str, bytes]
    derived: str
    """The derived blocks' text, whitespace joined: a name the prose uses must be here."""

    @property
    def kernel(self) -> bool:
        return _adds_kernel(self.added)

    def names(self, name: str) -> bool:
        """Whether the derived lists name `name` (a file, class, function or target)."""
        return re.search(rf"(?<![\w/.]){re.escape(name)}(?!\w)", self.derived) is not None

    @property
    def tests(self) -> list[str]:
        """The tests the patch adds, where it adds them (a source tree)."""
        return [path for path in fork_test.PATHS if path in self.added]

    @property
    def replayssm(self) -> list[str]:
        """The release's ReplaySSM paths, which the added test covers there: FlashInfer's
        (0.30.0 on), the Triton kernel's wrapper (0.27.0 on)."""
        found = []
        if _FLASHINFER_REPLAYSSM in self.originals.get(targets.ssu_dispatch.PATH, ""):
            found.append("FlashInfer's ReplaySSM call")
        if self.release.has_file(targets.replayssm_triton.PATH):
            found.append("the Triton ReplaySSM kernel's wrapper")
        return found


_FLASHINFER_REPLAYSSM = "def selective_state_update_replayssm_flashinfer("
"""How a release's ssu_dispatch.py has FlashInfer's ReplaySSM call (the added test
skips that path where the module lacks it)."""


def _adds_kernel(added: Mapping[str, bytes]) -> bool:
    """Whether a module the patch adds defines a Triton kernel (`@triton.jit`)."""
    return any(
        path.endswith(".py") and _defines_triton_kernel(data) for path, data in added.items()
    )


def _defines_triton_kernel(data: bytes) -> bool:
    """Whether the module's text has a function decorated with `triton.jit` (called or
    not)."""
    for node in ast.walk(ast.parse(data.decode("utf-8"))):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(called) == "triton.jit":
                    return True
    return False


def _section(heading: str, paragraphs: list[str], f: Mapping[str, str]) -> list[str]:
    return [heading, *(paragraph.format(**f) for paragraph in paragraphs)]


def _overview(facts: _Facts) -> list[str]:
    return [
        "With --enable-mamba-cache-stochastic-rounding, the FlashInfer and Triton "
        "Mamba SSU backends draw every call's seed with torch.randint(0, 2**32, (1,)) "
        "right before the SSU kernel: one RNG kernel launch per Mamba-2 layer and "
        "forward, {layers} per decode step on Nemotron 3 Super.",
        "What that costs, measured {measured}: removing the draws altogether (a fixed "
        "seed, which changes the output) makes a decode step under CUDA graphs "
        "{decode_no_draws} µs faster, of {decode_stock} µs, and a mixed prefill/decode "
        "step under PIECEWISE graphs, where the SSU and its draws run eagerly between the "
        "graphs, {mixed_no_draws} µs faster, of {mixed_stock} µs.",
        (
            "This change draws a forward's N seeds in one kernel launch instead, with "
            "the values and the generator advance of N stock draws, so turning it on "
            "changes no output."
            if facts.kernel
            else "This change draws a forward's N seeds up front instead, with the "
            "values and the generator advance of N stock draws, so turning it on "
            "changes no output."
        ),
    ]


def _design(facts: _Facts) -> list[str]:
    if facts.design is Design.RESET:
        return [
            "Once per forward, each model runner tells the SSU dispatch module whether "
            "the forward runs the SSU (its batch has decode tokens), whether it is "
            "micro-batched, and whether it captures or replays a FULL CUDA graph. N is "
            "the number of Mamba-2 layers in the KV cache config, and the k-th SSU call "
            "of a forward takes seed k.",
            "One Triton kernel launch draws all N seeds of a forward into one "
            "persistent buffer: it writes the N values those draws would return, "
            "computed with tl.philox from the default CUDA generator's seed and Philox "
            "offset, and the offset advances by 4*N at once, exactly as N stock draws "
            "advance it. It runs on the forward's own stream as the forward begins, so "
            "the seeds are written before any SSU kernel of the forward reads them, "
            "with no side stream and no event.",
            "No CUDA graph draws. A FULL graph's SSU calls read the buffer, and its "
            "seeds are drawn before each replay: V1's runner opens the forward outside "
            "the graph wrapper's replay, and V2's execute_model draws them just before "
            "it replays the graph. So a replay advances the generator as stock's graph does, "
            "without the replay prologue torch runs for a graph that draws. A capture "
            "leaves the generator where stock's does: a forward begun inside the capture "
            "(V2) draws nothing, and one whose capture began after it (V1) has its "
            "draws taken back from the generator's offset as it ends.",
            "Calls beyond N, calls outside a forward, and prefill-only and "
            "micro-batched (DBO) forwards draw inline exactly as stock, after any "
            "seeds drawn ahead, so the generator's order stays stock's.",
        ]
    return [
        "No model runner changes. The SSU dispatch module recognises a forward at its "
        "first SSU call by the identity of the current forward context; N is the "
        "number of Mamba-2 layers in the KV cache config, and the k-th SSU call of a "
        "forward takes seed k.",
        "At that first call, the N stock draws (the same shape, dtype, device and "
        "order as stock's torch.randint calls) run on a side stream, each followed by "
        "an event; the k-th SSU call makes the forward's stream wait on the k-th "
        "event. The generator advances exactly as N stock draws do.",
        "Calls beyond N, calls outside a forward context and micro-batched (DBO) "
        "forwards draw inline exactly as stock.",
    ]


def _claims(facts: _Facts) -> list[str]:
    if facts.design is Design.RESET:
        saved = (
            "- Measured {where}: {decode_saved} µs saved per decode step under "
            "FULL_AND_PIECEWISE CUDA graphs, {mtp_saved} µs per MTP verify iteration, "
            "and {mixed_saved} µs per mixed prefill/decode step under PIECEWISE graphs "
            "(Validation)."
        )
        launches = "- One kernel launch per forward instead of N torch.randint launches."
    else:
        saved = (
            "- Measured {where}: {mtp_saved} µs saved per MTP verify iteration "
            "under FULL_AND_PIECEWISE CUDA graphs (Validation)."
        )
        launches = "- The N torch.randint launches move to a side stream."
    return [
        "\n".join(
            [
                "- Seed values bit-identical to stock's, eagerly and over CUDA-graph "
                "replays, so the outputs are stock's.",
                launches,
                saved,
                "- Opt-in: VLLM_MAMBA_SR_SEED_PREFETCH=1 (default 0). No effect without "
                "--enable-mamba-cache-stochastic-rounding and the FlashInfer or Triton "
                "SSU backend; unset, nothing is attached and every SSU call draws as "
                "stock.",
            ]
        )
    ]


def _validation(facts: _Facts) -> list[str]:
    reset = facts.design is Design.RESET
    paragraphs = [
        "Identity with stock, {where} and the same model: each arm (stock, stock again, this "
        "change, and a control given one wrong seed) ran as a vLLM LLM in a process of "
        "its own, stepped one engine step at a time through the same workload of {steps} "
        "steps ({decode_steps} with decodes), with Inductor's deterministic mode and "
        "torch's deterministic algorithms; a pytest over the engines' records then "
        "compares the fp16 SSM state of every Mamba-2 layer after every step, the "
        "token ids and the logprobs with stock's.\n"
        "- V1 and V2 model runners, eager and FULL_AND_PIECEWISE: identical to stock in "
        "every cell, stock again identical, the control different from the first step "
        "with decodes ({identity_plain} passed).\n"
        + (
            "- FULL_AND_PIECEWISE on both runners with MTP (K=3, K=7; the drafter's "
            "random weights accept no draft), prefix caching in align mode, and MTP K=7 "
            "with async scheduling and prefix caching together: identical "
            "({identity_serving} passed).\n"
            if reset
            else ""
        )
        + "- vLLM 0.20.0, the V1 runner (its V2 runner refuses hybrid models), eager "
        "and FULL_AND_PIECEWISE"
        + (", and MTP K=7 with async scheduling and prefix caching" if reset else "")
        + ": identical ({identity_020} passed)."
        + (
            "\n- This change after a reshape (the rows above ran it before, with the "
            "same draw order): the V1 and V2 runners, eager and FULL_AND_PIECEWISE, "
            "identical, the control different ({identity_reshape} passed on V1, "
            "{identity_reshape_v2} on V2)."
            "\n- This change as it is, its seeds drawn by the Triton kernel: the V1 and "
            "V2 runners, FULL_AND_PIECEWISE, identical, the control different "
            "({identity_triton} passed, on one H100)."
            if reset
            else ""
        ),
    ]
    paragraphs.append(_added_test(facts))
    how = (
        "Timing, {where} and the same model, by a pytest-benchmark run over the same kind of "
        "engines, one per arm: the GPU time of each step's CUDA-graph replays (CUDA "
        "events around each replay, behind a spin so that no host time is counted), "
        "or of the whole forward for mixed steps; medians over rounds in which the "
        "arms run interleaved in a shuffled order. The least a "
        "stock-identical path can cost under CUDA graphs is one draw per forward (a "
        "graph that draws at all pays torch's replay prologue), so each figure is set "
        "beside what that single draw saves."
    )
    if reset:
        timings = [
            "- Decode steps, FULL_AND_PIECEWISE, BS 1, 2, 4 and 8, V1 and V2 runners, "
            "{decode_rounds} rounds: {decode_saved} µs saved of {decode_stock} µs "
            "(a single draw: {decode_one_draw} µs; {decode_vs_one_draw} of it).",
            "- MTP verify iterations, K=3 on V1 and V2, K=7 on V1, {mtp_rounds} "
            "rounds: {mtp_saved} µs saved of {mtp_stock} µs (a single draw: "
            "{mtp_one_draw} µs). A verify forward calls each SSU once whatever K is.",
            "- Mixed steps under PIECEWISE graphs, {tokens}-token steps of BS 1, 2 and "
            "4 decodes beside a prefill chunk, new engines every round: {mixed_saved} "
            "µs saved of {mixed_stock} µs (a single draw: {mixed_one_draw} µs).",
        ]
    else:
        timings = [
            "- MTP verify iterations, K=3 on V1 and V2, K=7 on V1, {mtp_rounds} "
            "rounds: {mtp_saved} µs saved of {mtp_stock} µs (a single draw: "
            "{mtp_one_draw} µs). Decode and mixed steps were not timed for this design.",
        ]
    paragraphs.append(how + "\n" + "\n".join(timings))
    return paragraphs


def _added_test(facts: _Facts) -> str:
    """What the added tests cover in this release, and where they have run."""
    calls = ["the FlashInfer SSU backend"]
    if "FlashInfer's ReplaySSM call" in facts.replayssm:
        calls.append("FlashInfer's ReplaySSM call")
    named = [path for path in facts.tests if facts.names(path)]
    lines = [
        f"Tests{' (' + ', '.join(named) + ')' if named else ''}: each seed that "
        f"{_joined(calls, 'and')} hand their kernel, recorded through FlashInfer's public "
        "kernel function, against stock's torch.randint draws from the same generator "
        "state: eager forwards, calls beyond N, CUDA-graph capture and three replays, "
        "and calls outside a forward; on Blackwell, the Triton SSU's fp16 state against "
        "stock's bit for bit."
    ]
    if facts.design is Design.RESET:
        lines.append(
            "Without CUDA, the prefetcher's forward logic. Through an engine, on both "
            "model runners under CUDA graphs: a 12-layer hybrid model samples the same "
            "tokens with the same logprobs with the variable set as without it, and "
            "not under another engine seed."
        )
    if "the Triton ReplaySSM kernel's wrapper" in facts.replayssm:
        lines.append(
            "The Triton ReplaySSM kernel's wrapper is not covered: its kernel rounds "
            "stochastically only on Blackwell."
        )
    run = f" Run them with: pytest {' '.join(named)}." if named else ""
    lines.append(
        f"On one H200 against vLLM 0.26.0: {{fork_passed}} passed, {{fork_skipped}} "
        f"skipped (the Blackwell-only case).{run}"
    )
    return " ".join(lines)


def _limitations(facts: _Facts) -> list[str]:
    reset = facts.design is Design.RESET
    items = [
        "- Seeds equal stock's only while nothing else draws from the default CUDA "
        "generator between the Mamba layers of a forward. vLLM's models do not; MoE "
        "routing simulation does, so the feature stays off while it is set.",
        (
            "- Micro-batched (DBO) and prefill-only forwards draw as stock."
            if reset
            else "- Micro-batched (DBO) forwards draw as stock."
        ),
        "- Off for models with Mamba-1 layers and on non-CUDA platforms; the log says "
        "why when the variable is set but unused.",
        "- Measured on one GPU: tensor parallelism is not measured, nor a real "
        "checkpoint (the model has random weights), nor the Triton SSU kernel, whose "
        "stochastic rounding needs Blackwell.",
    ]
    if reset and facts.kernel:
        items.append(
            "- The engine runs above but the last, and the timings, drew the seeds with "
            "a compiled CUDA op of the same Philox arithmetic, which the Triton kernel "
            "replaces; the kernel's own timing in the engine is not measured yet."
        )
    return ["\n".join(items)]


def _gating(facts: _Facts) -> list[str]:
    untested = ["tensor parallelism", "the Triton SSU kernel on Blackwell"]
    if facts.replayssm:
        untested.append("ReplaySSM on a GPU")
    flip = [
        "under tensor parallelism",
        "with the Triton SSU kernel on Blackwell (bit for bit against stock's fp16 state)",
    ]
    if facts.replayssm:
        flip.append("with ReplaySSM on a GPU")
    return [
        "This PR keeps VLLM_MAMBA_SR_SEED_PREFETCH opt-in (default 0). The seeds are "
        "bit-identical to stock's, and the engines above matched stock step by step in "
        "every Mamba-2 layer's SSM state, token ids and logprobs, so turning it on by "
        "default would change no output. But the evidence covers one GPU, random "
        "weights, vLLM 0.26.0 and 0.20.0, and the FlashInfer SSU only; it does not "
        f"cover {_joined(untested, 'or')}. Opt-in lets the users of those configurations "
        "compare before it is everyone's default.",
        "The variable is left out of the compile cache hash: it decides at run time "
        "where the seeds are drawn, inside the Mamba mixer's custom op and the model "
        "runners, which torch.compile does not trace, so toggling it keeps the "
        "torch.compile cache and trying it costs no recompilation. The engine test "
        "shows it: on each runner, the engine with the variable set loads the "
        'graphs the stock engine before it compiled ("Directly load" in its log).',
        "Flip the default, and drop the variable, once the identity check has passed "
        f"{_joined(flip, 'and')}.",
    ]


def _duplicates() -> list[str]:
    return [
        "Every release from 0.20.0 to 0.33.0 still draws each SSU call's seed with "
        "its own torch.randint (the patch finds that draw in each), so no merged PR "
        "does this. Open PRs and issues: the submitter runs gh pr list --repo "
        'vllm-project/vllm --state open --search "stochastic rounding seed" (and '
        '"mamba randint") before opening, and links any overlap here.'
    ]


def _assistance() -> list[str]:
    return [
        "AI assistance was used to write this change, its tests and this "
        "description. The submitter has reviewed every changed line and run the "
        "tests named under Validation."
    ]


def _joined(items: list[str], conjunction: str) -> str:
    """The items as "a, b and c" (or "or")."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def _build(facts: _Facts) -> list[str]:
    return [
        "Nothing to build: the seeds are drawn by one Triton kernel outside every CUDA "
        "graph, its values computed from the default CUDA generator's seed and offset "
        "with tl.philox. The change adds no compiled op, no CUDA source and no build "
        "step, and nothing of it depends on torch's C++ ABI."
    ]


def _derived_blocks(
    design: Design,
    release: Release,
    originals: Mapping[str, str],
    added: Mapping[str, bytes],
) -> list[str]:
    """The lists derived from the edits: the variable, the files changed (each edit's
    why), the call sites hooked, the files added (each one's docstring)."""
    declarations = envs.declarations(design)
    blocks = [
        (
            "Environment variable (vllm/envs.py):"
            if len(declarations) == 1
            else "Environment variables (vllm/envs.py):"
        )
        + "".join(f"\n- {declaration}" for declaration in declarations)
    ]
    changed: list[str] = []
    sites: dict[str, None] = {}  # in order, once each
    for file_ops in targets.file_operations(design, release):
        effective = effective_operations(originals[file_ops.path], file_ops)
        if not effective:
            continue
        whys = [op.why for op in effective if not _only_imports(op)]
        changed.append(f"- {file_ops.path}: {'; '.join(whys or [op.why for op in effective])}.")
        sites.update((str(op.site), None) for op in effective if op.site is not None)
    blocks.append("Changed:\n" + "\n".join(changed))
    if sites:
        blocks.append("Call sites the model runners hook:\n" + "\n".join(f"- {s}" for s in sites))
    blocks.append(
        "Added:\n" + "\n".join(_added_item(path, data) for path, data in sorted(added.items()))
    )
    return blocks


def effective_operations(text: str, file_ops: FileOperations) -> list[Operation]:
    """The operations of `file_ops` that change `text`, applied in order (an operation
    that holds only in some releases, syntax.OnlyWhere, changes nothing in the others)."""
    effective = []
    for edit in each_edit(text, file_ops):
        if edit.error is not None:
            raise edit.error
        if edit.text != edit.source.text:
            effective.append(edit.operation)
    return effective


def _only_imports(operation: Operation) -> bool:
    """Whether `operation` only imports names (left out of the message's lines)."""
    if isinstance(operation, AddImportedNames):
        return True
    if not isinstance(operation, InsertStatements) or callable(operation.code):
        return False
    try:
        body = ast.parse(textwrap.dedent(operation.code)).body
    except SyntaxError:  # a fragment, such as a dict's entries
        return False
    return bool(body) and all(isinstance(node, ast.Import | ast.ImportFrom) for node in body)


def _added_item(path: str, data: bytes) -> str:
    """`- path`, with the first paragraph of its docstring where it is a Python module."""
    summary = ""
    if path.endswith(".py"):
        docstring = ast.get_docstring(ast.parse(data.decode("utf-8")))
        summary = " ".join(docstring.split("\n\n")[0].split()) if docstring else ""
    return f"- {path}: {summary}" if summary else f"- {path}"


def _refill(block: str) -> str:
    """A paragraph, or a paragraph or heading and its "- " items, refilled to 72
    columns."""

    def fill(text: str, bullet: bool) -> str:
        indents = {"initial_indent": "- ", "subsequent_indent": "  "} if bullet else {}
        return textwrap.fill(
            " ".join(text.split()),
            _WIDTH,
            break_on_hyphens=False,
            break_long_words=False,
            **indents,
        )

    text = block.strip()
    head, *items = ("\n" + text if text.startswith("- ") else text).split("\n- ")
    lines = [fill(head, False)] if head.strip() else []
    return "\n".join([*lines, *(fill(item, True) for item in items)])
