"""Finding the vLLM to patch, telling which release it is based on, and pristine trees.

A target is a directory holding the `vllm/` package, of one of three kinds:
a git tree (a fork's checkout, or a pristine tree this module builds in the
cache from a PyPI release), an installed vLLM (a site-packages directory, the
package beside its `vllm-*.dist-info`), or a plain copy of the source.  Every
command first tells the release the target is based on: from its version
string, or from `--base`.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import releases, wheel
from .releases import Release

_ELF_MAGIC = b"\x7fELF"
_VERSION_ASSIGNMENT = re.compile(
    r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)
_DESCRIBE = re.compile(r"^v?(\d+\.\d+\.\d+[^-]*)(?:-(\d+)-g[0-9a-f]+)?$")


class TreeError(Exception):
    """The path cannot be patched as given; the message says why and what to do."""


def find_tree(path: Path) -> Path:
    """The vLLM tree at `path`, resolved; refuses anything that holds no `vllm/` package."""
    root = path.expanduser().resolve()
    if not root.is_dir():
        raise TreeError(f"{path} is not a directory")
    package = root / "vllm"
    if not (package / "__init__.py").is_file() or not (package / "envs.py").is_file():
        hint = " (give the directory that contains it)" if root.name == "vllm" else ""
        raise TreeError(
            f"{root} is not a vLLM tree: it has no vllm/__init__.py and vllm/envs.py{hint}"
        )
    return root


def read_version(root: Path) -> str | None:
    """The vLLM version of the tree at `root`, or None where nothing tells it.

    Read, in order, from `vllm/_version.py` (written by builds and installs,
    kept in the pristine tree), from `git describe` (a fork's checkout has tags
    but no `_version.py`), or from a wheel's `vllm-*.dist-info/METADATA` beside
    the package.  A checkout some commits past a release tag reports that
    release with the count, e.g. `0.33.0+5`.
    """
    version_file = root / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_ASSIGNMENT.search(version_file.read_text(encoding="utf-8"))
        if match:
            return match.group(1)
    described = (
        _git(root, "describe", "--tags", "--match", "v*", check=False)
        if is_git_worktree(root)
        else None
    )
    if described is not None:
        match = _DESCRIBE.match(described.strip())
        if match:
            release, ahead = match.groups()
            return f"{release}+{ahead}" if ahead else release
    for metadata in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in metadata.read_text(encoding="utf-8").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


class Kind(str, enum.Enum):
    """What kind of vLLM a target is; it decides how a patch is kept and taken out."""

    GIT = "git tree"
    INSTALLED = "installed vLLM"
    PLAIN = "source tree without git"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Target:
    """A vLLM to patch: where it is, what kind, and the release it is based on."""

    root: Path
    kind: Kind
    version: str | None
    """As the tree states it (read_version); None where only `--base` names it."""
    release: Release
    note: str | None = None
    """How the release was inferred from the version, where it was not exact."""


def resolve(path: Path, base: str | None = None) -> Target:
    """The target at `path`, its release read from its version or given as `base`."""
    root = find_tree(path)
    version = read_version(root)
    if version is None and base is None:
        raise TreeError(
            f"cannot tell the vLLM version of {root}: no vllm/_version.py, no v* git tag, "
            "no vllm-*.dist-info; name the release it is based on with --base RELEASE"
        )
    if is_git_worktree(root):
        kind = Kind.GIT
    elif any(root.glob("vllm-*.dist-info")):
        kind = Kind.INSTALLED
    else:
        kind = Kind.PLAIN
    try:
        if base is not None:
            release, note = releases.get(base), None
            if version is not None and version.split("+")[0] != release.version:
                note = f"vLLM {version}, patched as {release.version} (--base)"
        else:
            assert version is not None
            release, note = releases.base_of(version)
    except releases.UnsupportedRelease as error:
        raise TreeError(f"{root}: {error}") from None
    return Target(root, kind, version, release, note)


def installed_root() -> Path:
    """The site-packages directory of the vLLM this Python imports (found, not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise TreeError(
            "this Python imports no vLLM; install one, or give the directory that holds "
            "the `vllm` package"
        )
    return Path(spec.origin).resolve().parent.parent


def is_git_worktree(root: Path) -> bool:
    """Whether `root` is the top of a git work tree (not merely inside one)."""
    top = _git(root, "rev-parse", "--show-toplevel", check=False)
    return top is not None and Path(top.strip()).resolve() == root


def dirty_paths(root: Path, relpaths: list[str]) -> list[str]:
    """Those of `relpaths` that differ from HEAD or are untracked, in a git work tree."""
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *relpaths)
    return sorted({line[3:].strip() for line in (out or "").splitlines() if line.strip()})


