"""`mili serve`'s launcher: the loading phases' progress, each a line of its own; uvicorn's early "running on" line
left out; --help with the defaults; the KV cache sizing the engine gets."""

import logging
import os
import re
import time

import pytest

from python_layer.cli import build_parser
from python_layer.server.launcher import _kv_memory_gb, _NotReadyYet, _phase, api_key_of


@pytest.mark.parametrize("terminal", [False, True])
def test_a_long_phase_prints_progress_lines_each_a_line_of_its_own(capsys: pytest.CaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  terminal: bool) -> None:
    """On a terminal too: another log line in the middle of a phase must not run into its line."""
    monkeypatch.setattr("sys.stderr.isatty", lambda: terminal, raising=False)
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


def test_uvicorns_running_on_line_is_left_out_and_the_rest_kept() -> None:
    make = lambda message: logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, message, (), None)
    assert not _NotReadyYet().filter(make("Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)"))
    assert _NotReadyYet().filter(make("Started server process [1]"))


def test_serve_help_gives_the_defaults(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    options = " ".join(capsys.readouterr().out.split("options:")[1].split())
    for flag, default in [("--host", "127.0.0.1"), ("--port", "8000"), ("--max-num-seqs", "64"),
                          ("--page-size", "16"), ("--shutdown-timeout", "10.0"), ("--log-level", "info")]:
        assert re.search(rf"{flag} \S+ (?:(?! --).)*\(default: {re.escape(default)}\)", options), flag


def test_the_api_key_comes_from_the_flag_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    parse = lambda *flags: build_parser().parse_args(["serve", *flags])
    monkeypatch.delenv("MILI_API_KEY", raising=False)
    assert api_key_of(parse()) is None
    monkeypatch.setenv("MILI_API_KEY", "from-env")
    assert api_key_of(parse()) == "from-env"
    assert api_key_of(parse("--api-key", "from-flag")) == "from-flag"
    monkeypatch.setenv("MILI_API_KEY", "")
    assert api_key_of(parse()) is None
