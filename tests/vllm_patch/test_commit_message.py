"""Every claim of the commit message, checked against the edits, for every supported
release and both designs: each file it names is one the patch changes or adds (and each
one the patch changes or adds is named), each environment variable it names is one the
patched envs.py defines (and each one the patch adds is named), and each call site it
names is one the patch hooks in that release (and each one hooked is named)."""

from __future__ import annotations

import ast
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from vllm_patch import designs, patch, releases, targets, tree
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
        for fo in targets.file_operations(design, release, setup_py_present="setup.py" in originals)
    }
    changed = {path for path, text in patched.items() if text != originals[path]}
    files = changed | set(added)
    text = " ".join(message.split())  # unfilled: names broken over lines join again
    found = []
    named = set(FILE.findall(text))
    for name in sorted(named):
        # A file is named by its path, or by the end of it (its name, csrc/its name).
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
        for fo in targets.file_operations(design, release, setup_py_present="setup.py" in originals)
        for op in fo.operations
        if op.site is not None
    }
    for site in Site:
        if str(site) in text and not (release.has(site) and site in hooked):
            found.append(f"names {site}, which the patch does not hook in {release.version}")
        if site in hooked and str(site) not in text:
            found.append(f"does not name the call site {site}")
    return found


def release_originals(release: releases.Release) -> dict[str, str]:
    paths = targets.paths(release)
    return {path: data.decode() for path, data in tree.release_files(release, paths).items()}


def added_files(design: Design, release: releases.Release) -> dict[str, bytes]:
    """What the patch adds to a source tree (a git tree with setup.py: the vendored
    package, the fork's test and, for the reset design, the seed op's source), as
    patch.py computes it."""
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "setup.py").write_text("")
        target = tree.Target(Path(root), tree.Kind.GIT, release.version, release)
        return patch._added_files(target, design)


@pytest.mark.parametrize("design", list(Design), ids=str)
@pytest.mark.parametrize("version", [release.version for release in RELEASES])
def test_the_commit_message_claims_only_what_the_edits_do(version: str, design: Design) -> None:
    release = releases.get(version)
    originals, added = release_originals(release), added_files(design, release)
    message = designs.commit_message(design, release, originals, added)
    assert message.startswith(designs.SUBJECT + "\n\n")
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
