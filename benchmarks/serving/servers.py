"""The servers `mili bench serving` starts: MILI's `mili serve`, llama.cpp's `llama-server` and vLLM's CPU build's
OpenAI server, each a process of its own on a free loopback port, stopped (SIGTERM, then SIGKILL) when the sweep is
done."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import httpx

from benchmarks.peers.run import PEERS, VLLM_ENV, vllm_python


@dataclass
class Server:
    name: str  # the table's row label, e.g. "MILI bfloat16"
    model: str  # the model name the server answers to
    url: str
    process: Optional[subprocess.Popen] = None  # None: a server started by someone else (--url)
    log: Optional[Path] = None
    mili: bool = False  # a MILI server: /metrics has its engine's counters

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mili(checkpoint: str, weight_dtype: str, kv_cache_dtype: str, log_dir: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "python_layer.cli", "serve", "--model", checkpoint, "--port", str(port),
           "--weight-dtype", weight_dtype, "--kv-cache-dtype", kv_cache_dtype, "--served-model-name", "mili",
           "--log-level", "warning"]
    server = _start(f"MILI {weight_dtype}", "mili", port, cmd, dict(os.environ), log_dir / f"mili-{weight_dtype}.log")
    server.mili = True
    return server


def start_llama(gguf: Path, threads: int, log_dir: Path, slots: int = 8) -> Server:
    """llama.cpp's own server (built by benchmarks/peers/setup.sh) on a GGUF it wrote: `slots` sequences decoded
    together (its continuous batching; at least 8), 1,024 tokens of context each, the weights read into memory (no
    mmap), without its host-memory prompt cache (`--cache-ram 0`): no prompt of the sweep repeats, and that cache,
    up to 8 GiB a server by default, filled with them until the OOM killer stopped a server at 32 streams."""
    slots = max(slots, 8)
    server, tools = PEERS / "build" / "bin" / "llama-server", "bash benchmarks/serving/setup.sh CHECKPOINT"
    if not gguf.is_file() or not server.is_file():
        raise SystemExit(f"{gguf if not gguf.is_file() else server} not found: run `{tools}` first")
    port = free_port()
    cmd = [str(server), "-m", str(gguf), "--alias", "llama", "--host", "127.0.0.1", "--port", str(port),
           "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(1024 * slots), "--load-mode", "none",
           "--cache-ram", "0"]
    return _start(f"llama.cpp {gguf.stem}", "llama", port, cmd, dict(os.environ), log_dir / f"llama-{gguf.stem}.log")


def start_vllm(checkpoint: str, dtype: str, log_dir: Path, max_num_seqs: int) -> Server:
    """vLLM's CPU build's OpenAI server (its venv from benchmarks/peers/setup.sh vllm) on both cores, as `mili bench
    peers` runs it offline (VLLM_ENV), with room for `max_num_seqs` sequences of 1,024 tokens (2 GiB of KV cache)."""
    python = vllm_python()
    port = free_port()
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", checkpoint, "--dtype", dtype,
           "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "vllm", "--max-model-len", "1024",
           "--max-num-seqs", str(max(max_num_seqs, 8)), "--disable-uvicorn-access-log"]
    env = {**os.environ, **VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "2"}
    return _start(f"vLLM {dtype}", "vllm", port, cmd, env, log_dir / f"vllm-{dtype}.log")


def _start(name: str, model: str, port: int, cmd: List[str], env: dict, log: Path) -> Server:
    log.parent.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parents[2]
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(name, model, f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + 600  # a first MILI start compiles the graph (minutes)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{name} exited with code {process.returncode} before serving; see {log}")
        try:
            if httpx.get(f"{server.url}/v1/models", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.stop()
    raise SystemExit(f"{name} did not answer on {server.url} within 600 s; see {log}")
