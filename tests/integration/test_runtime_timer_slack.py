"""library.runtime_timer_slack: MAX's CPU runtime threads that a model's load starts wake up at most every 20 ms
from their timed waits, and the thread that loaded the model keeps its own timer slack."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bindings import library

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="timer slack is a Linux thread attribute")


def _own_slack() -> int:
    return int(Path(f"/proc/{threading.get_native_id()}/timerslack_ns").read_text())


def test_threads_started_inside_get_the_slack_and_the_caller_keeps_its_own() -> None:
    before, seen = _own_slack(), []
    with library.runtime_timer_slack():
        assert _own_slack() == library.RUNTIME_TIMER_SLACK_NS
        started = threading.Thread(target=lambda: seen.append(_own_slack()))
        started.start()
        started.join()
    assert seen == [library.RUNTIME_TIMER_SLACK_NS]
    assert _own_slack() == before != library.RUNTIME_TIMER_SLACK_NS


def test_a_cpu_model_load_gives_the_runtime_threads_it_starts_the_slack(tiny_checkpoint: Path) -> None:
    """In a process of its own, whose first graph execute is the model's warm-up step: MAX starts its polling
    thread then. If this fails after a MAX upgrade, see where that thread is started now."""
    probe = (
        "import json, os\n"
        "from python_layer import InferenceEngine\n"
        f"InferenceEngine.from_pretrained({str(tiny_checkpoint)!r}, device='cpu')\n"
        "print(json.dumps([int(open(f'/proc/{tid}/timerslack_ns').read()) for tid in os.listdir('/proc/self/task')]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    slacks = json.loads(done.stdout.strip().splitlines()[-1])
    assert library.RUNTIME_TIMER_SLACK_NS in slacks, slacks
    assert min(slacks) < library.RUNTIME_TIMER_SLACK_NS, slacks  # the loading thread's own came back
