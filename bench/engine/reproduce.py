"""Does stock vLLM 0.26.0 compute the same bits in two processes? A diagnostic.

    python -m bench.engine.reproduce      (on the GPU machine, after staging;
                                           tests/gpu/vllm/engine.sh reproduce)

The identity check can judge an arm only where two stock processes agree.
Each variant here runs stock's V1 PIECEWISE engine in two processes through
the identity workload, under one change of setting, and says whether the two
agree (what it found: bench/results/engine-reproduce-nvidia-h200x2-20261130.md,
bench/results/engine-harness-history.md).  The variants:

- reductions-tuned: without Inductor's deterministic mode, so that Inductor
  tunes reductions by timing in each process (the control: it must differ,
  or the experiment shows nothing);
- as-run: the engines' settings, Inductor's deterministic mode in the compile
  config (arms.compilation_config);
- torch-deterministic: torch's deterministic algorithms as well, with every
  new allocation filled (NaN in floats), as the identity run has them
  (arms.IDENTITY_ENV);
- torch-deterministic-nofill: the algorithms without the fill.

Writes $OUT/engine/reproduce.json and $OUT/engine/reproduce-code.tar.xz (the
Python that Inductor generated in each process, to diff).
"""

from __future__ import annotations

import json
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import compact, report
from .arms import DETERMINISTIC_ENV, IDENTITY_ENV, STOCK, GraphMode, Runner, compilation_config
from .client import Worker
from .session import SKIP_REASON, Settings, write_json
from .worker import LLM_KWARGS_ENV, TORCH_DETERMINISTIC_ENV

MODE = GraphMode.PIECEWISE
RUNNER = Runner.V1
ROOT = Path("/tmp/sr-reproduce")


@dataclass(frozen=True)
class Variant:
    name: str
    env: dict[str, str] = field(default_factory=dict)


_TORCH_DETERMINISTIC = {k: v for k, v in IDENTITY_ENV.items() if k not in DETERMINISTIC_ENV}

VARIANTS = (
    Variant(
        "reductions-tuned",
        {
            LLM_KWARGS_ENV: json.dumps(
                {"compilation_config": compilation_config(MODE, inductor_deterministic=False)}
            )
        },
    ),
    Variant("as-run"),
    Variant("torch-deterministic", _TORCH_DETERMINISTIC),
    Variant(
        "torch-deterministic-nofill", {**_TORCH_DETERMINISTIC, TORCH_DETERMINISTIC_ENV: "nofill"}
    ),
)


def _record(variant: Variant, process: int, settings: Settings, gpu: str) -> dict[str, Any]:
    worker = Worker.spawn(
        STOCK,
        RUNNER,
        sites=settings.sites,
        model_dir=settings.write_model(),
        gpu=gpu,
        log_dir=settings.out / "reproduce" / variant.name / str(process),
        cache_root=ROOT / variant.name / str(process),
        extra_env={**DETERMINISTIC_ENV, **variant.env},
    )
    try:
        started = worker.call("start", mode=MODE.value)
        return {**worker.call("identity"), "start_s": started["start_s"]}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    finally:
        worker.close()


def run_variant(variant: Variant, settings: Settings, gpu: str) -> dict[str, Any]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        records = list(pool.map(lambda p: _record(variant, p, settings, gpu), (0, 1)))
    compacted = [compact.compact_record(r) for r in records]
    return {"verdict": report.compare(*compacted), "gpu": gpu, "records": compacted}


def pack_code(out: Path) -> Path:
    """The Python files under each process's compile cache, in one archive."""
    archive = out / "reproduce-code.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for path in sorted(ROOT.rglob("*.py")):
            tar.add(path, arcname=str(path.relative_to(ROOT)))
    return archive


def main() -> int:
    settings = Settings.from_env()
    if settings is None:
        print(SKIP_REASON, file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    lock = threading.Lock()

    def one(index: int, variant: Variant) -> None:
        result = run_variant(variant, settings, settings.gpus[index % len(settings.gpus)])
        with lock:  # saved as each comes: a call's time limit may cut the rest
            results[variant.name] = result
            write_json(settings.out / "reproduce.json", {"mode": MODE.value, "variants": results})

    with ThreadPoolExecutor(max_workers=len(VARIANTS)) as pool:
        list(pool.map(one, range(len(VARIANTS)), VARIANTS))
    pack_code(settings.out)
    for name, result in results.items():
        print(f"{name:22} {result['verdict']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
