"""The GPUs' SM clock, power, temperature and utilization, sampled by `nvidia-smi` (read
only) while a block runs: what a difference between two blocks may come from."""

from __future__ import annotations

import shutil
import statistics
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

FIELDS = ("index", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu")
INTERVAL_MS = 250


def command(interval_ms: int = INTERVAL_MS) -> list[str]:
    return [
        "nvidia-smi",
        f"--query-gpu={','.join(FIELDS)}",
        "--format=csv,noheader,nounits",
        f"-lms={interval_ms}",
    ]


def summarize(text: str) -> dict[str, dict[str, dict[str, float]]]:
    """Per GPU index and field: min, median and max of the samples (lines it cannot read
    are skipped)."""
    samples: dict[str, dict[str, list[float]]] = {}
    for line in text.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(FIELDS):
            continue
        try:
            numbers = [float(v) for v in values[1:]]
        except ValueError:
            continue
        per_gpu = samples.setdefault(values[0], {})
        for name, number in zip(FIELDS[1:], numbers, strict=True):
            per_gpu.setdefault(name, []).append(number)
    return {
        gpu: {
            name: {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}
            for name, v in fields.items()
        }
        for gpu, fields in samples.items()
    }


class Sampler:
    """`with Sampler(path) as s:` samples into path while the block runs; s.summary()
    after it (empty where this machine has no nvidia-smi)."""

    def __init__(self, path: Path, argv: list[str] | None = None) -> None:
        self.path, self.argv = path, argv or command()
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Sampler:
        if shutil.which(self.argv[0]) is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("wb") as out:
                self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.DEVNULL)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def summary(self) -> dict[str, Any]:
        if self.process is None or not self.path.is_file():
            return {}
        return summarize(self.path.read_text(errors="replace"))