def cache_dir() -> Path:
    """Where pristine trees and release files live: $SR_PREFETCH_CACHE or
    ~/.cache/sr-prefetch."""
    configured = os.environ.get("SR_PREFETCH_CACHE")
    base = Path(configured) if configured else Path.home() / ".cache" / "sr-prefetch"
    return base.expanduser()


def wheel_dir() -> Path:
    """Where CI keeps the vLLM wheel it installs for the CPU tests (.ci/install-vllm.sh)."""
    return cache_dir() / "wheels"


BUILD_FILES = ("setup.py", "CMakeLists.txt")
"""The files of a pristine tree that come from the release's sdist: what the reset design
edits in a source tree (targets/setup_py.py, targets/cmake_lists.py)."""


def pristine_path(release: Release) -> Path:
    """Where the pristine tree of `release` is cached (a directory per layout: one built
    before setup.py and CMakeLists.txt were part of it, under pristine/, is not reused)."""
    return cache_dir() / "pristine-v2" / f"vllm-{release.version}"


def pristine_tree(release: Release = releases.NEWEST) -> Path:
    """The pristine vLLM tree of `release` as a git repository in the cache, built once.

    Built from the release's PyPI wheel, read member by member over HTTP ranges
    (wheel.py; a few MB rather than the whole wheel): its `vllm/` package, less
    compiled binaries, which a fork's source tree does not track, and setup.py
    and CMakeLists.txt from its sdist (sdist.py), committed as "vLLM v<release>"
    and tagged v<release>.  The commit stays pristine: the commands change only the work
    tree, so `HEAD` is always the base to diff and export against.
    """
    target = pristine_path(release)
    if (target / ".git").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"Fetching the vLLM {release.version} sources from PyPI into {target} (once) ...",
        file=sys.stderr,
    )
    try:
        members = wheel.read_members(release.version)
    except wheel.WheelError as error:
        raise TreeError(f"could not fetch vLLM {release.version}: {error}") from None
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        for name, data in members.items():
            if not name.startswith("vllm/") or data.startswith(_ELF_MAGIC):
                continue
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
        for name, data in release_files(release, BUILD_FILES).items():
            (staging / name).write_bytes(data)
        _git(staging, "init", "--quiet")
        _git(staging, "add", "--all")
        _commit(staging, f"vLLM v{release.version}")
        _git(staging, "tag", f"v{release.version}")
        try:
            staging.rename(target)
        except OSError:
            if not (target / ".git").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def release_files(release: Release, paths: tuple[str, ...]) -> dict[str, bytes]:
    """`paths` of `release`, read once and cached: the package's files and its dist-info
    from its wheel over HTTP ranges, the others (BUILD_FILES) from its sdist."""
    folder = cache_dir() / "files" / release.version
    missing = [path for path in paths if not (folder / path).is_file()]
    if missing:
        from . import sdist  # it finds its cache with cache_dir()

        wheel_dirs = ("vllm/", f"vllm-{release.version}.dist-info/")
        in_wheel = [path for path in missing if path.startswith(wheel_dirs)]
        try:
            fetched = wheel.read_members(release.version, in_wheel) if in_wheel else {}
            if len(in_wheel) < len(missing):
                sdist.fetch(release.version)
                fetched |= sdist.read_members(
                    release.version, [p for p in missing if p not in in_wheel]
                )
        except (wheel.WheelError, sdist.SdistError) as error:
            raise TreeError(f"could not fetch vLLM {release.version}: {error}") from None
        for path, data in fetched.items():
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            staged = (folder / path).with_name(f".{Path(path).name}.part")
            staged.write_bytes(data)
            staged.replace(folder / path)
    return {path: (folder / path).read_bytes() for path in paths}


