"""The `vllm.general_plugins` plugin: the reset design in a stock vLLM, no file changed.

vLLM loads every entry point of the `vllm.general_plugins` group in each of its
processes (API server, engine core, workers), `VLLM_PLUGINS` choosing among them, and
calls it before it imports its model runners.  This package's entry point,
`sr_seed_prefetch = "vllm_patch.plugin:register"`, does nothing unless
VLLM_MAMBA_SR_SEED_PREFETCH=1.  With it set, `register` reads the installed vLLM's
version, finds its release in the file patch's table (releases.py), computes in memory,
with the file patch's own edits (targets/), the text the file patch would write into
each module it edits, and installs a `sys.meta_path` finder (plugin_attach.py) that
serves those texts and the modules the patch adds (the vendored unit, vendor.py, whose
Triton kernel draws the seeds: nothing is built).  So what runs is what the file patch
runs.  vllm/envs.py is imported before any plugin, so the variable is added to its
`environment_variables` table and left out of `compile_factors`, as the file patch's
edit of envs.py does.

Where it cannot attach (a release outside the table, a call site that moved, a module
to serve already imported, a value of the variable that is not an integer) it says so
in one warning and vLLM runs as stock; where the file patch is applied to the installed
vLLM (its kept originals or its vendored package are there), in one info line.  A later
call in the same process changes nothing and logs nothing new.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from . import patch, releases, targets, tree, vendor
from .plugin_attach import PluginFinder, Served, module_name
from .releases import Design
from .targets import envs as envs_target

GROUP = "vllm.general_plugins"
NAME = "sr_seed_prefetch"
"""The entry point's name: what VLLM_PLUGINS names to load it."""
VALUE = "vllm_patch.plugin:register"
VARIABLE = envs_target.VARIABLES[Design.RESET][0]
ENGAGED = (
    "sr_seed_prefetch plugin: vLLM %s prefetches Mamba stochastic-rounding seeds (reset "
    "design), its modules served from memory; no file changed."
)
"""What the plugin logs, once per process, where it engages (%s: the vLLM version)."""
LOGGER = f"vllm.plugins.{NAME}"
"""The plugin's logger: under `vllm`, so that vLLM's logging configuration shows it."""


class PluginRefused(Exception):
    """The plugin does not attach; the message, one line, says why and what to do."""


class BadValue(PluginRefused):
    """VLLM_MAMBA_SR_SEED_PREFETCH is set to something that is not an integer."""


class UnsupportedVersion(PluginRefused):
    """The installed vLLM is not a release of the table, or tells no version."""


class SiteMoved(PluginRefused):
    """A file or call site the file patch edits is not where this release has it."""


class AlreadyImported(PluginRefused):
    """A module the plugin serves was imported before vLLM loaded the plugin."""


class StandsDown(PluginRefused):
    """The file patch is applied to the installed vLLM: it engages by itself."""


@dataclass(frozen=True)
class Attachment:
    """What the plugin serves to one installed vLLM."""

    root: Path
    release: releases.Release
    version: str
    modules: dict[str, Served]
    """module name -> its file and the text that runs in its place."""

    def finder(self) -> PluginFinder:
        return PluginFinder(self.modules)


