"""The `vllm.general_plugins` plugin (vllm_patch/plugin.py), on the CPU.

For every release of the table the plugin finds its attach points in the release's
files (read from its wheel, cached, as test_releases.py reads them) and serves, for each
module the file patch edits, the text `sr-prefetch apply` writes there, byte for byte.
A moved site, a release outside the table, an already imported module and a bad value
are refused in one line with sys.meta_path and vllm.envs as they were; the plugin is
idempotent, off without the variable, stands down over the file patch, and is loaded
by vLLM's own plugin loader (vLLM 0.33.0, installed) only where VLLM_PLUGINS allows.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_readme_commands import _blocks, _lines, sr_prefetch_commands
from tests.vllm_patch.helpers import run, tree_files
from vllm_patch import cli, plugin, releases, sources, targets, tree, vendor
from vllm_patch.plugin_attach import PluginFinder, Served, module_name
from vllm_patch.releases import RELEASES, Design
from vllm_patch.targets import envs as envs_target
from vllm_patch.targets import ssu_dispatch

REPO = Path(__file__).resolve().parents[2]
VERSIONS = [release.version for release in RELEASES]


def release_root(root: Path, release: releases.Release) -> Path:
    """A folder laid out as an installed vLLM of `release`, holding the files the
    plugin reads (tree_files)."""
    for path, data in sources.release_files(release, tree_files(release)).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def edited_paths(release: releases.Release) -> list[str]:
    """The files the plugin serves edited in `release`: the file patch's, but envs.py
    (register() adds its variable)."""
    return [
        fo.path
        for fo in targets.file_operations(Design.RESET, release)
        if fo.path != envs_target.PATH
    ]


@pytest.fixture
def root_033(tmp_path: Path) -> Path:
    return release_root(tmp_path / "site", releases.NEWEST)


@pytest.fixture
def clean_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's import system and vllm.envs, given back as they were after the
    test: what register() changes when it engages."""
    import vllm.envs

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(vllm.envs, "environment_variables", dict(vllm.envs.environment_variables))
    monkeypatch.setattr(vllm.envs, "compile_factors", vllm.envs.compile_factors)
    for name in plugin.attachment(tree.installed_root()).modules:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield


def registered(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, calls: int = 1
) -> list[str]:
    """The plugin's log lines after `calls` calls of register() against the vLLM at
    `root`."""
    monkeypatch.setattr(tree, "installed_root", lambda: root)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=plugin.LOGGER):
        for _ in range(calls):
            plugin.register()
    return [r.getMessage() for r in caplog.records if r.name == plugin.LOGGER]


