"""Every claim of the commit message, checked against the edits, for every supported
release and both designs: each file it names is one the patch changes or adds (and each
one the patch changes or adds is named), each environment variable it names is one the
patched envs.py defines (and each one the patch adds is named), and each call site it
names is one the patch hooks in that release (and each one hooked is named).

And the message as a pull-request description: its subject and sections, every figure
it quotes found in the committed results file it is read from, no name of this
repository, no vLLM name in its prose that its derived lists do not confirm (also
when the patch's files change), and test coverage only where the release can have it."""

from __future__ import annotations

import ast
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from vllm_patch import designs, evidence, fork_test, patch, releases, sources, targets, tree
from vllm_patch.releases import RELEASES, Design, Site
from vllm_patch.syntax import apply_all

FILE = re.compile(r"[\w./-]*\w\.(?:py|cu|txt)\b")
ENV_VAR = re.compile(r"\bVLLM_\w+")


def env_vars(envs_py: str) -> set[str]:
    """The keys of envs.py's `environment_variables` dict."""
    for node in ast.parse(envs_py).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if target is not None and ast.unparse(target) == "environment_variables":
            assert isinstance(node.value, ast.Dict)
            return {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
    raise AssertionError("envs.py has no environment_variables dict")


def problems(
    message: str,
    release: releases.Release,
    design: Design,
    originals: Mapping[str, str],
    added: Mapping[str, bytes],
) -> list[str]:
    """What `message` claims that the patch of `design` on `release` contradicts, or
    leaves out."""
    patched = {
        fo.path: apply_all(originals[fo.path], fo)
        for fo in targets.file_operations(design, release)
    }
    changed = {path for path, text in patched.items() if text != originals[path]}
    files = changed | set(added)
    text = " ".join(message.split())  # unfilled: names broken over lines join again
    found = []
    named = set(FILE.findall(text))
    for name in sorted(named):
        # A file is named by its path, or by the end of it (its name).
        if not any(f == name or f.endswith("/" + name) for f in files):
            found.append(f"names {name}, which the patch neither changes nor adds")
    found += [f"does not name {path}" for path in sorted(files - named)]
    defined = env_vars(patched["vllm/envs.py"])
    added_vars = defined - env_vars(originals["vllm/envs.py"])
    named_vars = set(ENV_VAR.findall(text))
    found += [f"names {var}, which envs.py does not define" for var in named_vars - defined]
    found += [f"does not name {var}" for var in sorted(added_vars - named_vars)]
    hooked = {
        op.site
        for fo in targets.file_operations(design, release)
        for op in fo.operations
        if op.site is not None
    }
    for site in Site:
        if str(site) in text and site not in hooked:
            found.append(f"names {site}, which the patch does not hook in {release.version}")
        if site in hooked and str(site) not in text:
            found.append(f"does not name the call site {site}")
    return found


def release_originals(release: releases.Release) -> dict[str, str]:
    paths = targets.paths(release)
    return {path: data.decode() for path, data in sources.release_files(release, paths).items()}


def added_files(design: Design, release: releases.Release) -> dict[str, bytes]:
    """What the patch adds to a source tree (a git tree: the vendored package and the
    fork's tests), as patch.py computes it."""
    with tempfile.TemporaryDirectory() as root:
        target = tree.Target(Path(root), tree.Kind.GIT, release.version, release)
        return patch._added_files(target, design)


@pytest.mark.parametrize("design", list(Design), ids=str)
@pytest.mark.parametrize("version", [release.version for release in RELEASES])
def test_the_commit_message_claims_only_what_the_edits_do(version: str, design: Design) -> None:
    release = releases.get(version)
    originals, added = release_originals(release), added_files(design, release)
    message = designs.commit_message(design, release, originals, added)
    assert message.startswith(designs.subject(added) + "\n\n")
    # 72 columns, but for a path too long to fit (which is not broken).
    assert all(len(line) <= 72 or len(line.split()) <= 2 for line in message.splitlines())
    assert problems(message, release, design, originals, added) == []


def test_a_message_of_another_release_or_design_is_caught() -> None:
    """The control: the check fails for messages whose claims the edits contradict."""
    older, newest = releases.get("0.26.0"), releases.NEWEST
    originals = release_originals(older)
    reset = added_files(Design.RESET, older)
    fc = added_files(Design.FORWARD_CONTEXT, older)
    newest_message = designs.commit_message(Design.RESET, newest, release_originals(newest), reset)
    # 0.33.0's message names the Triton ReplaySSM files, which 0.26.0 has not (or not
    # changed).
    assert any(
        "selective_state_update_replayssm_output_only.py" in p
        for p in problems(newest_message, older, Design.RESET, originals, reset)
    )
    # The reset design's message names the runners and their call sites, which the
    # forward-context design does not change.
    reset_message = designs.commit_message(Design.RESET, older, originals, reset)
    found = problems(reset_message, older, Design.FORWARD_CONTEXT, originals, fc)
    assert any("gpu_model_runner.py" in p for p in found)
    assert any(str(Site.V1_EXECUTE_MODEL) in p for p in found)
    # The forward-context design's message leaves out the runners the reset design
    # changes.
    fc_message = designs.commit_message(Design.FORWARD_CONTEXT, older, originals, fc)
    found = problems(fc_message, older, Design.RESET, originals, reset)
    assert "does not name vllm/v1/worker/gpu_model_runner.py" in found
    # A variable that does not exist.
    assert problems(
        reset_message + "\nVLLM_MAMBA_SR_SEED_NOT_A_VARIABLE\n",
        older,
        Design.RESET,
        originals,
        reset,
    ) == ["names VLLM_MAMBA_SR_SEED_NOT_A_VARIABLE, which envs.py does not define"]


# --- the message as a pull-request description ------------------------------------------------

SECTIONS = ("Overview", "Claims", "Validation", "Details", "Limitations")
"""vLLM's pull-request template's sections, in its order (Details split by topic)."""
AFTER = ("Duplicate-work check", "AI assistance")
"""What vLLM's AGENTS.md asks an AI-assisted PR's description to state."""
GATING = "Gating: opt-in, or on by default?"
DERIVED_HEADS = ("Environment variable", "Changed:", "Call sites the model runners hook:", "Added:")

EXTERNAL_NAMES = {
    # torch's, CUDA's and vLLM's user-facing names, which no edit of the patch decides.
    "torch.randint",
    "torch.compile",
    "tl.philox",
    "FULL_AND_PIECEWISE",
    "VLLM_MAMBA_SR_SEED_PREFETCH",
}
"""The names the prose may use without the derived lists (each checked elsewhere, or
not vLLM's: the variable against envs.py, the rest torch's or a compile mode)."""

NAME = re.compile(
    r"(?<![\w/.-])(?:"
    r"[\w./-]+\.(?:py|cu|txt|cmake)\b"  # a file
    r"|[A-Za-z_]\w*(?:(?:\.|::)[A-Za-z_]\w*)+"  # a dotted or C++ name
    r"|\w*_\w*"  # snake_case, _private
    r"|[A-Z][a-z0-9]+[A-Z]\w*"  # CamelCase
    r")"
)
PRODUCT_NAMES = {"FlashInfer", "ReplaySSM", "MoE"}
"""Names of products and features, not of code."""


def prose_and_derived(message: str) -> tuple[str, str]:
    """The hand-written part of a message (its subject and sections) and the derived
    lists that follow it."""
    start = min(message.index("\n\n" + head) for head in DERIVED_HEADS if "\n\n" + head in message)
    return message[:start], message[start:]


def prose_names(message: str) -> set[str]:
    prose, _ = prose_and_derived(message)
    return {
        name.rstrip(".")
        for name in NAME.findall(" ".join(prose.split()))
        if not any(c.isdigit() for c in name.split(".")[0][:1])
    } - PRODUCT_NAMES


def unconfirmed_names(message: str) -> list[str]:
    """The names in the prose that neither the derived lists nor EXTERNAL_NAMES give."""
    _, derived = prose_and_derived(message)
    derived = " ".join(derived.split())
    return sorted(
        name
        for name in prose_names(message)
        if name not in EXTERNAL_NAMES
        and re.search(rf"(?<![\w/.]){re.escape(name)}(?!\w)", derived) is None
    )


def messages() -> list[tuple[str, Design, str, dict[str, bytes]]]:
    """(release, design, message, added) for the releases whose layouts differ: before
    the Triton ReplaySSM, with it, and with FlashInfer's too."""
    found = []
    for version in ("0.20.0", "0.26.0", "0.27.0", "0.33.0"):
        release = releases.get(version)
        originals = release_originals(release)
        for design in Design:
            added = added_files(design, release)
            message = designs.commit_message(design, release, originals, added)
            found.append((version, design, message, added))
    return found


@pytest.fixture(scope="module")
def described() -> list[tuple[str, Design, str, dict[str, bytes]]]:
    return messages()


def test_the_subject_has_a_vllm_tag_that_git_am_keeps_with_keep_non_patch(described) -> None:
    for version, design, message, added in described:
        subject = message.splitlines()[0]
        assert subject == designs.subject(added)
        assert subject.startswith("[Perf] ") and not subject.startswith("[Mamba]")
        assert len(subject) <= 72, subject
        assert designs.subject_tag(design) == "[Perf]"
        # The reset design vendors the Triton seed kernel; the forward-context design
        # draws with torch.randint.
        kernel = any(b"@triton.jit" in data for path, data in added.items() if path.endswith(".py"))
        assert kernel == (design is Design.RESET), (version, design)
        assert subject.endswith("in one kernel") == kernel, (version, design)


def test_the_sections_are_there_in_order(described) -> None:
    for version, design, message, _ in described:
        lines = message.splitlines()
        heads = [*SECTIONS, GATING]
        if design is Design.RESET:  # the seed kernel's: nothing to build
            heads.append("Build")
        heads += AFTER
        positions = [lines.index(head) for head in heads]
        assert positions == sorted(positions), (version, design)
        assert all(lines[i - 1] == "" and lines[i + 1] == "" for i in positions)
        assert lines.index("Changed:") > positions[-1] and "Added:" in lines


def test_every_cited_results_file_exists_and_holds_every_figure_quoted() -> None:
    for design in Design:
        for name, figure in designs.figures(design).items():
            assert figure.sources, name
            texts = []
            for source in figure.sources:
                path = evidence.ROOT / source
                assert path.is_file(), f"{name}: {source} is missing"
                assert source.startswith(("bench/results/", "tests/gpu/results/")), source
                texts.append(path.read_text(encoding="utf-8"))
            for value in figure.values:
                assert any(
                    re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text) for text in texts
                ), f"{name}: {value} is in none of {figure.sources}"
            # The figure is made of its values: a span of two, or the one value (a count
            # added up over a log's sessions is their sum).
            if "-" in figure.text:
                assert tuple(figure.text.split("-")) == figure.values, name
            elif figure.values != (figure.text,):
                assert str(sum(int(v) for v in figure.values)) == figure.text, name


