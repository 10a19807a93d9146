# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The loggers of runner_hooks: the standard library's, with the one method of vLLM's
`init_logger` loggers the package calls, `warning_once` (once per message and
arguments). The vendored copy imports vLLM's `init_logger` in its place."""

import functools
import logging


def init_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.warning_once = functools.cache(logger.warning)  # type: ignore[attr-defined]
    return logger
