"""pytest wiring of the bench: options, one session per run, the tests' parameters, the summary.

`pytest bench --benchmark-only` collects one test per (batch size, mode,
variant) anywhere; where the SSU kernel (--bench-ssu) cannot run, each is
skipped with the reason, and nothing touches a GPU before a test runs.  At the end of a run
that measured anything, the summary table is printed and written (.json and
.md) under --bench-out.
"""

from __future__ import annotations

import shlex

import pytest

from .options import BenchOptions, add_options
from .step_session import BenchSession
from .summary import markdown, write_summary
from .target import TARGETS, BenchUnavailable

SESSION = pytest.StashKey[BenchSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    options = BenchOptions.from_config(config)
    config.stash[SESSION] = BenchSession(options, locate=TARGETS[options.ssu])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" not in metafunc.fixturenames:
        return
    session = metafunc.config.stash[SESSION]
    metafunc.parametrize(
        "case",
        [
            pytest.param(case, id=case.id, marks=pytest.mark.benchmark(group=case.group))
            for case in session.cases()
        ],
    )


@pytest.fixture(scope="session")
def bench_session(request: pytest.FixtureRequest) -> BenchSession:
    """The run's session; skips every test that needs it where the SSU kernel --bench-ssu
    picks cannot run (no CUDA, no FlashInfer; Triton's below Blackwell)."""
    session = request.config.stash[SESSION]
    try:
        session.target()
    except BenchUnavailable as exc:
        pytest.skip(str(exc))
    return session


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    session = config.stash.get(SESSION, None)
    if session is None or not session.cells():
        return
    rows = session.rows()
    info = session.run_info("pytest " + shlex.join(config.invocation_params.args))
    json_path, md_path = write_summary(rows, info, session.options.out_dir)
    terminalreporter.write_sep("=", "SSU seed step-time summary")
    terminalreporter.write(markdown(rows, info))
    terminalreporter.write_line(f"written: {json_path}")
    terminalreporter.write_line(f"written: {md_path}")