def test_every_timing_and_count_in_the_message_is_a_figure_read_from_a_file(described) -> None:
    for version, design, message, _ in described:
        quoted = {str(figure) for figure in designs.figures(design).values()}
        text = " ".join(message.split())
        for timing in re.findall(r"(\d+(?:-\d+)?) (?:µs|s\b)", text):
            assert timing in quoted, (version, design, timing)
        for count in re.findall(r"(\d+(?:-\d+)?) (?:passed|skipped)", text):
            assert count in quoted, (version, design, count)
        # Every figure is used by the message that reads it... at least its timings.
        for name, figure in designs.figures(design).items():
            if name.endswith(("_saved", "_stock")):
                assert str(figure) in text, (version, design, name)


def test_a_figure_that_is_not_in_its_file_is_caught(tmp_path: Path, monkeypatch) -> None:
    """The control: a results file that no longer holds a table or a count fails the
    message, and a missing file is named."""
    copy = tmp_path / "repo"
    for source in {s for f in designs.figures(Design.RESET).values() for s in f.sources}:
        (copy / source).parent.mkdir(parents=True, exist_ok=True)
        (copy / source).write_text((evidence.ROOT / source).read_text())
    monkeypatch.setattr(evidence, "ROOT", copy)
    assert designs.figures(Design.RESET)  # the copy reads as the original
    decode = copy / evidence.DECODE
    decode.write_text(decode.read_text().replace("**v2, replay** (µs)", "**v2, replay**"))
    with pytest.raises(evidence.EvidenceError, match="no table"):
        designs.figures(Design.RESET)
    decode.unlink()
    with pytest.raises(evidence.EvidenceError, match=re.escape(evidence.DECODE)):
        designs.figures(Design.RESET)


