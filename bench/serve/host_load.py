"""The host's CPU load over a block: busy, iowait and steal shares of all CPUs' time,
from /proc/stat's aggregate `cpu` line read at the block's start and its end (two
reads, no thread): what a difference between two blocks may come from besides the GPU.

busy is user, nice, system, irq and softirq time; with idle, iowait and steal it makes
100 %.  Guest time is inside user and nice, as the kernel counts it.
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY = ("user", "nice", "system", "irq", "softirq")


def cpu_times(text: str) -> dict[str, int] | None:
    """The aggregate `cpu` line's counters (USER_HZ ticks); None where there is none."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "cpu" and len(words) > len(FIELDS):
            return dict(zip(FIELDS, (int(w) for w in words[1 : 1 + len(FIELDS)]), strict=True))
    return None


def summarize(before: str, after: str) -> dict[str, float]:
    """busy_pct, iowait_pct and steal_pct between two /proc/stat texts (empty where
    either lacks the `cpu` line or no time passed)."""
    first, last = cpu_times(before), cpu_times(after)
    if first is None or last is None:
        return {}
    delta = {name: last[name] - first[name] for name in FIELDS}
    total = sum(delta.values())
    if total <= 0:
        return {}
    return {
        "busy_pct": round(100.0 * sum(delta[name] for name in BUSY) / total, 2),
        "iowait_pct": round(100.0 * delta["iowait"] / total, 2),
        "steal_pct": round(100.0 * delta["steal"] / total, 2),
    }


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


class Window:
    """`with Window() as w:` reads /proc/stat as the block begins and as it ends;
    w.summary() after it (empty where this machine has no /proc/stat)."""

    def __init__(self, path: Path = PROC_STAT) -> None:
        self.path = path
        self.before: str | None = None
        self.after: str | None = None

    def __enter__(self) -> Window:
        self.before = _read(self.path)
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = _read(self.path)

    def summary(self) -> dict[str, float]:
        if self.before is None or self.after is None:
            return {}
        return summarize(self.before, self.after)
