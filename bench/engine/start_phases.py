"""Where each engine's start went, read off vLLM's own log lines: model loading,
torch.compile, CUDA graph capture, and vLLM's whole "init engine", per runner, arm and
engine.

    python -m bench.engine.start_phases RUN [RUN ...]

RUN is a timing run's output folder (OUT/engine, from engine-run.tar.xz): its engine
logs are TAG/logs/ARM-RUNNER.log, TAG being `timing` for the first engines and
`timing-engine<N>` for those a restart started (timing.run).  A phase whose line is
missing from a log (an engine cut off before it) reads "-".
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

PHASES: dict[str, re.Pattern[str]] = {
    "model load": re.compile(r"Model loading took .* and ([\d.]+) seconds"),
    "torch.compile": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "graph capture": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init engine": re.compile(r"init engine \(.*\) took ([\d.]+) s"),
}
"""Each phase's seconds, as vLLM 0.20.0-0.26.0 log them (the first match in a log)."""

_LOG = re.compile(r"(?P<arm>.+)-(?P<runner>v[12])\.log")
_TAG = re.compile(r"timing(?:-engine(?P<engine>\d+))?")


@dataclass(frozen=True)
class Start:
    runner: str
    arm: str
    engine: int
    seconds: dict[str, float | None]


def phases(text: str) -> dict[str, float | None]:
    """Each phase's seconds in one engine's log; None where its line is missing."""
    found = {name: pattern.search(text) for name, pattern in PHASES.items()}
    return {name: float(match.group(1)) if match else None for name, match in found.items()}


def starts(run: Path) -> list[Start]:
    """Every engine log of a timing run's output folder, in runner, arm, engine order."""
    out = []
    for log in run.glob("timing*/logs/*.log"):
        tag, name = _TAG.fullmatch(log.parent.parent.name), _LOG.fullmatch(log.name)
        if tag is None or name is None:
            continue
        engine = int(tag.group("engine") or 0)
        seconds = phases(log.read_text(errors="replace"))
        out.append(Start(name.group("runner"), name.group("arm"), engine, seconds))
    return sorted(out, key=lambda s: (s.runner, s.arm, s.engine))


def markdown(found: list[Start]) -> str:
    """One table per runner: a row per arm and engine, a column per phase (s)."""
    out = []
    for runner in sorted({s.runner for s in found}):
        out.append(f"\n**{runner}** (s)\n")
        out.append("| arm | engine | " + " | ".join(PHASES) + " |")
        out.append("| --- | --- |" + " --- |" * len(PHASES))
        for s in (s for s in found if s.runner == runner):
            cells = ["-" if v is None else f"{v:.1f}" for v in s.seconds.values()]
            out.append(f"| {s.arm} | {s.engine} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n" if out else ""


def main(argv: list[str] | None = None) -> int:
    runs = [Path(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    if not runs or any(not run.is_dir() for run in runs):
        print(
            "usage: python -m bench.engine.start_phases RUN [RUN ...]: each RUN a timing "
            "run's output folder (OUT/engine) holding timing*/logs/*.log",
            file=sys.stderr,
        )
        return 2
    found = [start for run in runs for start in starts(run)]
    if not found:
        print(f"no engine logs (timing*/logs/ARM-RUNNER.log) under {', '.join(map(str, runs))}")
        return 1
    print(markdown(found), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