def _getters(namespace: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """The reset design's entries of vLLM's `environment_variables`, evaluated from
    landing/envs.py's text (the file patch's) with the globals `namespace`."""
    code = "{\n" + envs_target.definitions(Design.RESET) + "}"
    return eval(compile(code, "landing/envs.py", "eval"), namespace)


def is_on() -> bool:
    """Whether VLLM_MAMBA_SR_SEED_PREFETCH is on, read as vLLM reads it; BadValue where
    it is not an integer."""
    try:
        return bool(_getters({"os": os})[VARIABLE]())
    except ValueError:
        raise BadValue(
            f"{VARIABLE}={os.environ.get(VARIABLE)!r} is not an integer: set it to 1 to "
            "engage the seed prefetch, or unset it"
        ) from None


def file_patch_marker(root: Path) -> Path | None:
    """What shows the file patch applied to the vLLM at `root` (patch.status reads a
    design as applied only with its vendored package there): its kept originals or
    its vendored package; None where neither is."""
    for folder in (patch.ORIGINALS, vendor.VENDORED_PACKAGE):
        if (root / folder).is_dir():
            return root / folder
    return None


def attachment(root: Path) -> Attachment:
    """What the plugin would serve to the vLLM installed at `root`: the file patch's
    text of every module it edits in this release (not envs.py) and the modules it
    adds.  PluginRefused where it cannot (StandsDown over the file patch)."""
    marker = file_patch_marker(root)
    if marker is not None:
        raise StandsDown(
            f"the file patch is applied to the vLLM at {root} ({marker} is there), so "
            "the sr_seed_prefetch plugin stands down: `sr-prefetch status --installed` "
            "shows it; revert it to use the plugin instead"
        )
    version = tree.read_version(root)
    if version is None:
        raise UnsupportedVersion(
            f"cannot tell the version of the vLLM at {root}: reinstall vLLM with pip"
        )
    try:
        release, _ = releases.base_of(version)
    except releases.UnsupportedRelease as error:
        raise UnsupportedVersion(f"{error}; the plugin supports {releases.supported()}") from None
    target = tree.Target(root, tree.Kind.INSTALLED, version, release)
    modules: dict[str, Served] = {}
    for file_ops in targets.file_operations(Design.RESET, release):
        if file_ops.path == envs_target.PATH:
            continue  # imported before plugins load: register() adds the variable
        file = root / file_ops.path
        if not file.is_file():
            raise SiteMoved(
                f"{file_ops.path} is missing from vLLM {version} at {root}: reinstall "
                f"vLLM {release.version}"
            )
        text = file.read_bytes().decode("utf-8")
        try:
            edited = patch.patched_text(target, text, file_ops)
        except patch.PatchError as error:
            raise SiteMoved(
                " ".join(str(error).split()) + f": reinstall vLLM {release.version} as "
                f"released (pip install --force-reinstall --no-deps vllm=={release.version})"
            ) from None
        if edited != text:
            modules[module_name(file_ops.path)] = Served(file, edited)
    for path, data in vendor.vendored_files(Design.RESET).items():
        modules[module_name(path)] = Served(root / path, data.decode("utf-8"))
    return Attachment(root, release, version, modules)


def _declare_variable(envs: ModuleType) -> None:
    """VLLM_MAMBA_SR_SEED_PREFETCH in `envs` (vllm.envs, imported before any plugin)
    as the file patch's envs.py has it: defined in `environment_variables`, and left
    out of `compile_factors`' result (toggling it keeps the compile cache)."""
    getters = _getters(vars(envs))
    for name, getter in getters.items():
        envs.environment_variables.setdefault(name, getter)
    stock = envs.compile_factors
    if getattr(stock, "sr_seed_prefetch", False):
        return

    @functools.wraps(stock)
    def compile_factors() -> dict[str, object]:
        factors = stock()
        for name in getters:
            factors.pop(name, None)
        return factors

    compile_factors.sr_seed_prefetch = True  # type: ignore[attr-defined]
    envs.compile_factors = compile_factors


def installed_finder() -> PluginFinder | None:
    """The plugin's finder where an earlier call installed it in this process."""
    return next((f for f in sys.meta_path if isinstance(f, PluginFinder)), None)


def engage(root: Path) -> Attachment:
    """Attaches to the vLLM at `root`, the one this process imports: PluginRefused,
    with nothing changed, where it cannot; else adds the variable to vllm.envs and
    puts the finder first on sys.meta_path."""
    found = attachment(root)
    imported = sorted(name for name in found.modules if name in sys.modules)
    if imported:
        raise AlreadyImported(
            f"{', '.join(imported)} {'was' if len(imported) == 1 else 'were'} imported before "
            "vLLM loaded the sr_seed_prefetch plugin, so it cannot serve "
            f"{'it' if len(imported) == 1 else 'them'}: import vLLM's model code only "
            "after vLLM has loaded its plugins"
        )
    import vllm.envs

    _declare_variable(vllm.envs)
    sys.meta_path.insert(0, found.finder())
    return found


def register() -> None:
    """The entry point vLLM calls in each process (plugins may be loaded several times;
    VLLM_PLUGINS is vLLM's to apply, before it calls this)."""
    if installed_finder() is not None:
        return
    from vllm.logger import init_logger

    logger = init_logger(LOGGER)
    try:
        if not is_on():
            return
        found = engage(tree.installed_root())
    except PluginRefused as refusal:
        if isinstance(refusal, StandsDown):
            logger.info_once("%s", str(refusal))
        else:
            logger.warning_once(
                "%s is set but unused: the sr_seed_prefetch plugin does not attach, vLLM "
                "runs as stock: %s",
                VARIABLE,
                str(refusal),
            )
        return
    logger.info_once(ENGAGED, found.version)


def entry_point_installed() -> bool:
    """Whether this Python's packages declare the entry point (as vLLM looks it up)."""
    return any(
        ep.name == NAME and ep.value == VALUE for ep in importlib.metadata.entry_points(group=GROUP)
    )


def describe(root: Path) -> str:
    """`sr-prefetch status`'s word on the plugin for the vLLM this Python imports, at
    `root`: its entry point, and whether it would engage."""
    installed = entry_point_installed()
    parts = [
        f"entry point {NAME} "
        + ("installed" if installed else "not installed (pip install this package)")
    ]
    allowed = os.environ.get("VLLM_PLUGINS")
    left_out = allowed is not None and NAME not in allowed.split(",")
    if left_out:
        parts.append(f"VLLM_PLUGINS={allowed!r} leaves it out")
    try:
        on = is_on()
        found = attachment(root)
    except PluginRefused as refusal:
        parts.append(f"does not attach: {refusal}")
    else:
        where = f"vLLM {found.version}'s {len(found.modules)} modules"
        if not on:
            parts.append(f"off ({VARIABLE} unset or 0; {where} found)")
        elif installed and not left_out:
            parts.append(f"engages: {where} served")
        else:
            parts.append(f"would engage where vLLM loads it: {where} found")
    return "; ".join(parts)
