"""A real uvicorn server on a free loopback port, in a thread of the test process (so tests can also look
at its engine), serving the tiny checkpoint on the Mojo backend."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx
import uvicorn

from python_layer import InferenceEngine
from python_layer.inference.async_engine import AsyncEngine
from python_layer.server.app import build_app
from python_layer.server.header_timeout import HeaderTimeoutProtocol
from python_layer.server.state import ServerConfig, ServerState
from tests.engine_checks import no_request_holds_pages

MODEL_NAME = "tiny-qwen3"


def tiny_loader(checkpoint: Path, max_queue_len: int = 256, **engine_args):
    engine_args.setdefault("num_kv_pages", 256)

    def load(metrics) -> AsyncEngine:
        engine = InferenceEngine.from_pretrained(checkpoint, debug_checks=True, **engine_args)
        return AsyncEngine(engine, max_queue_len=max_queue_len, metrics=metrics)

    return load


class LiveServer:
    def __init__(self, loader, api_key: Optional[str] = None, max_body_bytes: int = 2**20, wait: bool = True) -> None:
        config = ServerConfig(model_name=MODEL_NAME, api_key=api_key, max_body_bytes=max_body_bytes)
        self.app = build_app(config, loader)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning",
                                                    http=HeaderTimeoutProtocol))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, timeout=60, headers=headers)
        if wait:
            self.wait_until_ready()

    @property
    def state(self) -> ServerState:
        return self.app.state.mili

    @property
    def engine(self) -> InferenceEngine:
        return self.state.engine.engine

    def wait_until_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.05)

    def wait_idle(self, timeout: float = 30) -> None:
        """Until no request is in flight; then every KV page must be free or held by the prefix cache alone."""
        deadline = time.monotonic() + timeout
        while self.state.engine.num_unfinished or self.engine.requests:
            assert time.monotonic() < deadline, f"{self.state.engine.num_unfinished} requests still in flight"
            time.sleep(0.02)
        time.sleep(0.05)  # let the engine thread finish the step it may be in
        assert no_request_holds_pages(self.engine)

    def stop(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(60)


def start_mili_serve(checkpoint: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """`mili serve --model checkpoint [options]` in a process of its own on a free port, once its /health answers
    200: (the process, its URL); the caller ends the process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "python_layer.cli", "serve", "--model", str(checkpoint), "--port", str(port),
           "--log-level", "warning", *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("mili serve did not become ready")
        time.sleep(0.2)
