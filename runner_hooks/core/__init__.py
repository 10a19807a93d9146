# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Per-forward hooks for model runners, and the Mamba SR seed prefetcher."""

from .hooks import ForwardHooks, ForwardInfo
from .reset import SRSeedPrefetcher

__all__ = ["ForwardHooks", "ForwardInfo", "SRSeedPrefetcher"]
