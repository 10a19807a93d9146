"""The servers' vLLM worker (--worker-cls): the engine harness's RankWorker (the arm's
seed path set up first: the one-seed control's perturbation), and, with
SR_SERVE_WORKER_WEIGHTS=random, the bench's weights (bench.engine.model.init_weights,
in place, after vLLM's dummy load, before profiling and graph capture).

Imported by vLLM in the engine-core process that runs the model, where the SSU calls run.
"""

from __future__ import annotations

import os
from typing import Any

from bench.engine import model
from bench.engine.rank_worker import RankWorker

from .envs import WEIGHTS_WORKER_ENV


class ServeWorker(RankWorker):
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if os.environ.get(WEIGHTS_WORKER_ENV) == "random":
            count = model.init_weights(self.get_model(), model.WEIGHT_SEED + self.rank)
            print(f"sr-serve: redrew {count} parameters of the target model", flush=True)
