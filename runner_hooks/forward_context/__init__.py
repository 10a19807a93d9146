# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The Mamba SR seed prefetcher that tells forwards apart by their context."""

from .prefetcher import ForwardContextSeedPrefetcher

__all__ = ["ForwardContextSeedPrefetcher"]
