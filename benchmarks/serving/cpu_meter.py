"""CPU seconds of process trees over time: how much of the 2 cores the load generator and the server took
during each benchmark window (sampled with psutil in a thread, interpolated at the window's edges)."""

from __future__ import annotations

import bisect
import threading
import time
from typing import Dict, List, Tuple

import psutil


def tree_cpu_seconds(pid: int) -> float:
    """user + system seconds of a live process and its live descendants (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in processes:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


class CpuMeter:
    """Samples the CPU seconds of named process trees every `interval` seconds (wall clock, time.time())."""

    def __init__(self, pids: Dict[str, int], interval: float = 0.25) -> None:
        self.pids = pids
        self.interval = interval
        self.samples: Dict[str, List[Tuple[float, float]]] = {name: [] for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "CpuMeter":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            cpu = tree_cpu_seconds(pid)
            if cpu or not self.samples[name]:
                self.samples[name].append((time.time(), cpu))

    def share(self, name: str, start: float, end: float) -> float:
        """Mean number of cores the tree used between two wall-clock times (1.0: one core, all the time)."""
        return (self._at(name, end) - self._at(name, start)) / max(end - start, 1e-9)

    def _at(self, name: str, t: float) -> float:
        samples = self.samples[name]
        times = [s[0] for s in samples]
        i = bisect.bisect_left(times, t)
        if i == 0:
            return samples[0][1]
        if i == len(samples):
            return samples[-1][1]
        (t0, c0), (t1, c1) = samples[i - 1], samples[i]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
