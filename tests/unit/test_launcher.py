"""`mili serve`'s launcher: the loading phases show progress when stderr is a log rather than a terminal; the KV
cache sizing the engine gets."""

import os
import time

import pytest

from python_layer.cli import build_parser
from python_layer.server.launcher import _kv_memory_gb, _phase


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


def test_the_kv_cache_size_given_reaches_the_engine_and_none_leaves_its_default() -> None:
    """`mili serve`'s KV sizing flags as the engine gets them: --kv-cache-memory-gb as given, a fraction of the memory
    available now, or None for the engine's default (2 GiB, at most 4096 pages)."""
    parse = lambda *flags: build_parser().parse_args(["serve", *flags])
    assert _kv_memory_gb(parse()) is None
    assert _kv_memory_gb(parse("--kv-cache-memory-gb", "40")) == 40.0
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    assert _kv_memory_gb(parse("--kv-memory-fraction", "0.5")) == pytest.approx(0.5 * available, rel=0.2)
