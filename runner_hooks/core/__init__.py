# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Mamba SR seed prefetcher: a forward's seeds drawn up front."""

from .prefetch import SeedPrefetch
from .randint_seeds import fill_randint_seeds
from .reset import SRSeedPrefetcher

__all__ = ["SRSeedPrefetcher", "SeedPrefetch", "fill_randint_seeds"]
