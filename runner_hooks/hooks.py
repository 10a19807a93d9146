"""The runner-facing contract: what a model runner tells its hooks about each forward.

This module knows nothing about CUDA.  A model runner owns one `ForwardHooks`
and wraps every forward of its target model in `hooks.forward(info)`, with
`info` None while no hook is registered (`hooks.active`), which costs next
to nothing; hooks
such as the seed prefetchers learn from it where one forward ends and the next
begins, instead of guessing it from side channels.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import ClassVar, Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForwardInfo:
    """What a hook needs to know about the forward that is about to run.

    runs_ssu: the forward calls the Mamba SSU once per Mamba-2 layer, i.e.
        its batch has decode tokens.  False for prefill-only batches and for
        the profile run, which call it zero times.
    micro_batched: the forward is split into micro-batches (dual-batch
        overlap); each micro-batch calls the SSU on its own thread and stream.
    full_cudagraph: the forward runs as a FULL CUDA graph, being captured or
        replayed; a replay runs no Python, so nothing may be scheduled for it
        outside the graph.
    """

    runs_ssu: bool
    micro_batched: bool = False
    full_cudagraph: bool = False


class ForwardHook(Protocol):
    """Anything that wants to hear where forwards begin and end."""

    def on_forward_begin(self, info: ForwardInfo) -> None: ...

    def on_forward_end(self, info: ForwardInfo) -> None: ...


class NestedForwardError(RuntimeError):
    """A forward was opened while another one was still open."""


class ForwardHooks:
    """The hooks of one model runner, called around each forward.

    Forwards do not nest: a runner runs one forward of its target model at a
    time, and a hook that keeps per-forward state (a seed batch) would lose
    track of the outer forward if they did, so nesting is refused loudly.
    """

    UNHOOKED: ClassVar[AbstractContextManager[None]]
    """What `forward(None)` returns: a shared context that does nothing."""

    def __init__(self) -> None:
        self._hooks: list[ForwardHook] = []
        self._current: ForwardInfo | None = None
        self.active = False
        """Whether any hook is registered: a runner opens `forward(info)` only then.
        Kept by register and remove rather than computed, for the runner's read
        on every forward."""

    def register(self, hook: ForwardHook) -> ForwardHookHandle:
        """Adds `hook`, called for every later forward; returns a handle whose
        `remove()` takes it out again (as torch's `register_forward_hook`)."""
        if not callable(getattr(hook, "on_forward_begin", None)) or not callable(
            getattr(hook, "on_forward_end", None)
        ):
            raise TypeError(
                f"{type(hook).__name__} is not a forward hook: it needs "
                "on_forward_begin(info) and on_forward_end(info)"
            )
        self._hooks.append(hook)
        self.active = True
        return ForwardHookHandle(self, hook)

    def _remove(self, hook: ForwardHook) -> None:
        if self._current is not None:
            raise RuntimeError(
                f"a hook cannot be removed while forward({self._current}) is open"
            )
        self._hooks = [h for h in self._hooks if h is not hook]
        self.active = bool(self._hooks)

    @property
    def current(self) -> ForwardInfo | None:
        """The open forward's info, or None between forwards."""
        return self._current

    def forward(self, info: ForwardInfo | None) -> AbstractContextManager[None]:
        """Runs the body as one forward; with `info` None, as no forward at all.

        A runner passes None while no hook is registered (`active` false), so
        that it builds no ForwardInfo: `UNHOOKED` is returned, and the body
        runs with no hook code around it.
        """
        if info is None:
            return self.UNHOOKED
        return self._forward(info)

    @contextmanager
    def _forward(self, info: ForwardInfo) -> Iterator[None]:
        """The forward of `forward(info)`.

        Every hook's `on_forward_begin(info)` runs on entry, in registration
        order; `on_forward_end(info)` runs on exit, in reverse order, for
        exactly the hooks whose begin returned, also when the body (or a later
        hook's begin) raises.

        An exception of the body propagates as itself: the hooks still end
        (a prefetcher joins its side stream, so a capture can end), and what
        they raise then is logged, not raised over it; the body's failure is
        the cause to report, an unconsumed seed batch at most its consequence.
        When the body succeeds, every hook ends and the first hook error is
        raised.
        """
        if self._current is not None:
            raise NestedForwardError(
                f"forward({info}) opened while forward({self._current}) is still open; "
                "a model runner runs one forward at a time"
            )
        self._current = info
        begun: list[ForwardHook] = []
        try:
            for hook in self._hooks:
                hook.on_forward_begin(info)
                begun.append(hook)
            yield
        except BaseException as failure:
            self._end(info, begun, failure)
            raise
        self._end(info, begun, None)

    def _end(
        self, info: ForwardInfo, begun: list[ForwardHook], failure: BaseException | None
    ) -> None:
        self._current = None
        first: Exception | None = None
        for hook in reversed(begun):
            try:
                hook.on_forward_end(info)
            except Exception as error:
                if failure is not None:
                    logger.warning(
                        "%s.on_forward_end raised %s: %s (while the forward itself "
                        "failed with %s, which propagates)",
                        type(hook).__name__,
                        type(error).__name__,
                        error,
                        type(failure).__name__,
                    )
                elif first is None:
                    first = error
        if first is not None:
            raise first


class _Unhooked:
    """A context that does nothing, with no state: one instance serves every runner."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


ForwardHooks.UNHOOKED = _Unhooked()


class ForwardHookHandle:
    """Returned by `ForwardHooks.register`: `remove()` unregisters the hook."""

    __slots__ = ("_hooks", "hook")

    def __init__(self, hooks: ForwardHooks, hook: ForwardHook) -> None:
        self._hooks: ForwardHooks | None = hooks
        self.hook = hook

    def remove(self) -> None:
        """Unregisters the hook (refused mid-forward); again, does nothing."""
        if self._hooks is not None:
            self._hooks._remove(self.hook)
            self._hooks = None
