"""CI runs the README's test command, verbatim: the two cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from vllm_patch import fork_test

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The command lines of the README's first shell block, in order."""
    block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block, "the README opens with a shell block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_main_job_and_the_test_command() -> None:
    main_job, tests = readme_commands()
    assert "sr-prefetch apply" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    _, tests = readme_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, f".ci/run must run the README's test command: {tests}"


# Markdown whose prose cites repository files: a cited file that is gone is a bug.
CITING = (
    "README.md",
    "bench/README.md",
    "bench/results/engine-nvidia-h200x2-20261130.md",
    "tests/gpu/vllm/README.md",
    "tests/gpu/results/runs.md",
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
