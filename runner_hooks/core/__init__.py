# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Mamba SR seed prefetcher: a forward's seeds drawn up front."""

from .prefetch import SeedPrefetch
from .reset import SRSeedPrefetcher

__all__ = ["SRSeedPrefetcher", "SeedPrefetch"]
