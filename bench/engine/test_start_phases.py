"""bench/engine/start_phases.py: vLLM's start lines read per engine, and a cut-off log."""

from __future__ import annotations

from pathlib import Path

from . import start_phases

# vLLM 0.26.0's lines, V1's model-loading wording (V2 leaves out "memory").
FULL_LOG = """\
INFO [gpu_model_runner.py:4870] Model loading took 3.57 GiB memory and 1.447626 seconds
INFO [monitor.py:53] torch.compile took 3.99 s in total
INFO [gpu_model_runner.py:6855] Graph capturing finished in 54 secs, took 1.57 GiB
INFO [core.py:340] init engine (profile, create kv cache, warmup model) took 60.09 s \
(compilation: 3.99 s)
"""
CUT_LOG = "INFO [model_runner.py:400] Model loading took 3.57 GiB and 2.7 seconds\n"


def _run(tmp_path: Path) -> Path:
    for tag, name, text in (
        ("timing", "plugin-v1.log", FULL_LOG),
        ("timing-engine1", "plugin-v1.log", CUT_LOG),
        ("timing", "stock-v2.log", FULL_LOG),
        ("timing", "notes.txt", FULL_LOG),  # not an engine log
    ):
        (tmp_path / tag / "logs").mkdir(parents=True, exist_ok=True)
        (tmp_path / tag / "logs" / name).write_text(text)
    return tmp_path


def test_each_phase_is_read_off_its_line() -> None:
    assert start_phases.phases(FULL_LOG) == {
        "model load": 1.447626,
        "torch.compile": 3.99,
        "graph capture": 54.0,
        "init engine": 60.09,
    }


def test_a_log_cut_off_early_leaves_the_later_phases_empty() -> None:
    seconds = start_phases.phases(CUT_LOG)
    assert seconds["model load"] == 2.7
    assert seconds["graph capture"] is None and seconds["init engine"] is None


def test_engines_are_numbered_by_their_folder_and_tabulated_per_runner(tmp_path: Path) -> None:
    found = start_phases.starts(_run(tmp_path))
    assert [(s.runner, s.arm, s.engine) for s in found] == [
        ("v1", "plugin", 0),
        ("v1", "plugin", 1),
        ("v2", "stock", 0),
    ]
    table = start_phases.markdown(found)
    assert "| plugin | 0 | 1.4 | 4.0 | 54.0 | 60.1 |" in table
    assert "| plugin | 1 | 2.7 | - | - | - |" in table
    assert table.index("**v1**") < table.index("| stock | 0 |") and "**v2**" in table


def test_a_folder_without_logs_is_said_in_one_line(tmp_path: Path, capsys) -> None:
    assert start_phases.main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.count("\n") == 1
    assert start_phases.main([str(tmp_path / "missing")]) == 2
