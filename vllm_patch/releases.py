"""The vLLM releases the patch supports, and the one table of how they differ.

Every release from 0.20.0 through 0.33.0 draws `torch.randint(0, 2**32, (1,))`
before each FlashInfer SSU call (`FlashInferSSUBackend.__call__` in
`ssu_dispatch.py`); 0.19.x has no such path.  The edits find their sites by
structure (targets/), and read what differs in the code itself where they
can (how the release names the Mamba types, whether `initialize_mamba_ssu_backend`
takes `use_replayssm`, which variables a `set_forward_context` call is given).
What cannot be read off the code is a file a release adds: `FILES_SINCE` below.
Every supported release has every call site (`Site`).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path


class Design(str, enum.Enum):
    """How forwards are delimited: by the model runners (reset), or by the identity of
    vLLM's ForwardContext (forward-context, no runner edits)."""

    RESET = "reset"
    FORWARD_CONTEXT = "forward-context"

    def __str__(self) -> str:
        return self.value


class Site(str, enum.Enum):
    """A call site the reset design may hook, in a release that has it."""

    V1_EXECUTE_MODEL = "V1 GPUModelRunner.execute_model"
    V1_DUMMY_RUN = "V1 GPUModelRunner._dummy_run"
    V2_EXECUTE_MODEL = "V2 GPUModelRunner.execute_model"
    V2_REPLAY = "V2 GPUModelRunner.execute_model FULL replay"
    V2_CAPTURE = "V2 ModelCudaGraphManager.capture forward_fn"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Release:
    """One supported vLLM release."""

    version: str
    torch: str
    """The torch version the release pins (its wheel's Requires-Dist)."""
    flashinfer: str
    """The flashinfer-python version it pins."""

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.version.split("."))

    def has_file(self, path: str) -> bool:
        since = FILES_SINCE.get(path)
        return since is None or self.key >= _key(since)


RELEASES: tuple[Release, ...] = (
    Release("0.20.0", torch="2.11.0", flashinfer="0.6.8.post1"),
    Release("0.20.1", torch="2.11.0", flashinfer="0.6.8.post1"),
    Release("0.20.2", torch="2.11.0", flashinfer="0.6.8.post1"),
    Release("0.21.0", torch="2.11.0", flashinfer="0.6.8.post1"),
    Release("0.22.0", torch="2.11.0", flashinfer="0.6.11.post2"),
    Release("0.22.1", torch="2.11.0", flashinfer="0.6.11.post2"),
    Release("0.23.0", torch="2.11.0", flashinfer="0.6.12"),
    Release("0.24.0", torch="2.11.0", flashinfer="0.6.12"),
    Release("0.25.0", torch="2.11.0", flashinfer="0.6.13"),
    Release("0.25.1", torch="2.11.0", flashinfer="0.6.13"),
    Release("0.26.0", torch="2.11.0", flashinfer="0.6.14"),
    Release("0.27.0", torch="2.13.0", flashinfer="0.6.16.post3"),
    Release("0.27.1", torch="2.13.0", flashinfer="0.6.16.post3"),
    Release("0.28.0", torch="2.13.0", flashinfer="0.6.16.post3"),
    Release("0.29.0", torch="2.13.0", flashinfer="0.6.18"),
    Release("0.30.0", torch="2.13.0", flashinfer="0.6.18.post1"),
    Release("0.31.0", torch="2.13.0", flashinfer="0.7.0.post1"),
    Release("0.32.0", torch="2.13.0", flashinfer="0.7.0.post1"),
    Release("0.33.0", torch="2.14.0", flashinfer="0.7.2.post1"),
)
"""Oldest first; the newest is what `sr-prefetch apply` with no PATH patches."""

FILES_SINCE: dict[str, str] = {
    # The Triton ReplaySSM kernel's wrapper arrived in 0.27.0.
    "vllm/model_executor/layers/mamba/ops/selective_state_update_replayssm_output_only.py": (
        "0.27.0"
    ),
}
"""Files the patch changes that a release added (every other one is in all releases)."""

NEWEST = RELEASES[-1]
_BY_VERSION = {release.version: release for release in RELEASES}
_RELEASE_PREFIX = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class UnsupportedRelease(Exception):
    """The version is not one the patch supports; the message lists those that are."""


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def supported() -> str:
    return f"{RELEASES[0].version} to {NEWEST.version}"


def get(version: str) -> Release:
    """The supported release named exactly `version` (as `--base` takes it)."""
    release = _BY_VERSION.get(version.removeprefix("v"))
    if release is None:
        raise UnsupportedRelease(
            f"vLLM {version} is not a supported release; supported: "
            + ", ".join(r.version for r in RELEASES)
        )
    return release


def base_of(version: str) -> tuple[Release, str | None]:
    """The release a tree of `version` is based on, and a note when it was inferred.

    A release's own version is itself.  A fork's version names its base in one of
    the usual ways: `0.30.0+fork.3` (a local version of a release), `0.30.0+12`
    (sr-prefetch's reading of `git describe`: 12 commits past v0.30.0), or a
    setuptools-scm dev version `0.30.1.dev12+g1a2b3c` (12 commits past the newest
    tag, which comes before 0.30.1): the newest supported release at or below the
    version's own release number, with a note saying so, which `--base` overrides.
    """
    match = _RELEASE_PREFIX.match(version)
    if match is None:
        raise UnsupportedRelease(
            f"cannot read a release number from vLLM version {version!r}: name the release "
            "it is based on with --base RELEASE"
        )
    number = ".".join(match.groups())
    rest = version[match.end() :]
    # A local (+...) or post (.postN) version comes after its release; a dev, alpha,
    # beta or candidate version before it.
    after_release = rest == "" or rest.startswith(("+", ".post"))
    if after_release and number in _BY_VERSION:
        note = None if rest == "" else f"vLLM {version} is taken to be based on {number}"
        return _BY_VERSION[number], note
    next_minor = _next_after(NEWEST.version)
    if _key(number) > _key(next_minor) or (_key(number) == _key(next_minor) and after_release):
        raise UnsupportedRelease(
            f"vLLM {version} is newer than the newest supported release, {NEWEST.version}; "
            "if it is a fork of a supported release, say which with --base"
        )
    below = [
        r for r in RELEASES if r.key < _key(number) or (r.key == _key(number) and after_release)
    ]
    if not below:
        raise UnsupportedRelease(
            f"vLLM {version} predates the stochastic-rounding seed path (supported: {supported()})"
        )
    release = below[-1]
    return release, (
        f"vLLM {version} is taken to be based on {release.version}, the newest supported "
        "release before it; if it is not, say which with --base"
    )


def _next_after(version: str) -> str:
    major, minor, _ = _key(version)
    return f"{major}.{minor + 1}.0"


@cache
def pristine_sha256() -> dict[str, dict[str, str]]:
    """release -> path -> sha256 of each file the patch changes, as the release ships it
    (pristine_sha256.json, written by `python -m vllm_patch.pristine` from the wheels
    and sdists)."""
    data = json.loads(Path(__file__).with_name("pristine_sha256.json").read_text())
    return data
