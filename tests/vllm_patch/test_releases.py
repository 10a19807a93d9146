"""Every supported release, both designs: check is clean, apply then revert gives the
bytes back, the patched files compile, and the reset design finds every call site the
release has.  The files come from each release's wheel, a few members read over HTTP
ranges and cached ($SR_PREFETCH_CACHE), not 19 whole wheels."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.vllm_patch.helpers import commit, run, snapshot, tree_files
from vllm_patch import gitrepo, patch, releases, sdist, sources, targets, tree, wheel
from vllm_patch.releases import RELEASES, Design, Site

VERSIONS = [release.version for release in RELEASES]


def release_tree(root: Path, release: releases.Release, version: str | None = None) -> Path:
    """A source tree (no git) holding `release`'s files that the patch reads or changes;
    `version` rewrites its vllm/_version.py, as a fork's build would."""
    for path, data in sources.release_files(release, tree_files(release)).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    if version is not None:
        (root / "vllm/_version.py").write_text(f"__version__ = version = '{version}'\n")
    return root


def test_release_files_come_from_the_wheel_but_setup_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel holds the package and its dist-info; only the rest (setup.py,
    CMakeLists.txt) is read from the sdist, which has no dist-info."""
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(tmp_path))
    asked: dict[str, list[str]] = {}

    def members(source: str):
        def read(version: str, names: list[str]) -> dict[str, bytes]:
            asked[source] = list(names)
            return {name: source.encode() for name in names}

        return read

    monkeypatch.setattr(wheel, "read_members", members("wheel"))
    monkeypatch.setattr(sdist, "read_members", members("sdist"))
    monkeypatch.setattr(sdist, "fetch", lambda version: tmp_path / "sdist.tar.gz")
    dist = "vllm-0.26.0.dist-info"
    build = ("setup.py", "CMakeLists.txt")
    paths = ("vllm/__init__.py", f"{dist}/METADATA", f"{dist}/WHEEL", *build)
    files = sources.release_files(releases.get("0.26.0"), paths)
    assert asked == {"wheel": list(paths[:3]), "sdist": list(build)}
    assert files == {**dict.fromkeys(paths[:3], b"wheel"), **dict.fromkeys(build, b"sdist")}


@pytest.mark.parametrize("version", VERSIONS)
def test_shipped_files_are_the_ones_the_table_records(version: str) -> None:
    release = releases.get(version)
    files = sources.release_files(release, targets.paths(release))
    recorded = releases.pristine_sha256()[version]
    assert {p: hashlib.sha256(d).hexdigest() for p, d in files.items()} == recorded


@pytest.mark.parametrize("design", list(Design), ids=str)
@pytest.mark.parametrize("version", VERSIONS)
def test_check_apply_revert_on_every_release(
    version: str, design: Design, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = release_tree(tmp_path, releases.get(version))
    before = snapshot(root)

    status, out = run(capsys, "check", root, "--design", design)
    assert status == 0 and "would apply cleanly" in out, out
    assert snapshot(root) == before

    status, out = run(capsys, "apply", root, "--design", design)
    assert status == 0, out
    for file_ops in patch.operations(design, tree.resolve(root)):
        text = (root / file_ops.path).read_text()
        assert hashlib.sha256(text.encode()).hexdigest() != before[file_ops.path]
        if file_ops.path.endswith(".py"):
            compile(text, file_ops.path, "exec")
    status, out = run(capsys, "status", root)
    assert status == 0 and f"Design applied: {design}" in out, out

    status, out = run(capsys, "revert", root)
    assert status == 0, out
    assert snapshot(root) == before


@pytest.mark.parametrize("version", VERSIONS)
def test_the_reset_design_hooks_every_site_the_release_has(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = releases.get(version)
    hooked = {
        operation.site
        for file_ops in targets.file_operations(Design.RESET, release)
        for operation in file_ops.operations
        if operation.site is not None
    }
    assert hooked == set(Site)
    status, out = run(capsys, "check", release_tree(tmp_path, release))
    assert status == 0, out


@pytest.mark.parametrize(
    ("version", "base", "inferred"),
    [
        ("0.30.0", "0.30.0", False),
        ("0.30.0+fork.3", "0.30.0", True),
        ("0.30.0+12", "0.30.0", True),  # git describe: 12 commits past v0.30.0
        ("0.30.1.dev12+g1a2b3c4", "0.30.0", True),
        ("0.31.0rc1", "0.30.0", True),
        ("0.30.0.post1", "0.30.0", True),
        ("0.34.0.dev3+gabc", "0.33.0", True),
        ("0.25.2", "0.25.1", True),
    ],
)
def test_a_fork_s_base_is_read_from_its_version(version: str, base: str, inferred: bool) -> None:
    release, note = releases.base_of(version)
    assert release.version == base
    assert (note is not None) == inferred


@pytest.mark.parametrize("version", ["0.19.1", "0.20.0.dev5", "0.34.0", "1.2.0", "main"])
def test_versions_without_a_supported_base_are_refused(version: str) -> None:
    with pytest.raises(releases.UnsupportedRelease):
        releases.base_of(version)


def git_fork(root: Path, release: releases.Release, version: str) -> Path:
    """A fork's checkout: `release`'s files, committed, its version string its own."""
    release_tree(root, release, version)
    for command in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fork"],
    ):
        subprocess.run(["git", *command], cwd=root, check=True)
    return root


def test_a_fork_of_0_30_0_is_patched_as_0_30_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = git_fork(tmp_path / "fork", releases.get("0.30.0"), "0.31.0.dev7+gdeadbee")
    status, out = run(capsys, "apply", root)
    assert status == 0, out
    assert "taken to be based on 0.30.0" in out
    assert tree.resolve(root).release.version == "0.30.0"


def test_base_overrides_a_version_that_names_no_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = git_fork(tmp_path / "fork", releases.get("0.30.0"), "2.0.0+ourfork")
    before = snapshot(root)
    status, out = run(capsys, "apply", root)
    assert status == 1 and "--base" in out
    assert snapshot(root) == before
    status, out = run(capsys, "apply", root, "--base", "0.30.0")
    assert status == 0, out
    assert run(capsys, "status", root, "--base", "0.30.0")[1].count("Design applied: reset") == 1
    assert run(capsys, "revert", root, "--base", "0.30.0")[0] == 0
    assert snapshot(root) == before


def test_an_unknown_base_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = git_fork(tmp_path / "fork", releases.get("0.26.0"), "0.26.0")
    status, out = run(capsys, "apply", root, "--base", "0.19.0")
    assert status == 1 and "not a supported release" in out and "0.20.0" in out


@pytest.mark.parametrize(
    ("path", "moved", "names"),
    [
        (
            "vllm/v1/worker/gpu_model_runner.py",
            ("model_output = self._model_forward(", "model_output = self._run_forward("),
            ("GPUModelRunner.execute_model", "self._model_forward"),
        ),
        (
            "vllm/v1/worker/gpu/cudagraph_utils.py",
            ("def forward_fn(cg_mode", "def run_forward(cg_mode"),
            ("ModelCudaGraphManager.capture.create_forward_fn.forward_fn", "is not defined"),
        ),
        (
            "vllm/model_executor/layers/mamba/ops/ssu_dispatch.py",
            (
                "torch.randint(0, 2**32, (1,), device=state.device)\n            if self",
                "torch.randint(0, 2**31, (1,), device=state.device)\n            if self",
            ),
            ("FlashInferSSUBackend.__call__", "torch.randint"),
        ),
    ],
    ids=["v1-execute-model", "v2-capture-forward-fn", "changed-stock-draw"],
)
def test_a_moved_site_fails_naming_function_and_release_and_changes_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
    moved: tuple[str, str],
    names: tuple[str, ...],
) -> None:
    root = git_fork(tmp_path / "fork", releases.get("0.26.0"), "0.26.0")
    text = (root / path).read_text()
    assert text.count(moved[0]) == 1
    (root / path).write_text(text.replace(*moved))
    commit(root, "move")
    before = snapshot(root)
    status, out = run(capsys, "apply", root)
    assert status == 1
    assert "nothing was changed" in out
    assert path in out and "vLLM 0.26.0" in out
    assert all(name in out for name in names), out
    assert snapshot(root) == before


@pytest.mark.parametrize(
    ("version", "design"),
    [("0.20.0", Design.RESET), ("0.26.0", Design.RESET), ("0.26.0", Design.FORWARD_CONTEXT)],
    ids=lambda value: str(value),
)
def test_export_writes_a_patch_that_git_am_applies_to_that_release(
    version: str, design: Design, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mail = tmp_path / "sr-prefetch.patch"
    status, out = run(capsys, "export", "--design", design, "--base", version, "-o", mail)
    assert status == 0, out
    assert f"against vLLM v{version}" in out
    fork = gitrepo.clone(sources.pristine_tree(releases.get(version)), tmp_path / "fork")
    subprocess.run(
        [
            "git",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "am",
            "-q",
            "--keep-non-patch",
            str(mail),
        ],
        cwd=fork,
        check=True,
    )
    subject = subprocess.run(
        ["git", "log", "-1", "--format=%s"], cwd=fork, capture_output=True, text=True, check=True
    ).stdout
    assert subject.startswith("[Perf] ")
    status, out = run(capsys, "status", fork)
    assert status == 0 and f"Design applied: {design}" in out, out


# --- a --base that disagrees with the tree ----------------------------------------------------

WRAPPER = targets.replayssm_triton.PATH


@pytest.mark.parametrize("command", ["check", "apply", "revert", "status"])
def test_a_base_older_than_the_tree_is_refused_naming_what_it_lacks(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Patched as 0.26.0, a 0.30.0 tree would get `rand_seed=` passed to the Triton
    ReplaySSM wrapper, which 0.26.0's table leaves unpatched."""
    root = git_fork(tmp_path / "fork", releases.get("0.30.0"), "0.30.0")
    before = snapshot(root)
    status, out = run(capsys, command, root, "--base", "0.26.0")
    assert status == 1, out
    assert f"it has {WRAPPER}, which vLLM 0.26.0 lacks (added in 0.27.0)" in out
    assert "calls selective_state_update_replayssm_output_only" in out
    assert "--base: 0.27.0 to 0.33.0" in out  # the releases with the wrapper
    assert snapshot(root) == before


