"""The engines' vLLM worker (arms.WORKER_CLS): vLLM's GPU worker, set up for
the arm first (worker.prepare_rank), in every TP rank's process.

Imported by vLLM in the process that runs a rank (at TP 1, the engine's own),
so the seed path an arm changes is changed where that rank's SSU calls run.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu_worker import Worker

from .worker import prepare_rank


class RankWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        prepare_rank()
        super().__init__(*args, **kwargs)
