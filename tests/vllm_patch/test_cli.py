"""apply, check, status, revert, export and versions through the sr-prefetch command line,
both designs, on the newest release's pristine tree: as a git tree, a tree outside git, and
the cached tree that `apply` without PATH patches (an installed vLLM: test_installed.py).

Most tests patch a small tree: the pristine tree's files that sr-prefetch reads or changes,
nothing else.  It is the same target to the patch, without the cost of cloning and hashing
the other 12,000 files; the full tree is patched where the whole tree is the point.  The
test of --base builds vLLM 0.29.0's pristine tree in the cache once (a few seconds).
"""

from __future__ import annotations

import ast
import collections
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_patch.helpers import commit, git, run, small_copy, small_git_copy, snapshot
from vllm_patch import (
    cli,
    designs,
    fork_test,
    gitrepo,
    patch,
    releases,
    sources,
    syntax,
    targets,
    tree,
    vendor,
)
from vllm_patch.cache import pristine_path
from vllm_patch.designs import DESIGNS
from vllm_patch.releases import NEWEST, Design, Site
from vllm_patch.targets import (
    envs,
    mamba_mixer2,
    mamba_ssm,
    replayssm_triton,
    ssu_dispatch,
    v1_runner,
    v2_cudagraph,
    v2_runner,
)

OLDER = releases.get("0.29.0")
"""A release before FlashInfer's ReplaySSM call (added in 0.30.0)."""


def changed_files(root: Path) -> set[str]:
    return {line[3:] for line in git(root, "status", "--porcelain", "-uall").splitlines()}


def changed_paths(design: Design) -> set[str]:
    """The existing files `design` changes in the newest release."""
    return {file_ops.path for file_ops in targets.file_operations(design, NEWEST)}


def added_paths(design: Design = Design.RESET) -> set[str]:
    """The files `design` adds to a git source tree: the vendored package and the fork's
    tests."""
    return set(vendor.vendored_files(design)) | set(fork_test.files(design, ""))


@pytest.fixture
def small_tree(pristine: Path, tmp_path: Path) -> Path:
    """The pristine tree's files that sr-prefetch reads or changes, as a git tree."""
    return small_git_copy(pristine, tmp_path / "small")


