"""The loading phases of `mili serve` show progress when stderr is a log rather than a terminal."""

import time

import pytest

from python_layer.server.launcher import _phase


def test_a_long_phase_prints_progress_lines_when_not_on_a_terminal(capsys: pytest.CaptureFixture) -> None:
    err = ""
    with _phase("building the model graph", interval=0.1):  # a body that lasts until two progress lines came
        deadline = time.monotonic() + 30
        while err.count("[mili] building the model graph ... ") < 2:
            assert time.monotonic() < deadline, err
            time.sleep(0.02)
            err += capsys.readouterr().err
    err += capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == "[mili] building the model graph ..."
    assert all(line.endswith(" s") for line in lines[1:-1]) and len(lines[1:-1]) >= 2, lines
    assert lines[-1].startswith("[mili] building the model graph: done in ")
