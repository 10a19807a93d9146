"""The runner-facing contract: ForwardInfo and the ForwardHooks lifecycle (no CUDA)."""

from __future__ import annotations

import dataclasses

import pytest

from runner_hooks.hooks import ForwardHooks, ForwardInfo, NestedForwardError


class Recorder:
    """A hook that logs its calls into a shared list."""

    def __init__(self, name: str, log: list[tuple[str, str, ForwardInfo]]) -> None:
        self.name, self.log = name, log

    def on_forward_begin(self, info: ForwardInfo) -> None:
        self.log.append(("begin", self.name, info))

    def on_forward_end(self, info: ForwardInfo) -> None:
        self.log.append(("end", self.name, info))


class FailingBegin(Recorder):
    def on_forward_begin(self, info: ForwardInfo) -> None:
        super().on_forward_begin(info)
        raise ValueError("begin failed")


class FailingEnd(Recorder):
    def on_forward_end(self, info: ForwardInfo) -> None:
        super().on_forward_end(info)
        raise RuntimeError(f"{self.name} could not end")


def test_forward_info_is_frozen_with_defaults() -> None:
    info = ForwardInfo(runs_ssu=True)
    assert (info.runs_ssu, info.micro_batched, info.full_cudagraph) == (True, False, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.runs_ssu = False  # type: ignore[misc]


def test_begin_in_order_end_in_reverse_order() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    hooks.register(Recorder("a", log))
    hooks.register(Recorder("b", log))
    info = ForwardInfo(runs_ssu=True, full_cudagraph=True)
    with hooks.forward(info):
        assert hooks.current is info
        assert log == [("begin", "a", info), ("begin", "b", info)]
    assert log[2:] == [("end", "b", info), ("end", "a", info)]
    assert hooks.current is None


def test_a_handle_removes_its_hook() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    assert not hooks.active
    first = hooks.register(Recorder("a", log))
    hooks.register(Recorder("b", log))
    assert hooks.active
    first.remove()
    first.remove()  # a second remove does nothing
    info = ForwardInfo(runs_ssu=True)
    with hooks.forward(info):
        pass
    assert [entry[:2] for entry in log] == [("begin", "b"), ("end", "b")]
    assert hooks.active


def test_no_hook_left_means_inactive() -> None:
    hooks = ForwardHooks()
    handle = hooks.register(Recorder("a", []))
    handle.remove()
    assert not hooks.active
    # What a runner opens then: forward(None), the shared context that does nothing.
    assert hooks.forward(None) is ForwardHooks.UNHOOKED
    with hooks.forward(None), hooks.forward(None):
        assert hooks.current is None


def test_a_hook_removed_mid_forward_still_ends_it() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    handle = hooks.register(Recorder("a", log))
    with hooks.forward(ForwardInfo(runs_ssu=False)):
        handle.remove()
    assert [entry[:2] for entry in log] == [("begin", "a"), ("end", "a")]
    assert not hooks.active
    with hooks.forward(ForwardInfo(runs_ssu=False)):
        pass
    assert len(log) == 2


def test_end_runs_when_the_body_raises_and_the_error_propagates() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    hooks.register(Recorder("a", log))
    info = ForwardInfo(runs_ssu=False)
    with pytest.raises(KeyError), hooks.forward(info):
        raise KeyError("model failed")
    assert [entry[0] for entry in log] == ["begin", "end"]
    assert hooks.current is None


def test_a_failing_begin_ends_only_the_hooks_that_began() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    hooks.register(Recorder("a", log))
    hooks.register(FailingBegin("b", log))
    hooks.register(Recorder("c", log))
    info = ForwardInfo(runs_ssu=True)
    with pytest.raises(ValueError, match="begin failed"), hooks.forward(info):
        pytest.fail("the body must not run when a hook's begin fails")
    assert [(kind, name) for kind, name, _ in log] == [("begin", "a"), ("begin", "b"), ("end", "a")]
    assert hooks.current is None  # the failed forward is closed


def test_the_bodys_error_propagates_as_itself_over_a_failing_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An OOM in a captured forward must not surface as the prefetcher's complaint
    about the seeds the failed forward left unconsumed."""
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    hooks.register(Recorder("a", log))
    hooks.register(FailingEnd("b", log))
    info = ForwardInfo(runs_ssu=True)
    with pytest.raises(MemoryError) as raised, hooks.forward(info):
        raise MemoryError("out of memory")
    assert raised.value.__context__ is None and raised.value.__cause__ is None
    assert [(kind, name) for kind, name, _ in log][-2:] == [("end", "b"), ("end", "a")]
    assert "FailingEnd.on_forward_end raised RuntimeError('b could not end')" in caplog.text
    assert "failed with MemoryError" in caplog.text
    assert hooks.current is None


def test_a_failing_end_after_a_good_body_is_raised_after_every_end() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    hooks.register(FailingEnd("a", log))
    hooks.register(FailingEnd("b", log))
    with (
        pytest.raises(RuntimeError, match="b could not end"),
        hooks.forward(ForwardInfo(runs_ssu=True)),
    ):
        pass
    assert [(kind, name) for kind, name, _ in log][-2:] == [("end", "b"), ("end", "a")]
    assert hooks.current is None


def test_nested_forward_is_an_error_and_the_outer_forward_survives() -> None:
    log: list[tuple[str, str, ForwardInfo]] = []
    hooks = ForwardHooks()
    hooks.register(Recorder("a", log))
    outer = ForwardInfo(runs_ssu=True)
    with hooks.forward(outer):
        with pytest.raises(NestedForwardError, match="still open"), hooks.forward(outer):
            pass
        assert hooks.current is outer
    assert [kind for kind, _, _ in log] == ["begin", "end"]


def test_forwards_without_hooks_run() -> None:
    hooks = ForwardHooks()
    with hooks.forward(ForwardInfo(runs_ssu=True)):
        assert hooks.current == ForwardInfo(runs_ssu=True)


def test_the_readme_example_names_what_exists() -> None:
    """runner_hooks/README.md's example (run on a GPU by tests/gpu/test_readme_snippet.py):
    its imports resolve and its calls bind, without CUDA."""
    import inspect

    from runner_hooks import SeedPrefetch, SRSeedPrefetcher

    from .gpu.test_readme_snippet import snippet

    text = snippet()
    imports = "\n".join(line for line in text.splitlines() if line.startswith(("import", "from")))
    exec(imports, {})
    inspect.signature(SeedPrefetch).bind("my runner", 40, "device", "draw")
    inspect.signature(SRSeedPrefetcher.forward).bind("self", full_cudagraph=False)
    assert "prefetcher.next_seed()" in text and "SeedPrefetch(" in text
