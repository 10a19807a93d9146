"""The README's commands are tested: CI runs its test command verbatim, its sr-prefetch
commands parse, and its quick start names vLLM's flags and the landed log lines as they are."""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from vllm_patch import cli, fork_test

ROOT = Path(__file__).resolve().parents[1]
SETUP = "## The main job and the tests"
"""The README section whose shell block holds the main job and the test command."""


def _blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.DOTALL)


def _lines(block: str) -> list[str]:
    """A shell block's command lines, continuations joined, comments left out."""
    joined = block.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def readme_commands() -> list[str]:
    """The command lines of the shell block under SETUP, in order."""
    text = (ROOT / "README.md").read_text()
    assert SETUP in text, f"the README has a section {SETUP!r}"
    blocks = _blocks(text.split(SETUP, 1)[1])
    assert blocks, f"{SETUP!r} has a shell block"
    return _lines(blocks[0])


def test_readme_has_the_main_job_and_the_test_command() -> None:
    main_job, tests = readme_commands()
    assert "sr-prefetch apply" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    _, tests = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, f".ci/run must run the README's test command: {tests}"


def sr_prefetch_commands(text: str) -> list[list[str]]:
    """The argument lists of every sr-prefetch command in the text's shell blocks."""
    commands = []
    for block in _blocks(text):
        for line in _lines(block):
            for part in re.split(r"&&|;", line.split(" #")[0]):
                words = shlex.split(part)
                if words and words[0].endswith("sr-prefetch"):
                    commands.append(words[1:])
    return commands


def test_the_readme_sr_prefetch_commands_parse() -> None:
    commands = sr_prefetch_commands((ROOT / "README.md").read_text())
    assert {words[0] for words in commands} >= {"apply", "revert"}
    for words in commands:
        cli._parser().parse_args(words)  # SystemExit on a word the command lacks


def test_the_command_check_can_fail() -> None:
    (words,) = sr_prefetch_commands("```sh\nsr-prefetch apply --no-such-option  # x\n```")
    with pytest.raises(SystemExit):
        cli._parser().parse_args(words)


def _engagement_format() -> str:
    """The reset design's engagement line, as the landing logs it (%-format)."""
    tree = ast.parse((ROOT / "vllm_patch" / "landing" / "ssu_reset.py").read_text())
    (fmt,) = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith("Prefetching Mamba")
    ]
    return fmt


def test_the_quick_start_shows_the_landed_log_lines() -> None:
    text = " ".join((ROOT / "README.md").read_text().split())
    assert _engagement_format() % (40, "flashinfer", "SSU") in text
    unused = "VLLM_MAMBA_SR_SEED_PREFETCH is set but unused:"
    assert unused in (ROOT / "vllm_patch" / "landing" / "ssu_reset.py").read_text()
    assert unused in text


def test_the_quick_start_serves_with_vllms_own_flags() -> None:
    (serve,) = [
        line
        for block in _blocks((ROOT / "README.md").read_text())
        for line in _lines(block)
        if "vllm serve" in line
    ]
    words = shlex.split(serve)
    assert words[0] == "VLLM_MAMBA_SR_SEED_PREFETCH=1"
    flags = [word for word in words if word.startswith("--")]
    assert flags == [
        "--mamba-backend",
        "--mamba-ssm-cache-dtype",
        "--enable-mamba-cache-stochastic-rounding",
    ]
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed here (.ci/install-vllm.sh installs it)")
    arg_utils = Path(spec.submodule_search_locations[0], "engine", "arg_utils.py").read_text()
    for flag in flags:
        assert flag[2:].replace("-", "_") in arg_utils, flag


# Markdown whose prose cites repository files: a cited file that is gone is a bug.
CITING = (
    "README.md",
    "bench/README.md",
    "bench/results/engine-nvidia-h200x2-20261130.md",
    "tests/gpu/README.md",
    "tests/gpu/vllm/README.md",
    "tests/gpu/results/README.md",
    "vllm_patch/README.md",
    "vllm_patch/PLUGIN.md",
    "runner_hooks/README.md",
)
# A path after "<commit>:" is in the history, not the tree.
_CITED = re.compile(r"(?<![\w./:-])((?:\.ci|bench|tests|vllm_patch|runner_hooks)/[\w./-]*\w)")


def _exists(path: str) -> bool:
    """The file, or files it is the prefix of (`results/x.*`, a --prefix)."""
    if path in fork_test.PATHS:  # the tests the patch adds to a vLLM source tree
        return True
    target = ROOT / path
    return target.exists() or any(target.parent.glob(f"{target.name}*"))


def test_cited_repository_files_exist() -> None:
    missing = [
        f"{doc}: {path}"
        for doc in CITING
        for path in sorted(set(_CITED.findall((ROOT / doc).read_text())))
        if not _exists(path)
    ]
    assert not missing, missing


def test_the_citation_check_can_fail() -> None:
    cited = _CITED.findall("see `bench/gone.py`, .ci/gone and git show abc:bench/old.py")
    assert cited == ["bench/gone.py", ".ci/gone"]
    assert not _exists("bench/gone.py") and not _exists(".ci/gone")
    assert _exists("bench/results/nvidia-h200-20261129") and _exists(".ci/run")


def test_the_readme_cites_nothing_a_clone_lacks() -> None:
    """Files beside the repository (`../shared/...`) and the project's seed document are
    not in a clone."""
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "../" not in text and "seed document" not in text
