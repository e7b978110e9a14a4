"""benchmarks.common.settle: waits for the machine to go idle before a timed run, and gives up after its timeout."""

import psutil
import pytest

from benchmarks import common


def test_settle_waits_until_the_cores_are_idle(monkeypatch):
    busy = iter([100.0, 60.0, 12.0, 3.0, 100.0])
    windows = []
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval: windows.append(interval) or next(busy))
    common.settle(window_s=0.01)
    assert windows == [0.01] * 4  # it stopped at the first window under IDLE_BUSY (5%)


def test_settle_gives_up_after_its_timeout(monkeypatch, capsys):
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval: 100.0)
    monkeypatch.setattr(common, "SETTLE_TIMEOUT_S", 0.05)
    waited = common.settle(window_s=0.01)
    assert waited == pytest.approx(0.05, abs=0.05)
    assert "did not go idle" in capsys.readouterr().err