# --- a git tree, both designs -----------------------------------------------------------------


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_apply_status_revert(
    vllm_tree: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = run(capsys, "apply", vllm_tree, "--design", design)
    assert status == 0, out
    assert f"Applied the {design} design to vLLM {NEWEST.version} (git tree) at {vllm_tree}" in out
    expected = changed_paths(design) | added_paths(design)
    assert changed_files(vllm_tree) == expected
    assert all(path in out for path in expected)

    status, out = run(capsys, "status", vllm_tree)
    assert status == 0, out
    assert f"vLLM version: {NEWEST.version}" in out
    assert f"Based on release: {NEWEST.version}" in out
    assert f"Design applied: {design} ({DESIGNS[design].summary})" in out
    assert all(path in out for path in expected)

    status, out = run(capsys, "revert", vllm_tree)
    assert status == 0, out
    assert f"Reverted the {design} design" in out
    assert git(vllm_tree, "status", "--porcelain", "-uall") == ""
    status, out = run(capsys, "status", vllm_tree)
    assert status == 0 and "Design applied: none" in out
    status, out = run(capsys, "revert", vllm_tree)
    assert status == 0 and "nothing to revert" in out, out


def test_the_reset_design_edits_the_runners_and_forward_context_does_not() -> None:
    assert changed_paths(Design.RESET) == set(targets.PATHS)
    assert changed_paths(Design.FORWARD_CONTEXT) == {
        envs.PATH,
        ssu_dispatch.PATH,
        mamba_ssm.PATH,
        replayssm_triton.PATH,
        mamba_mixer2.PATH,
    }
    # Neither design edits a build file or _custom_ops.py: neither has a compiled op.
    for design in Design:
        assert not {"setup.py", "CMakeLists.txt", "vllm/_custom_ops.py"} & changed_paths(design)
    forward_context_sites = {
        operation.site
        for file_ops in targets.file_operations(Design.FORWARD_CONTEXT, NEWEST)
        for operation in file_ops.operations
    }
    assert forward_context_sites == {None}


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_check_says_per_file_what_apply_would_do(
    small_tree: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(small_tree)
    status, out = run(capsys, "check", small_tree, "--design", design)
    assert status == 0, out
    assert f"The {design} design would apply cleanly to vLLM {NEWEST.version}" in out
    for file_ops in targets.file_operations(design, NEWEST):
        assert f"would change   {file_ops.path}" in out
        # Each operation's reason, and where in the file it lands.
        assert all(f"{operation.why} (" in out for operation in file_ops.operations)
    for path in added_paths(design):
        assert f"would add      {path}" in out
    assert "no such site" not in out  # the newest release has every site
    assert snapshot(small_tree) == before


@pytest.mark.parametrize("command", ["check", "apply", "status", "revert"])
def test_a_command_parses_each_text_once(
    small_tree: Path,
    command: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every text a command reads is parsed once (syntax.parse), revert's second reading of
    each patched file and the vendored modules read by every step included."""
    if command in ("status", "revert"):
        assert run(capsys, "apply", small_tree)[0] == 0
    syntax.parse.cache_clear()
    parsed: collections.Counter[str] = collections.Counter()
    real_parse = ast.parse

    def counting_parse(source: str, *args: Any, **kwargs: Any) -> Any:
        parsed[source] += 1
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting_parse)
    status, out = run(capsys, command, small_tree)
    assert status == 0, out
    assert len(parsed) > 20  # the control: the command's files went through the counter
    again = [text.splitlines()[:1] for text, count in parsed.items() if count > 1]
    assert not again, f"parsed more than once: {again}"


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_applying_twice_is_a_no_op_that_says_so(
    small_tree: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", small_tree, "--design", design)[0] == 0
    before = snapshot(small_tree)
    status, out = run(capsys, "apply", small_tree, "--design", design)
    assert status == 0, out
    assert "already applied" in out and "nothing to do" in out
    status, out = run(capsys, "check", small_tree, "--design", design)
    assert status == 0 and "already applied" in out, out
    assert snapshot(small_tree) == before


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_export_applies_with_git_am_and_gives_the_same_files(
    pristine: Path,
    small_tree: Path,
    cache: Path,
    tmp_path: Path,
    design: Design,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # export patches a clone of the cached pristine tree: here a small copy of it.
    small_git_copy(pristine, pristine_path(NEWEST))
    mail = tmp_path / f"{design}.patch"
    status, out = run(capsys, "export", "--design", design, "-o", mail)
    assert status == 0, out
    assert f"against vLLM v{NEWEST.version}" in out and "git am --keep-non-patch" in out
    assert "keeps the [Perf] tag" in out
    assert "Subject: [PATCH] [Perf] Draw a forward's Mamba" in mail.read_text()

    fresh = small_tree
    git(fresh, "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q", "--keep-non-patch", mail)
    assert git(fresh, "status", "--porcelain", "-uall") == ""
    # No build file, no CUDA source, no op wrapper: nothing to compile.
    touched = git(fresh, "diff", "--name-only", "HEAD~1").split()
    assert not {"setup.py", "CMakeLists.txt", "vllm/_custom_ops.py"} & set(touched), touched
    assert not [path for path in touched if path.startswith("csrc/") or path.endswith(".cu")]
    # The message is the release's and the design's, built from what the commit holds.
    added = git(fresh, "diff", "--name-only", "--diff-filter=A", "HEAD~1").split()
    subject = designs.subject({path: (fresh / path).read_bytes() for path in added})
    assert (
        subject.startswith("[Perf] ") and git(fresh, "log", "-1", "--format=%s") == subject + "\n"
    )
    originals = {
        fo.path: (pristine / fo.path).read_text()
        for fo in patch.operations(design, tree.resolve(pristine))
    }
    expected = designs.commit_message(
        design, NEWEST, originals, {path: (fresh / path).read_bytes() for path in added}
    )
    assert git(fresh, "log", "-1", "--format=%B").strip() == expected.strip()

    # A tree patched by git am reads back as applied, and reverts byte for byte ...
    status, out = run(capsys, "revert", fresh)
    assert status == 0 and f"Reverted the {design} design" in out, out
    git(fresh, "add", "--all")
    assert git(fresh, "diff", "--cached", "--stat", "HEAD~1") == ""
    # ... and apply, on the reverted tree committed, makes exactly the commit export wrote.
    commit(fresh, "revert")
    assert run(capsys, "apply", fresh, "--design", design)[0] == 0
    git(fresh, "add", "--all")
    assert git(fresh, "diff", "--cached", "--stat", "HEAD~1") == ""


def test_export_to_stdout_writes_the_patch_there_and_no_file(
    pristine: Path,
    cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    small_git_copy(pristine, pristine_path(NEWEST))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("From ") and "Subject: [PATCH] [Perf]" in captured.out
    assert "git am --keep-non-patch" in captured.err  # the note goes beside the patch
    assert not (tmp_path / "-").exists()


# --- export's author and Signed-off-by --------------------------------------------------------


@pytest.fixture
def git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A global git config of this test's own (empty), no system config, no identity in
    the environment, and a current directory outside any repository: git resolves an
    identity only from what the test writes there."""
    home = tmp_path / "home"
    home.mkdir()
    config = home / ".gitconfig"
    config.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("NAME", "EMAIL"):
        for who in ("AUTHOR", "COMMITTER"):
            monkeypatch.delenv(f"GIT_{who}_{name}", raising=False)
    monkeypatch.delenv("EMAIL", raising=False)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    return config


def set_identity(config: Path, name: str, email: str) -> None:
    git(config.parent, "config", "--file", str(config), "user.name", name)
    git(config.parent, "config", "--file", str(config), "user.email", email)


def exported(mail: Path, into: Path) -> tuple[str, str]:
    """The author and the whole message of the commit `git am` makes of `mail` in `into`."""
    git(into, "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q", "--keep-non-patch", mail)
    return git(into, "log", "-1", "--format=%an <%ae>").strip(), git(
        into, "log", "-1", "--format=%B"
    )


def test_export_signoff_signs_and_authors_with_the_configured_identity(
    pristine: Path,
    small_tree: Path,
    cache: Path,
    git_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    small_git_copy(pristine, cache / f"vllm-{NEWEST.version}")
    set_identity(git_config, "Ada Reviewer", "ada@example.com")
    mail = tmp_path / "signed.patch"
    status, out = run(capsys, "export", "--signoff", "-o", mail)
    assert status == 0, out
    assert "From: Ada Reviewer <ada@example.com>" in mail.read_text()
    author, message = exported(mail, small_tree)
    assert author == "Ada Reviewer <ada@example.com>"
    # The trailer closes the message, a paragraph of its own, once.
    assert message.rstrip("\n").endswith("\n\nSigned-off-by: Ada Reviewer <ada@example.com>")
    assert message.count("Signed-off-by:") == 1


def test_export_without_signoff_is_authored_by_the_identity_and_unsigned(
    pristine: Path,
    small_tree: Path,
    cache: Path,
    git_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    small_git_copy(pristine, cache / f"vllm-{NEWEST.version}")
    set_identity(git_config, "Ada Reviewer", "ada@example.com")
    # GIT_AUTHOR_* wins over the configuration, as git resolves it.
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Bo Author")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "bo@example.com")
    mail = tmp_path / "unsigned.patch"
    status, out = run(capsys, "export", "-o", mail)
    assert status == 0, out
    assert "no identity configured" not in out
    author, message = exported(mail, small_tree)
    assert author == "Bo Author <bo@example.com>"
    assert "Signed-off-by:" not in message


def test_export_reads_the_identity_of_the_current_directory(
    pristine: Path,
    small_tree: Path,
    cache: Path,
    git_config: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A repository's own user.name/user.email, as git resolves them there."""
    small_git_copy(pristine, cache / f"vllm-{NEWEST.version}")
    set_identity(git_config, "Ada Reviewer", "ada@example.com")
    fork = tmp_path / "fork"
    fork.mkdir()
    git(fork, "init", "-q")
    git(fork, "config", "user.name", "Cy Forker")
    git(fork, "config", "user.email", "cy@example.com")
    monkeypatch.chdir(fork)
    mail = tmp_path / "fork.patch"
    assert run(capsys, "export", "--signoff", "-o", mail)[0] == 0
    author, message = exported(mail, small_tree)
    assert author == "Cy Forker <cy@example.com>"
    assert "Signed-off-by: Cy Forker <cy@example.com>" in message


def test_export_signoff_without_an_identity_refuses_and_writes_nothing(
    cache: Path, git_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mail = tmp_path / "out" / "signed.patch"
    status = cli.main(["export", "--signoff", "-o", str(mail)])
    captured = capsys.readouterr()
    assert status == 1
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert "git config --global user.name" in line and "user.email" in line
    assert "GIT_AUTHOR_NAME" in line and "nothing was written" in line
    assert not mail.parent.exists()
    assert list(cache.iterdir()) == []  # refused before fetching anything


def test_export_without_an_identity_falls_back_to_its_own_and_says_so(
    pristine: Path,
    small_tree: Path,
    cache: Path,
    git_config: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    small_git_copy(pristine, cache / f"vllm-{NEWEST.version}")
    mail = tmp_path / "anonymous.patch"
    status, out = run(capsys, "export", "-o", mail)
    assert status == 0, out
    assert f"the patch's author is {gitrepo.OWN_IDENTITY}" in out
    author, message = exported(mail, small_tree)
    assert author == str(gitrepo.OWN_IDENTITY)
    assert "Signed-off-by:" not in message


def test_export_help_says_whose_identity_signs_and_authors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--signoff" in text and "Signed-off-by" in text and "DCO" in text
    assert str(gitrepo.OWN_IDENTITY) in text


def test_status_of_an_unpatched_tree_names_its_base_not_a_patch(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out = run(capsys, "status", small_tree)
    assert status == 0, out
    assert f"Based on release: {NEWEST.version}\nDesign applied: none\n" in out
    assert "Patched" not in out


@pytest.mark.parametrize("command", ["check", "revert", "status"])
def test_usage_shows_path_or_installed_as_required_and_every_option(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    usage, _, options = capsys.readouterr().out.partition("\n\n")
    usage = " ".join(usage.split())
    assert usage.startswith(f"usage: sr-prefetch {command} [-h] (PATH | --installed) "), usage
    assert all(option in usage for option in set(re.findall(r"--[a-z-]+", options)) - {"--help"})
    # and one of them is indeed required
    assert cli.main([command]) == 1
    assert f"sr-prefetch {command} needs PATH or --installed" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["apply", "check", "revert", "status", "export"])
def test_the_base_option_is_described_in_a_sentence(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    described = re.search(r"--base RELEASE (.*?)(?= -[-a-z]|$)", text)
    assert described is not None, text
    assert described.group(1).startswith("the vLLM release the target is based on")
    assert described.group(1).endswith(".") and ";." not in described.group(1), described


# --- the cached pristine trees ----------------------------------------------------------------


def test_the_pristine_tree_is_the_newest_release_s_source(pristine: Path) -> None:
    assert tree.read_version(pristine) == NEWEST.version
    assert git(pristine, "describe", "--tags").strip() == f"v{NEWEST.version}"
    assert git(pristine, "log", "--format=%s") == f"vLLM v{NEWEST.version}\n"
    assert not list(pristine.rglob("*.so")), "compiled binaries are not source"
    shipped = {
        path: hashlib.sha256((pristine / path).read_bytes()).hexdigest() for path in targets.PATHS
    }
    assert shipped == releases.pristine_sha256()[NEWEST.version]


def test_apply_without_a_path_patches_the_cached_pristine_tree(
    pristine: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cached = small_git_copy(pristine, pristine_path(NEWEST))
    status, out = run(capsys, "apply")
    assert status == 0, out
    assert f"at {cached}" in out and f"git -C {cached} diff" in out
    # The hint shows the added (untracked) files too, and changes nothing.
    assert f"git -C {cached} status --short -uall" in out
    assert changed_files(cached) == changed_paths(Design.RESET) | added_paths()
    # The commit stays pristine: HEAD is the base to diff and export against.
    assert git(cached, "log", "--format=%s") == f"vLLM v{NEWEST.version}\n"
    status, out = run(capsys, "apply")
    assert status == 0 and "already applied" in out, out


def test_base_picks_the_release_that_apply_and_export_patch_without_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The older release's pristine tree is built once in the shared cache; this test's
    # own cache gets a small copy of it.
    shared = sources.pristine_tree(OLDER)
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(tmp_path / "cache"))
    cached = small_git_copy(shared, pristine_path(OLDER), OLDER)
    capsys.readouterr()

    mail = tmp_path / "older.patch"
    status, out = run(capsys, "export", "--base", OLDER.version, "-o", mail)
    assert status == 0, out
    assert f"against vLLM v{OLDER.version}" in out
    # Its message is the older release's: FlashInfer's ReplaySSM call came in 0.30.0.
    message = mail.read_text().partition("\n---\n")[0]
    assert "ssu_dispatch.py:" in " ".join(message.split())
    assert "selective_state_update_replayssm_flashinfer" not in message

    status, out = run(capsys, "apply", "--base", OLDER.version)
    assert status == 0, out
    assert f"vLLM {OLDER.version} (git tree) at {cached}" in out
    assert "no such site" not in out  # every release has every site
    assert tree.resolve(cached).release == OLDER
    # What apply did to the cached tree is exactly the exported patch.
    git(cached, "apply", "-R", mail)
    assert git(cached, "status", "--porcelain", "-uall") == ""


# --- what is added, and kept current ----------------------------------------------------------


@pytest.mark.parametrize("design", list(Design), ids=str)
def test_vendored_files_equal_what_runner_hooks_produces(
    small_tree: Path, design: Design, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", small_tree, "--design", design)[0] == 0
    produced = vendor.vendored_files(design)
    package = small_tree / vendor.VENDORED_PACKAGE
    in_tree = {
        path.relative_to(small_tree).as_posix(): path.read_bytes()
        for path in package.rglob("*")
        if path.is_file()
    }
    assert in_tree == produced
    assert {p.removeprefix(vendor.VENDORED_PACKAGE + "/") for p in produced} == {
        path.name for path in vendor.closure(design)
    }


def test_status_flags_a_vendored_copy_that_runner_hooks_has_moved_past(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "apply", small_tree)[0] == 0
    reset = small_tree / vendor.VENDORED_PACKAGE / "reset.py"
    reset.write_text(reset.read_text() + "# an old copy\n")
    status, out = run(capsys, "status", small_tree)
    assert status == 0, out
    assert "stale" in out
    assert f"sr-prefetch revert {small_tree} && sr-prefetch apply {small_tree}" in out
    # apply has nothing to do, and says the copy is stale.
    status, out = run(capsys, "apply", small_tree)
    assert status == 0 and "nothing to do" in out and "stale" in out, out


# --- telling the version and the release ------------------------------------------------------


def test_status_of_an_unsupported_version_says_so(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version_file = small_tree / "vllm" / "_version.py"
    version_file.write_text(version_file.read_text().replace(NEWEST.version, "0.34.1"))
    status, out = run(capsys, "status", small_tree)
    assert status == 1
    assert "vLLM version: 0.34.1\n" in out
    assert f"newer than the newest supported release, {NEWEST.version}" in out and "--base" in out


def test_a_fork_checkout_s_version_comes_from_its_tag_and_names_its_base(
    small_tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (small_tree / "vllm" / "_version.py").unlink()
    commit(small_tree, "drop _version.py")
    assert tree.read_version(small_tree) == f"{NEWEST.version}+1"

    status, out = run(capsys, "status", small_tree)
    assert status == 0, out
    assert f"Note: vLLM {NEWEST.version}+1 is taken to be based on {NEWEST.version}" in out
    assert f"vLLM version: {NEWEST.version}+1" in out
    assert f"Based on release: {NEWEST.version}" in out
    # Naming the base says what the note inferred: no note.
    status, out = run(capsys, "status", small_tree, "--base", NEWEST.version)
    assert status == 0 and "Note:" not in out, out


def test_versions_lists_every_release_with_its_pins_and_call_sites(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out = run(capsys, "versions")
    assert status == 0, out
    for release in releases.RELEASES:
        assert f"{release.version}  torch=={release.torch}  " in out
        assert f"flashinfer-python=={release.flashinfer}" in out
    assert "not in this release" not in out  # every release has every site
    assert all(str(site) in out for site in Site)


def test_versions_with_files_locates_every_call_site(
    pristine: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The newest release only, its files read from the pristine tree rather than its wheel.
    monkeypatch.setattr(cli, "RELEASES", (NEWEST,))
    monkeypatch.setattr(
        sources,
        "release_files",
        lambda release, paths: {p: (pristine / p).read_bytes() for p in paths},
    )
    status, out = run(capsys, "versions", "--files")
    assert status == 0, out
    assert "NOT FOUND" not in out
    hooked_in = {
        Site.V1_EXECUTE_MODEL: v1_runner.PATH,
        Site.V1_DUMMY_RUN: v1_runner.PATH,
        Site.V2_EXECUTE_MODEL: v2_runner.PATH,
        Site.V2_REPLAY: v2_runner.PATH,
        Site.V2_CAPTURE: v2_cudagraph.PATH,
    }
    assert set(hooked_in) == set(Site)
    for site, path in hooked_in.items():
        line = next(line for line in out.splitlines() if line.startswith(f"  {site}  "))
        assert re.search(rf"{re.escape(Path(path).name)} (before |after )?line \d+", line), line


# --- a tree outside git -----------------------------------------------------------------------


def test_a_tree_outside_git_is_patched_and_reverted(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = small_copy(pristine, tmp_path / "plain")
    before = snapshot(plain)
    status, out = run(capsys, "apply", plain)
    assert status == 0, out
    assert "(source tree without git)" in out
    assert (plain / fork_test.PATH).is_file()
    assert run(capsys, "revert", plain)[0] == 0
    assert snapshot(plain) == before
