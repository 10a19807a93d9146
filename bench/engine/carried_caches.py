"""What a fresh GPU machine takes over from an earlier one: Triton's autotuning picks
and FlashInfer's JIT builds.

A lent machine keeps nothing between loans, and its first engine or server spends
81 s autotuning the Mamba-2 SSD kernels, then 35.6 s in its first FULL graph capture
(bench/results/serve-nvidia-h200-20261205-starts.md), where FlashInfer JIT-builds its SSU
module, once per vLLM copy (about 30 s on the H200, by the GPU machine's notes). `pack`
writes both into archives that a later call carries; `restore` puts them where Triton
and FlashInfer look before they would tune or build:

- picks: each <key>/<kernel>.autotune.json of TRITON_CACHE_DIR (TRITON_CACHE_AUTOTUNING,
  which vLLM sets). The key holds the Triton version, the GPU backend and the kernel's
  source, so a pick that does not fit is never read.
- builds: each <version>/<arch>/cached_ops/<name>/<name>.so of a FlashInfer workspace,
  into the AOT folder of every site's FlashInfer of that version and this GPU's arch
  (<site>/flashinfer/data/aot/<name>/<name>.so). FlashInfer loads a module found
  there and builds nothing (`JitSpec.build_and_load`); the name holds the module's
  specialization. Every vLLM copy then loads the same binary, where each copy would
  otherwise build its own from the same sources.

Restore never replaces a file, and writes each one whole (a temporary, then a
rename), so a cut restore leaves only complete files, and the next one completes it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path

from .client import CACHE_ROOT

PICKS = "triton-picks.tar.xz"
BUILDS = "flashinfer-builds.tar.xz"
PICKS_ENV, BUILDS_ENV = "SR_TRITON_PICKS", "SR_FLASHINFER_BUILDS"
"""Where restore reads each archive (default: .e2e/<archive name>)."""

_PICK = re.compile(r"[0-9A-Za-z_.-]+/[0-9A-Za-z_.-]+\.autotune\.json")
_BUILD = re.compile(
    r"(?P<version>[0-9A-Za-z_.+-]+)/(?P<arch>[0-9]+[a-z]?)/(?P<name>[0-9A-Za-z_-]+)\.so"
)
_VERSION = re.compile(r"""^__version__ = ["']([^"']+)["']$""", re.MULTILINE)


class CacheArchiveError(RuntimeError):
    """An archive restore cannot read, or one that holds what pack never writes."""


def built_modules(roots: Iterable[Path]) -> dict[str, Path]:
    """Member name (<version>/<arch>/<name>.so) -> one built module of that name found
    under `roots`' FlashInfer workspaces (the first in sorted order)."""
    found: dict[str, Path] = {}
    for root in roots:
        for so in sorted(root.glob("**/.cache/flashinfer/*/*/cached_ops/*/*.so")):
            name = so.parent.name
            version, arch = so.parents[3].name, so.parents[2].name
            member = f"{version}/{arch}/{name}.so"
            if so.name == f"{name}.so" and _BUILD.fullmatch(member):
                found.setdefault(member, so)
    return found


def pack(out: Path, triton_cache: Path | None, workspace_roots: Iterable[Path]) -> list[str]:
    """Writes out/PICKS and out/BUILDS where there is something to put in them;
    returns a line per archive written."""
    out.mkdir(parents=True, exist_ok=True)
    said = []
    if triton_cache is not None and triton_cache.is_dir():
        picks = sorted(triton_cache.glob("*/*.autotune.json"))
        if picks:
            with tarfile.open(out / PICKS, "w:xz") as archive:
                for pick in picks:
                    archive.add(pick, arcname=pick.relative_to(triton_cache).as_posix())
            said.append(f"Triton picks: {len(picks)} into {out / PICKS}")
    modules = built_modules(workspace_roots)
    if modules:
        with tarfile.open(out / BUILDS, "w:xz") as archive:
            for member, so in sorted(modules.items()):
                archive.add(so, arcname=member)
        said.append(f"FlashInfer builds: {', '.join(sorted(modules))} into {out / BUILDS}")
    return said


def _members(path: Path, pattern: re.Pattern[str]) -> dict[str, bytes]:
    """The archive's files, each checked against what pack writes."""
    try:
        with tarfile.open(path, "r:xz") as archive:
            files = {}
            for info in archive:
                parts = info.name.split("/")
                if (
                    not info.isfile()
                    or not pattern.fullmatch(info.name)
                    or {".", ".."} & set(parts)
                ):
                    raise CacheArchiveError(
                        f"{path} holds {info.name!r}, which `pack` never writes: "
                        "remove the archive, or pack a fresh one"
                    )
                reader = archive.extractfile(info)
                assert reader is not None  # a regular file
                files[info.name] = reader.read()
            return files
    except (tarfile.TarError, EOFError, OSError) as error:
        raise CacheArchiveError(
            f"{path} is not a readable tar.xz archive ({error}): remove it, or pack a fresh one"
        ) from None