def test_no_line_passes_72_columns_and_no_foreign_name_is_said(described) -> None:
    for version, design, message, _ in described:
        for line in message.splitlines():
            assert len(line) <= 72 or len(line.split()) <= 2, (version, design, line)
        lowered = message.lower()
        for name in designs.FOREIGN_NAMES:
            assert name.lower() not in lowered, (version, design, name)
        assert "µs" in message and "H200" in message and "vLLM 0.26.0" in message


def test_the_prose_names_only_what_the_derived_lists_confirm(described) -> None:
    for version, design, message, _ in described:
        assert unconfirmed_names(message) == [], (version, design)


def test_the_name_check_catches_a_name_the_lists_do_not_give(described) -> None:
    _, _, message, _ = described[0]
    prose, derived = prose_and_derived(message)
    made_up = prose + " The StockSeedPrefetcher in seed_relay.py calls hooks.forward." + derived
    assert unconfirmed_names(made_up) == ["StockSeedPrefetcher", "hooks.forward", "seed_relay.py"]


def test_the_test_coverage_claimed_is_what_the_release_can_have(described) -> None:
    for version, design, message, _ in described:
        release = releases.get(version)
        ssu = release_originals(release)[targets.ssu_dispatch.PATH]
        has = {
            "FlashInfer": fork_test.FLASHINFER_REPLAYSSM in ssu,
            "Triton": release.has_file(targets.replayssm_triton.PATH),
        }
        text = " ".join(message.split())
        assert ("FlashInfer's ReplaySSM call" in text) == has["FlashInfer"], (version, design)
        assert ("Triton ReplaySSM kernel's wrapper" in text) == has["Triton"], (version, design)
        if not any(has.values()):
            # No ReplaySSM case is named as a reason to wait for.
            prose = " ".join(prose_and_derived(message)[0].split())
            gating = prose[prose.index(GATING) :]
            assert "ReplaySSM" not in gating


