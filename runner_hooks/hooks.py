# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Per-forward hooks: a runner tells them where each forward begins and ends (the
bench's simulated runners, bench/variants.py; vLLM's call the landed
`sr_seed_forward`)."""

import logging
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import ClassVar, Protocol

from torch.utils.hooks import RemovableHandle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardInfo:
    """The forward about to run: `runs_ssu` (its batch has decode tokens, so
    each Mamba-2 layer calls the SSU once), `micro_batched` (split for DBO),
    `full_cudagraph` (a FULL CUDA graph capture or replay)."""

    runs_ssu: bool
    micro_batched: bool = False
    full_cudagraph: bool = False


class ForwardHook(Protocol):
    def on_forward_begin(self, info: ForwardInfo) -> None: ...
    def on_forward_end(self, info: ForwardInfo) -> None: ...


class NestedForwardError(RuntimeError):
    """A forward was opened while another one was still open."""


class ForwardHooks:
    """The hooks of one model runner; forwards do not nest."""

    UNHOOKED: ClassVar[AbstractContextManager[None]] = nullcontext()

    def __init__(self) -> None:
        # An OrderedDict: RemovableHandle holds a weakref to it.
        self._hooks: OrderedDict[int, ForwardHook] = OrderedDict()
        self._current: ForwardInfo | None = None

    @property
    def active(self) -> bool:
        """Whether a hook is registered: a runner builds a ForwardInfo only then (as the
        runner's call site before `sr_seed_forward` did: bench/flag_off.py)."""
        return bool(self._hooks)

    def register(self, hook: ForwardHook) -> RemovableHandle:
        """Adds `hook`; the handle's `remove()` takes it out again (a hook
        removed mid-forward still ends that forward)."""
        handle = RemovableHandle(self._hooks)
        self._hooks[handle.id] = hook
        return handle

    @property
    def current(self) -> ForwardInfo | None:
        """The open forward's info, or None between forwards."""
        return self._current

    def forward(self, info: ForwardInfo | None) -> AbstractContextManager[None]:
        """Runs the body as one forward; with `info` None, with no hook at all."""
        return self.UNHOOKED if info is None else self._forward(info)

    @contextmanager
    def _forward(self, info: ForwardInfo) -> Iterator[None]:
        """Begins the hooks in order, ends those begun in reverse, also on errors:
        the body's exception propagates (hooks' end errors are then logged),
        else the first hook error."""
        if self._current is not None:
            raise NestedForwardError(
                f"forward({info}) opened while forward({self._current}) is still "
                "open; a model runner runs one forward at a time"
            )
        self._current = info
        begun: list[ForwardHook] = []
        try:
            for hook in tuple(self._hooks.values()):
                hook.on_forward_begin(info)
                begun.append(hook)
            yield
        except BaseException as failure:
            for hook, error in self._end(info, begun):
                logger.warning(
                    "%s.on_forward_end raised %r while the forward failed with %s",
                    type(hook).__name__,
                    error,
                    type(failure).__name__,
                )
            raise
        errors = self._end(info, begun)
        if errors:
            raise errors[0][1]

    def _end(
        self, info: ForwardInfo, begun: list[ForwardHook]
    ) -> list[tuple[ForwardHook, Exception]]:
        """Ends the begun hooks in reverse order; returns what they raised."""
        self._current = None
        errors = []
        for hook in reversed(begun):
            try:
                hook.on_forward_end(info)
            except Exception as error:
                errors.append((hook, error))
        return errors
