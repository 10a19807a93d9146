# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""The loggers of runner_hooks: vLLM's `init_logger` where vLLM is installed (the
vendored copy imports it directly), else the standard library's logger with the one
vLLM method the package calls, `warning_once`."""

import functools
import logging


def init_logger(name: str) -> logging.Logger:
    try:
        from vllm.logger import init_logger as vllm_init_logger
    except ImportError:
        logger = logging.getLogger(name)
        logger.warning_once = functools.cache(logger.warning)  # type: ignore[attr-defined]
        return logger
    return vllm_init_logger(name)
