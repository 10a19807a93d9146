# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Per-forward hooks for model runners, and the Mamba SR seed prefetcher."""

from .hooks import (
    ForwardHook,
    ForwardHookHandle,
    ForwardHooks,
    ForwardInfo,
    NestedForwardError,
)
from .prefetch import IncompleteSeedBatchError, WrongStreamError
from .reset import SRSeedPrefetcher

__all__ = [
    "ForwardHook",
    "ForwardHookHandle",
    "ForwardHooks",
    "ForwardInfo",
    "IncompleteSeedBatchError",
    "NestedForwardError",
    "SRSeedPrefetcher",
    "WrongStreamError",
]
