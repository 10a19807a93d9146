"""git, as sr-prefetch runs it in a tree: whether a directory is a work tree, its local
changes, clones and commits, and the identities commits are made with."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


class GitError(Exception):
    """git is missing, or a git command failed; the message says which and why."""


class GitRefused(GitError):
    """A directory has a .git that git will not read (another owner, or a broken
    repository): taking it for a tree without git would judge its local edits wrongly."""


def is_git_worktree(root: Path) -> bool:
    """Whether `root` is the top of a git work tree (not merely inside one); GitRefused
    where `root` has a .git that git will not read."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True
        )
    except FileNotFoundError:
        return False
    if result.returncode == 0:
        return Path(result.stdout.strip()).resolve() == root
    if not (root / ".git").exists():
        return False
    said = (result.stderr.strip().splitlines() or ["no reason given"])[0]
    fix = (
        f"run as its owner, or trust it with git config --global --add safe.directory {root}"
        if "dubious ownership" in said
        else "repair it, or move its .git away to patch it as a tree without git"
    )
    raise GitRefused(f"git refuses the git tree at {root} ({said}): {fix}")


def dirty_paths(root: Path, relpaths: list[str]) -> list[str]:
    """Those of `relpaths` that differ from HEAD or are untracked, in a git work tree."""
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *relpaths)
    return sorted({line[3:].strip() for line in (out or "").splitlines() if line.strip()})


def clone(source: Path, destination: Path) -> Path:
    """A fresh work tree of `source`'s HEAD at `destination` (cheap: local objects are linked)."""
    _git(source.parent, "clone", "--quiet", str(source), str(destination))
    return destination


def init_tagged(root: Path, tag: str) -> None:
    """Makes the files at `root` a git repository of one commit, "vLLM <tag>", tagged
    `tag`, by sr-prefetch's own identity (a pristine tree)."""
    _git(root, "init", "--quiet")
    _git(root, "add", "--all")
    _commit(root, f"vLLM {tag}")
    _git(root, "tag", tag)


def describe(root: Path) -> str | None:
    """`git describe` of HEAD by the newest v* tag, or None where there is none."""
    return _git(root, "describe", "--tags", "--match", "v*", check=False)


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
            raise GitError("git is not installed; sr-prefetch needs it") from None
        return None
    if result.returncode != 0:
        if check:
            raise GitError(f"git {' '.join(args)} failed in {root}: {result.stderr.strip()}")
        return None
    return result.stdout
