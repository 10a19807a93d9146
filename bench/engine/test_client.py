"""bench/engine/client.py: the worker protocol and the vLLM copies."""

from __future__ import annotations

from pathlib import Path

import pytest

from .arms import BY_NAME, STOCK, Runner
from .client import Worker, WorkerError, sites_from_env


def test_worker_protocol(tmp_path: Path) -> None:
    """A worker starts, reports errors as errors, and quits; no vLLM needed."""
    spawned = Worker.spawn(
        STOCK,
        Runner.V1,
        sites={"stock": str(tmp_path)},
        model_dir=tmp_path / "m",
        gpu="",
        log_dir=tmp_path / "logs",
        cache_root=tmp_path / "cache",
        extra_env={"SR_EXTRA": "1"},
    )
    with pytest.raises(WorkerError, match="unknown op 'bogus'"):
        spawned.call("bogus", timeout=60)
    spawned.close()
    assert spawned.process.returncode == 0
    assert "ValueError: unknown op" in spawned.log.read_text()


def test_worker_needs_its_copy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names no vLLM for the 'reset' copy"):
        Worker.spawn(
            BY_NAME["reset"],
            Runner.V1,
            sites={"stock": "/x"},
            model_dir=tmp_path,
            gpu="0",
            log_dir=tmp_path,
            cache_root=tmp_path,
        )


def test_sites_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SR_ENGINE_SITES", raising=False)
    assert sites_from_env() is None
    monkeypatch.setenv("SR_ENGINE_SITES", "stock=/a,reset=/b")
    assert sites_from_env() == {"stock": "/a", "reset": "/b"}
    monkeypatch.setenv("SR_ENGINE_SITES", "stock")
    with pytest.raises(ValueError, match="copy=path"):
        sites_from_env()
