"""`mili serve --replicas 2`: two workers of the tiny model behind SGLang's router on 127.0.0.1. Requests through
the router reach both workers, requests that share a long prefix go to the same one, and with a worker killed the
requests sent afterwards are all served (the router retries them on the other)."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port_run(n: int) -> int:
    """A port p with p .. p + n - 1 all free on 127.0.0.1."""
    for _ in range(100):
        port = random.randrange(20000, 60000 - n)
        try:
            for p in range(port, port + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


class Replicas:
    def __init__(self, checkpoint: Path) -> None:
        self.port = free_port_run(3)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "python_layer.cli", "serve", "--replicas", "2", "--model", str(checkpoint),
             "--port", str(self.port), "--kv-pages", "64", "--max-model-len", "512", "--served-model-name", "tiny",
             "--log-level", "warning"], cwd=ROOT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = [f"http://127.0.0.1:{self.port + 1 + i}" for i in range(2)]
        deadline = time.monotonic() + 600
        while not self._ready():
            assert self.process.poll() is None, "mili serve --replicas exited"
            assert time.monotonic() < deadline, "the router did not come up"
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def served(self, workers: int = 2) -> list[int]:
        """Requests each of the first `workers` workers has finished (its /metrics)."""
        counts = []
        for worker in self.workers[:workers]:
            text = httpx.get(worker + "/metrics", timeout=5).text
            counts.append(
                int(
                    sum(
                        float(v)
                        for v in re.findall(r"^mili_e2e_request_latency_seconds_count\{[^}]*\} (\S+)", text, re.M)
                    )
                )
            )
        return counts

    def worker_pid(self, i: int) -> int:
        out = subprocess.run(
            ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(self.process.pid)], capture_output=True, text=True
        ).stdout
        return next(int(line.split()[0]) for line in out.splitlines() if f"--port {self.port + 1 + i}" in line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def replicas(tiny_checkpoint: Path) -> Iterator[Replicas]:
    live = Replicas(tiny_checkpoint)
    yield live
    live.stop()


def complete(url: str, prompt: str) -> httpx.Response:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def test_both_workers_serve_and_a_shared_prefix_stays_on_one(replicas: Replicas) -> None:
    before = replicas.served()
    with ThreadPoolExecutor(8) as pool:
        prompts = [f"{chr(65 + i) * 40} request {i}" for i in range(12)]
        assert all(r.status_code == 200 for r in pool.map(lambda p: complete(replicas.url, p), prompts))
    spread = [a - b for a, b in zip(replicas.served(), before)]
    assert sum(spread) == 12 and min(spread) > 0, spread

    prefix = "The same long system prompt, shared by every request of this conversation. " * 8
    before = replicas.served()
    for i in range(6):
        assert complete(replicas.url, f"{prefix} question {i}").status_code == 200
    shared = [a - b for a, b in zip(replicas.served(), before)]
    assert sorted(shared) == [0, 6], shared


def test_a_killed_worker_loses_no_request_sent_after(replicas: Replicas) -> None:
    before = replicas.served(1)[0]
    os.kill(replicas.worker_pid(1), signal.SIGKILL)
    with ThreadPoolExecutor(8) as pool:
        prompts = [f"{chr(97 + i) * 30} after the kill {i}" for i in range(16)]
        responses = list(pool.map(lambda p: complete(replicas.url, p), prompts))
    assert [r.status_code for r in responses] == [200] * 16, [r.text for r in responses if r.status_code != 200]
    assert replicas.served(1)[0] - before == 16  # the survivor served them all