def test_the_message_follows_a_different_set_of_added_files() -> None:
    """Another layout of the added files (one module instead of a package, the Triton
    kernel in it): the prose names none of today's files, and says the change has
    nothing to build; without the kernel, the seeds are drawn up front and no Build
    section is there."""
    release = releases.NEWEST
    originals = release_originals(release)
    today = added_files(Design.RESET, release)
    module = (
        '"""The Mamba SR seed prefetch: one function the model runners call per forward, '
        'and the seeds drawn by one Triton kernel."""\n'
        "@triton.jit\n"
        "def _seeds(out_ptr):\n"
        "    pass\n"
    )
    added = {
        fork_test.PATH: today[fork_test.PATH],
        "vllm/model_executor/layers/mamba/ops/sr_seed_prefetch.py": module.encode(),
    }
    message = designs.commit_message(Design.RESET, release, originals, added)
    assert unconfirmed_names(message) == []
    assert problems(message, release, Design.RESET, originals, added) == []
    text = " ".join(message.split())
    assert message.splitlines()[0].endswith("in one kernel")
    assert "Nothing to build: the seeds are drawn by one Triton kernel outside every" in text
    assert "randint_seeds.py" not in prose_and_derived(message)[0]
    without = {path: data.replace(b"@triton.jit", b"@cache") for path, data in added.items()}
    message = designs.commit_message(Design.RESET, release, originals, without)
    assert message.splitlines()[0].endswith("up front")
    assert "Build" not in message.splitlines()
