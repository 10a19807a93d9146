"""Tests marked `gpu` need a CUDA device; where there is none they are skipped with the reason."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu); none is available here")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not a folder named gpu
            item.add_marker(skip)