def finders() -> list[PluginFinder]:
    return [finder for finder in sys.meta_path if isinstance(finder, PluginFinder)]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_serves_what_apply_writes(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = releases.get(version)
    root = release_root(tmp_path / "site", release)
    found = plugin.attachment(root)
    assert found.release is release and found.version == version
    edited = edited_paths(release)
    added = list(vendor.vendored_files(Design.RESET))
    assert sorted(found.modules) == sorted(module_name(path) for path in edited + added)
    status, out = run(capsys, "apply", root)  # the file patch, on the same files
    assert status == 0, out
    for path in edited + added:
        served = found.modules[module_name(path)]
        assert served.path == root / path
        assert served.text.encode() == (root / path).read_bytes(), path
        compile(served.text, path, "exec")


def test_a_moved_site_is_refused_in_one_line(
    root_033: Path,
    clean_process: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(plugin.VARIABLE, "1")
    file = root_033 / ssu_dispatch.PATH
    text = file.read_text()
    assert "torch.randint(0, 2**32, (1,)" in text
    file.write_text(text.replace("torch.randint(0, 2**32, (1,)", "torch.randint(0, 2**31, (1,)"))
    with pytest.raises(plugin.SiteMoved) as refused:
        plugin.attachment(root_033)
    assert ssu_dispatch.PATH in str(refused.value) and "0.33.0" in str(refused.value)
    lines = registered(root_033, monkeypatch, caplog, calls=2)
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"{plugin.VARIABLE} is set but unused:") and "stock" in lines[0]
    assert not finders()


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_refuses_each_attach_point_that_moved(version: str, tmp_path: Path) -> None:
    """In each release, every file the plugin edits, its call sites gone (the file
    emptied), is refused by name, and so is the file missing."""
    release = releases.get(version)
    root = release_root(tmp_path / "site", release)
    edited = edited_paths(release)
    assert edited
    for path in edited:
        file = root / path
        text = file.read_bytes()
        file.write_text("")
        with pytest.raises(plugin.SiteMoved) as refused:
            plugin.attachment(root)
        assert path in str(refused.value) and "\n" not in str(refused.value)
        file.unlink()
        with pytest.raises(plugin.SiteMoved, match="is missing"):
            plugin.attachment(root)
        file.write_bytes(text)
    assert plugin.attachment(root).release is release


def test_a_missing_file_is_refused(root_033: Path) -> None:
    (root_033 / "vllm/v1/worker/gpu_model_runner.py").unlink()
    with pytest.raises(plugin.SiteMoved, match=r"gpu_model_runner\.py is missing"):
        plugin.attachment(root_033)


@pytest.mark.parametrize("version", ["0.19.1", "0.34.0"])
def test_a_release_outside_the_table_is_refused(root_033: Path, version: str) -> None:
    (root_033 / "vllm/_version.py").write_text(f"__version__ = version = '{version}'\n")
    with pytest.raises(plugin.UnsupportedVersion) as refused:
        plugin.attachment(root_033)
    assert "\n" not in str(refused.value) and releases.supported() in str(refused.value)


def test_engages_once_with_nothing_built(
    root_033: Path,
    tmp_path: Path,
    clean_process: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An empty sr-prefetch cache: the plugin has nothing to build or find there."""
    import vllm.envs

    monkeypatch.setenv("SR_PREFETCH_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv(plugin.VARIABLE, "1")
    lines = registered(root_033, monkeypatch, caplog, calls=3)
    assert len(lines) == 1 and "0.33.0" in lines[0] and "no file changed" in lines[0], lines
    [finder] = finders()
    assert sys.meta_path[0] is finder
    assert finder.names() == sorted(plugin.attachment(root_033).modules)
    assert not (tmp_path / "empty").exists()
    assert vllm.envs.VLLM_MAMBA_SR_SEED_PREFETCH is True
    assert plugin.VARIABLE not in vllm.envs.compile_factors()
    spec = finder.find_spec(module_name(ssu_dispatch.PATH))
    assert spec is not None and spec.origin == str(root_033 / ssu_dispatch.PATH)
    assert finder.find_spec("vllm.config") is None


def test_off_without_the_variable(
    root_033: Path,
    clean_process: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import vllm.envs

    for value in (None, "0"):
        if value is None:
            monkeypatch.delenv(plugin.VARIABLE, raising=False)
        else:
            monkeypatch.setenv(plugin.VARIABLE, value)
        assert registered(root_033, monkeypatch, caplog) == []
        assert not finders()
        assert plugin.VARIABLE not in vllm.envs.environment_variables


def test_a_bad_value_is_refused_in_one_line(
    root_033: Path,
    clean_process: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(plugin.VARIABLE, "yes")
    [line] = registered(root_033, monkeypatch, caplog)
    assert "'yes' is not an integer" in line
    assert not finders()


def test_an_imported_module_is_refused_in_one_line(
    root_033: Path,
    clean_process: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import vllm.envs

    monkeypatch.setenv(plugin.VARIABLE, "1")
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", object())
    [line] = registered(root_033, monkeypatch, caplog)
    assert "vllm.v1.worker.gpu_model_runner was imported before vLLM loaded" in line
    assert not finders()
    assert plugin.VARIABLE not in vllm.envs.environment_variables


def test_stands_down_over_the_file_patch(
    root_033: Path,
    clean_process: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(plugin.VARIABLE, "1")
    status, out = run(capsys, "apply", root_033)
    assert status == 0, out
    lines = registered(root_033, monkeypatch, caplog)
    assert len(lines) == 1 and "stands down" in lines[0], lines
    assert [r.levelno for r in caplog.records if r.name == plugin.LOGGER] == [logging.INFO]
    assert not finders()
    status, out = run(capsys, "revert", root_033)
    assert status == 0, out
    assert plugin.file_patch_marker(root_033) is None


def test_the_entry_point_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["entry-points"][plugin.GROUP] == {plugin.NAME: plugin.VALUE}
    module, _, function = plugin.VALUE.partition(":")
    assert module == plugin.__name__ and callable(getattr(plugin, function))


def _vllm_process(tmp_path: Path, env: dict[str, str], code: str) -> str:
    """`code` run by this Python after vLLM's own plugin loader, with a distribution
    that declares the entry point on the path (as pip's install of this package does);
    returns what it printed."""
    dist = tmp_path / "dist" / "sr_seed_prefetch_plugin_test-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sr-seed-prefetch-plugin-test\nVersion: 0\n"
    )
    (dist / "entry_points.txt").write_text(f"[{plugin.GROUP}]\n{plugin.NAME} = {plugin.VALUE}\n")
    script = (
        "import sys\nfrom vllm.plugins import load_general_plugins\nload_general_plugins()\n"
        "from vllm_patch.plugin_attach import PluginFinder\n"
        "engaged = any(isinstance(f, PluginFinder) for f in sys.meta_path)\n" + code
    )
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(dist.parent)]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "SR_PREFETCH_CACHE": str(tmp_path / "cache"),
        **env,
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_vllms_loader_engages_it_and_the_served_modules_import(tmp_path: Path) -> None:
    """Nothing built beforehand: pip's install and the variable are the whole set-up."""
    code = (
        "import inspect\nimport vllm.envs as envs\n"
        "from vllm.model_executor.layers.mamba.ops import ssu_dispatch\n"
        "from vllm.v1.worker import gpu_model_runner\n"
        "from vllm.v1.worker.gpu import cudagraph_utils, model_runner\n"
        "print(engaged, envs.VLLM_MAMBA_SR_SEED_PREFETCH,\n"
        "      hasattr(ssu_dispatch, 'prefetched_sr_seed'),\n"
        "      'sr_seed_forward' in inspect.getsource(gpu_model_runner.GPUModelRunner),\n"
        "      'VLLM_MAMBA_SR_SEED_PREFETCH' in envs.compile_factors())\n"
    )
    out = _vllm_process(tmp_path, {plugin.VARIABLE: "1"}, code)
    assert out.splitlines()[-1] == "True True True True False", out
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("allowed", "engages"), [("other_plugin", False), (f"other_plugin,{plugin.NAME}", True)]
)
def test_vllm_plugins_chooses(tmp_path: Path, allowed: str, engages: bool) -> None:
    env = {plugin.VARIABLE: "1", "VLLM_PLUGINS": allowed}
    out = _vllm_process(tmp_path, env, "print(engaged)\n")
    assert out.splitlines()[-1] == str(engages), out


def test_the_loader_writes_no_bytecode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A served module runs its served text under its file's path, and leaves no .pyc
    that a stock import would load."""
    package = tmp_path / "pkg_sr_served"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("VALUE = 'stock'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    served = Served(package / "mod.py", "VALUE = 'served'\n\ndef f():\n    return 1\n")
    sys.meta_path.insert(0, PluginFinder({"pkg_sr_served.mod": served}))
    try:
        import inspect

        import pkg_sr_served.mod as mod

        assert mod.VALUE == "served" and mod.__file__ == str(package / "mod.py")
        assert "return 1" in inspect.getsource(mod.f)
        assert not list(package.glob("__pycache__/mod.*"))
    finally:
        for name in ("pkg_sr_served", "pkg_sr_served.mod"):
            sys.modules.pop(name, None)


def test_status_has_a_plugin_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SR_PREFETCH_CACHE", str(tmp_path))
    monkeypatch.delenv(plugin.VARIABLE, raising=False)
    status, out = run(capsys, "status", "--installed")
    assert status == 0, out
    [line] = [line for line in out.splitlines() if line.startswith("Plugin: ")]
    assert f"off ({plugin.VARIABLE} unset or 0" in line, line
    # With the variable set, it engages as it is installed: nothing to build first.
    modules = len(plugin.attachment(tree.installed_root()).modules)
    monkeypatch.setenv(plugin.VARIABLE, "1")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    status, out = run(capsys, "status", "--installed")
    assert status == 0, out
    [line] = [line for line in out.splitlines() if line.startswith("Plugin: ")]
    engages = "engages" if plugin.entry_point_installed() else "would engage where vLLM loads it"
    assert f"{engages}: vLLM 0.33.0's {modules} modules" in line, line
    assert "build" not in line and "seed op" not in line, line
    monkeypatch.setenv("VLLM_PLUGINS", "other_plugin")
    line = plugin.describe(tree.installed_root())
    assert "VLLM_PLUGINS='other_plugin' leaves it out" in line, line
    assert f"would engage where vLLM loads it: vLLM 0.33.0's {modules} modules found" in line, line
    assert list(tmp_path.iterdir()) == []  # nothing looked for, or written, in the cache


def test_plugin_md_shows_what_runs() -> None:
    """PLUGIN.md's sr-prefetch commands parse, its log lines are the plugin's and the
    prefetcher's, and its `vllm serve` passes flags the installed vLLM has."""
    text = (REPO / "vllm_patch" / "PLUGIN.md").read_text()
    assert "build-op" not in text and "_mamba_sr_C" not in text  # nothing to build
    for words in sr_prefetch_commands(text):
        cli._parser().parse_args(words)
    assert plugin.ENGAGED % "0.26.0" in text
    landing = (REPO / "vllm_patch" / "landing" / "ssu_reset.py").read_text()
    assert "Prefetching Mamba stochastic-rounding seeds for 40 layers per forward" in text
    assert "Prefetching Mamba stochastic-rounding seeds for %d layers per forward" in landing
    (serve,) = [line for block in _blocks(text) for line in _lines(block) if "vllm serve" in line]
    assert serve.startswith(f"{plugin.VARIABLE}=1 vllm serve")
    arg_utils = (tree.installed_root() / "vllm" / "engine" / "arg_utils.py").read_text()
    for flag in [word for word in serve.split() if word.startswith("--")]:
        assert flag[2:].split(".")[0].replace("-", "_") in arg_utils, flag