def _write_new(path: Path, data: bytes) -> bool:
    """Writes `path` whole unless it exists; whether it wrote."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(partial, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    return True


def flashinfer_version(site: Path) -> str | None:
    """The version of the FlashInfer installed in `site`, read without importing it."""
    try:
        text = (site / "flashinfer" / "_build_meta.py").read_text()
    except OSError:
        return None
    match = _VERSION.search(text)
    return match.group(1) if match else None


def restore_picks(files: dict[str, bytes], triton_cache: Path) -> str:
    wrote = sum(_write_new(triton_cache / name, data) for name, data in files.items())
    return f"Triton picks: {wrote} of {len(files)} restored into {triton_cache}"


def restore_builds(files: dict[str, bytes], sites: Iterable[Path], compute_cap: str) -> str:
    """Each module for this GPU (compute capability "9.0": arch 90 or 90a) into the
    AOT folder of every site whose FlashInfer has its version."""
    arch = re.compile(re.escape(compute_cap.replace(".", "")) + "[a-z]?")
    said = []
    for site in sites:
        version = flashinfer_version(site)
        fitting = {
            match["name"]: data
            for name, data in files.items()
            if (match := _BUILD.fullmatch(name))
            and match["version"] == version
            and arch.fullmatch(match["arch"])
        }
        aot = site / "flashinfer" / "data" / "aot"
        wrote = sum(_write_new(aot / name / f"{name}.so", data) for name, data in fitting.items())
        had = f"FlashInfer {version}" if version else "no FlashInfer"
        said.append(f"{site} {wrote} of {len(fitting)} ({had})")
    return "FlashInfer builds restored: " + "; ".join(said)


def restore(sites: list[Path], compute_cap: str, triton_cache: Path | None) -> list[str]:
    """Restores the archives that PICKS_ENV and BUILDS_ENV name (default .e2e/), where
    they exist; reads both whole before writing anything."""
    picks, builds = _archive(PICKS_ENV, PICKS), _archive(BUILDS_ENV, BUILDS)
    pick_files = _members(picks, _PICK) if triton_cache and picks.is_file() else None
    build_files = _members(builds, _BUILD) if builds.is_file() else None
    said = []
    if pick_files is not None and triton_cache is not None:
        said.append(f"{restore_picks(pick_files, triton_cache)} from {picks}")
    if build_files is not None:
        said.append(f"{restore_builds(build_files, sites, compute_cap)} from {builds}")
    return said


def _archive(env: str, name: str) -> Path:
    return Path(os.environ.get(env) or Path(".e2e") / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine.carried_caches", description=__doc__.split("\n\n")[0]
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    pack_verb = verbs.add_parser("pack", help="write the archives into OUT")
    pack_verb.add_argument("out", type=Path)
    restore_verb = verbs.add_parser(
        "restore",
        help=f"restore the archives named by {PICKS_ENV} and {BUILDS_ENV} (default .e2e/)",
    )
    restore_verb.add_argument(
        "sites", type=Path, nargs="+", help="site-packages folders with FlashInfer"
    )
    restore_verb.add_argument(
        "--compute-cap", required=True, help="this GPU's, as nvidia-smi gives it (9.0)"
    )
    args = parser.parse_args(argv)
    triton = os.environ.get("TRITON_CACHE_DIR")
    triton_cache = Path(triton) if triton else None
    try:
        if args.verb == "pack":
            # Each vLLM copy's FlashInfer workspace (client.flashinfer_workspace): the
            # engine harness's in client.CACHE_ROOT, the serve harness's in VLLM_CACHE_ROOT.
            roots = {CACHE_ROOT, Path(os.environ.get("VLLM_CACHE_ROOT", "/tmp/vllm_cache"))}
            if os.environ.get("FLASHINFER_WORKSPACE_BASE"):
                roots.add(Path(os.environ["FLASHINFER_WORKSPACE_BASE"]))
            said = pack(args.out, triton_cache, sorted(r for r in roots if r.is_dir()))
        else:
            said = restore(args.sites, args.compute_cap, triton_cache)
    except (CacheArchiveError, OSError) as error:
        print(f"carried caches: {error}", file=sys.stderr)
        return 1
    for line in said:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