def test_a_reverted_tree_under_a_wrong_base_stays_patched_and_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = git_fork(tmp_path / "fork", releases.get("0.30.0"), "0.30.0")
    before = snapshot(root)
    assert run(capsys, "apply", root)[0] == 0
    patched = snapshot(root)
    status, out = run(capsys, "revert", root, "--base", "0.26.0")
    assert status == 1 and "not laid out as vLLM 0.26.0" in out, out
    assert snapshot(root) == patched
    assert run(capsys, "revert", root)[0] == 0
    assert snapshot(root) == before


def test_a_call_of_the_wrapper_without_its_file_fits_no_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fork of 0.30.0 that moved the wrapper elsewhere: the patch would pass its call a
    rand_seed that nothing gives the function."""
    root = git_fork(tmp_path / "fork", releases.get("0.30.0"), "0.30.0")
    (root / WRAPPER).unlink()
    commit(root, "move the wrapper")
    before = snapshot(root)
    status, out = run(capsys, "check", root, "--base", "0.26.0")
    assert status == 1, out
    assert "calls selective_state_update_replayssm_output_only" in out and "TypeError" in out
    assert "no supported release is laid out as it is" in out
    assert snapshot(root) == before


def test_an_unversioned_checkout_is_patched_with_base_and_refused_naming_it_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fork's checkout with no vllm/_version.py and no tags."""
    root = git_fork(tmp_path / "fork", releases.get("0.30.0"), "0.30.0")
    (root / "vllm/_version.py").unlink()
    commit(root, "no version file")
    before = snapshot(root)
    for command in ("apply", "status"):
        status, out = run(capsys, command, root)
        assert status == 1 and "cannot tell the vLLM version" in out and "--base" in out, out
    assert snapshot(root) == before
    status, out = run(capsys, "apply", root, "--base", "0.30.0")
    assert status == 0, out
    assert f"vLLM based on 0.30.0 (git tree) at {root}" in out
    status, out = run(capsys, "status", root, "--base", "0.30.0")
    assert status == 0 and "vLLM version: not stated" in out and "Design applied: reset" in out
    assert run(capsys, "revert", root, "--base", "0.30.0")[0] == 0
    assert snapshot(root) == before
