"""bench/engine/carried_caches.py: Triton's picks and FlashInfer's builds, packed on one
machine and restored on the next."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from bench.engine import carried_caches as cc

SSU = "mamba_selective_state_update_f16"


def _machine(root: Path) -> tuple[Path, Path]:
    """A used machine's Triton cache and FlashInfer workspace roots: two picks, the SSU
    module built by two vLLM copies (one name), and a module of another version."""
    triton = root / "triton"
    for key, kernel in (("KEYA", "_chunk_scan_fwd_kernel"), ("KEYB", "_bmm_chunk_fwd_kernel")):
        (triton / key).mkdir(parents=True)
        (triton / key / f"{kernel}.autotune.json").write_text(f'{{"{kernel}": 1}}')
    (triton / "KEYA" / "kernel.cubin").write_bytes(b"not a pick")
    workspaces = root / "caches"
    for copy, version, name, data in (
        ("flashinfer-stock", "0.6.14", SSU, b"stock build"),
        ("flashinfer-reset", "0.6.14", SSU, b"reset build"),
        ("flashinfer-stock", "0.7.2", "other", b"0.7.2 build"),
    ):
        built = workspaces / copy / ".cache" / "flashinfer" / version / "90a" / "cached_ops" / name
        built.mkdir(parents=True)
        (built / f"{name}.so").write_bytes(data)
        (built / f"{name}.cuda.o").write_bytes(b"an object, not a module")
    return triton, workspaces


def _site(root: Path, version: str | None) -> Path:
    site = root / f"site-{version}"
    (site / "flashinfer").mkdir(parents=True)
    if version is not None:
        (site / "flashinfer" / "_build_meta.py").write_text(
            f'"""Build metadata."""\n__version__ = "{version}"\n__git_version__ = "x"\n'
        )
    return site


def _restore(monkeypatch, archives: Path, triton: Path, *argv: str) -> int:
    monkeypatch.setenv(cc.PICKS_ENV, str(archives / cc.PICKS))
    monkeypatch.setenv(cc.BUILDS_ENV, str(archives / cc.BUILDS))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    return cc.main(["restore", *argv])


def test_a_fresh_machine_gets_the_picks_and_each_site_the_builds_of_its_version(
    tmp_path, monkeypatch, capsys
) -> None:
    triton, workspaces = _machine(tmp_path / "used")
    said = cc.pack(tmp_path / "out", triton, [workspaces])
    assert [line.split(":")[0] for line in said] == ["Triton picks", "FlashInfer builds"]
    with tarfile.open(tmp_path / "out" / cc.BUILDS) as archive:
        assert archive.getnames() == [f"0.6.14/90a/{SSU}.so", "0.7.2/90a/other.so"]
        # One binary per name: the first copy's in sorted order, for every copy.
        member = archive.extractfile(f"0.6.14/90a/{SSU}.so")
        assert member is not None and member.read() == b"reset build"

    fresh = tmp_path / "fresh"
    sites = [_site(fresh, "0.6.14"), _site(fresh, "0.7.2"), _site(fresh, None)]
    code = _restore(
        monkeypatch, tmp_path / "out", fresh / "triton", *map(str, sites), "--compute-cap", "9.0"
    )
    assert code == 0
    picks = sorted(
        p.relative_to(fresh / "triton").as_posix() for p in (fresh / "triton").rglob("*")
    )
    assert picks == [
        "KEYA",
        "KEYA/_chunk_scan_fwd_kernel.autotune.json",
        "KEYB",
        "KEYB/_bmm_chunk_fwd_kernel.autotune.json",
    ]
    aot = [sorted(p.relative_to(s).as_posix() for p in s.rglob("*.so")) for s in sites]
    assert aot == [
        [f"flashinfer/data/aot/{SSU}/{SSU}.so"],
        ["flashinfer/data/aot/other/other.so"],
        [],
    ]
    assert "no FlashInfer" in capsys.readouterr().out


def test_builds_for_another_gpu_are_left_out(tmp_path, monkeypatch) -> None:
    triton, workspaces = _machine(tmp_path / "used")
    cc.pack(tmp_path / "out", triton, [workspaces])
    site = _site(tmp_path / "fresh", "0.6.14")
    assert (
        _restore(monkeypatch, tmp_path / "out", tmp_path / "t", str(site), "--compute-cap", "10.0")
        == 0
    )
    assert not list(site.rglob("*.so"))


def test_restore_replaces_nothing_and_completes_a_cut_one(tmp_path, monkeypatch) -> None:
    """A file already there (built here, or restored before) is kept; a partial file a
    killed restore left is no module, and the next restore writes the module whole."""
    triton, workspaces = _machine(tmp_path / "used")
    cc.pack(tmp_path / "out", triton, [workspaces])
    fresh_triton = tmp_path / "fresh-triton"
    (fresh_triton / "KEYA").mkdir(parents=True)
    (fresh_triton / "KEYA" / "_chunk_scan_fwd_kernel.autotune.json").write_text("picked here")
    site = _site(tmp_path / "fresh", "0.6.14")
    module = site / "flashinfer" / "data" / "aot" / SSU
    module.mkdir(parents=True)
    (module / f".{SSU}.so.123.partial").write_bytes(b"cut")
    assert (
        _restore(monkeypatch, tmp_path / "out", fresh_triton, str(site), "--compute-cap", "9.0")
        == 0
    )
    assert (
        fresh_triton / "KEYA" / "_chunk_scan_fwd_kernel.autotune.json"
    ).read_text() == "picked here"
    assert (fresh_triton / "KEYB" / "_bmm_chunk_fwd_kernel.autotune.json").exists()
    assert (module / f"{SSU}.so").read_bytes() == b"reset build"


@pytest.mark.parametrize("bad", ["not an archive", "a member pack never writes"])
def test_a_bad_archive_is_one_line_and_changes_nothing(tmp_path, monkeypatch, capsys, bad) -> None:
    archives = tmp_path / "out"
    archives.mkdir()
    if bad == "not an archive":
        (archives / cc.BUILDS).write_bytes(b"garbage")
    else:
        with tarfile.open(archives / cc.BUILDS, "w:xz") as archive:
            good = tmp_path / "good.so"
            good.write_bytes(b"fine")
            archive.add(good, arcname=f"0.6.14/90a/{SSU}.so")
            archive.add(good, arcname="../90a/outside.so")
    site = _site(tmp_path / "fresh", "0.6.14")
    assert _restore(monkeypatch, archives, tmp_path / "t", str(site), "--compute-cap", "9.0") == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pack a fresh one" in err
    assert sorted(tmp_path.rglob("outside.so")) == [] and not list(site.rglob("*.so"))


def test_no_archive_no_cache_nothing_to_do(tmp_path, monkeypatch, capsys) -> None:
    site = _site(tmp_path, "0.6.14")
    assert (
        _restore(monkeypatch, tmp_path / "none", tmp_path / "t", str(site), "--compute-cap", "9.0")
        == 0
    )
    assert capsys.readouterr().out == "" and not (tmp_path / "t").exists()
    assert cc.pack(tmp_path, tmp_path / "no-triton-cache", [tmp_path / "no-workspaces"]) == []


def test_engine_sh_restores_into_every_site_it_runs_and_packs_both() -> None:
    """engine.sh restores before any step, into the site and both patched copies, and
    its pack step writes both archives beside engine-run.tar.xz, not into it."""
    script = (
        Path(__file__).resolve().parents[2] / "tests" / "gpu" / "vllm" / "engine.sh"
    ).read_text()
    restore = script.index("-m bench.engine.carried_caches restore")
    assert restore < script.index('for step in "$@"')
    line = script[restore : script.index("\n", restore)]
    assert '"$site" "$site-reset" "$site-forward-context"' in line
    pack = script[script.index("    pack)") : script.index("    serve)")]
    assert "-m bench.engine.carried_caches pack" in pack
    for archive in (cc.PICKS, cc.BUILDS):
        assert f"! -name {archive}" in pack