def clone(source: Path, destination: Path) -> Path:
    """A fresh work tree of `source`'s HEAD at `destination` (cheap: local objects are linked)."""
    _git(source.parent, "clone", "--quiet", str(source), str(destination))
    return destination


def commit_all(
    root: Path, message: str, identity: Identity | None = None, *, signoff: bool = False
) -> None:
    """Commits every change in the work tree at `root` with `message`, authored and
    committed by `identity` (None: GIT_IDENTITY's), with its `Signed-off-by:` trailer
    where `signoff`."""
    _git(root, "add", "--all")
    _commit(root, message, identity, signoff=signoff)


def format_patch(root: Path) -> str:
    """HEAD of `root` as a `git am`-able mail."""
    return _git(root, "format-patch", "-1", "--stdout", "HEAD") or ""


@dataclass(frozen=True)
class Identity:
    """A git identity, as commits and `Signed-off-by:` trailers write it."""

    name: str
    email: str

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


OWN_IDENTITY = Identity("sr-prefetch", "sr-prefetch@localhost")
"""The identity of sr-prefetch's own commits (the pristine trees), and of an exported
patch where git has none configured."""

GIT_IDENTITY = (
    "-c",
    f"user.name={OWN_IDENTITY.name}",
    "-c",
    f"user.email={OWN_IDENTITY.email}",
    "-c",
    "commit.gpgsign=false",
)
"""git options that let sr-prefetch commit in a tree whatever the user's git config."""

_IDENT = re.compile(r"^(?P<name>.*) <(?P<email>[^<>]*)> \d+ [+-]\d{4}$")

NO_IDENTITY = (
    "git has no identity configured here to sign off with: set one with "
    "git config --global user.name 'Your Name' and "
    "git config --global user.email you@example.com "
    "(or GIT_AUTHOR_NAME and GIT_AUTHOR_EMAIL); nothing was written"
)
"""Why `export --signoff` refuses without an identity (one line)."""


def user_identity(cwd: Path | None = None) -> Identity | None:
    """The author identity git resolves in `cwd` (default: the current directory), as
    `git var GIT_AUTHOR_IDENT` gives it: GIT_AUTHOR_NAME and GIT_AUTHOR_EMAIL, else
    user.name and user.email of the configuration there (the repository's, the global,
    the system's).  None where git has none configured: an identity git would only
    guess from the user and host names (user.useConfigOnly) is not taken, nor is one
    git is missing to tell."""
    out = _git(
        cwd or Path.cwd(), "-c", "user.useConfigOnly=true", "var", "GIT_AUTHOR_IDENT", check=False
    )
    match = _IDENT.match((out or "").strip())
    if match is None or not match["name"].strip() or not match["email"].strip():
        return None
    return Identity(match["name"].strip(), match["email"].strip())


def _commit(
    root: Path, message: str, identity: Identity | None = None, *, signoff: bool = False
) -> None:
    who = identity or OWN_IDENTITY
    # The environment, not `-c user.*`: GIT_AUTHOR_* and GIT_COMMITTER_* set by the
    # user would override the configuration, and the trailer is the committer's.
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": who.name,
        "GIT_AUTHOR_EMAIL": who.email,
        "GIT_COMMITTER_NAME": who.name,
        "GIT_COMMITTER_EMAIL": who.email,
    }
    _git(
        root,
        *GIT_IDENTITY,
        "commit",
        "--quiet",
        "--no-verify",
        *(["--signoff"] if signoff else []),
        "--message",
        message,
        env=env,
    )


def _git(
    root: Path, *args: str, check: bool = True, env: dict[str, str] | None = None
) -> str | None:
    """git's stdout, or None (with check=False) when it fails or is missing."""
    try:
        result = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False, env=env
        )
    except FileNotFoundError:
        if check:
            raise TreeError("git is not installed; sr-prefetch needs it") from None
        return None
    if result.returncode != 0:
        if check:
            raise TreeError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
        return None
    return result.stdout
