"""`mili serve --replicas N ...`: N `mili serve` workers behind SGLang's router (`sglang-router` on PyPI:
`pip install -e '.[replicas]'`), which spreads the OpenAI API's traffic over them with its cache-aware policy
(requests that share a prefix go to the worker whose radix tree holds it), health checks and retries.

The router listens on --host / --port; worker i on 127.0.0.1, port + 1 + i, with the same options otherwise (a
--config file included). The router starts once every worker answers /health. SIGINT / SIGTERM stop the router,
then the workers, each with its --shutdown-timeout for the requests in flight; a worker that dies is dropped by the
router's health checks and its unstarted requests are retried on the others."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import urllib.request
from typing import List

ROUTER_POLICY = "cache_aware"


def worker_ports(args: argparse.Namespace) -> List[int]:
    return [args.port + 1 + i for i in range(args.replicas)]


def worker_urls(args: argparse.Namespace) -> List[str]:
    return [f"http://127.0.0.1:{port}" for port in worker_ports(args)]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def router_command(args: argparse.Namespace) -> List[str]:
    return [sys.executable, "-m", "sglang_router.launch_router", "--host", args.host, "--port", str(args.port),
            "--policy", ROUTER_POLICY, "--worker-urls", *worker_urls(args),
            "--health-check-interval-secs", "2", "--health-failure-threshold", "2",
            # a worker that dies: its circuit opens after 3 failed requests, and each request's retries (re-routed
            # while they last, ~7 s) outlast that and the health checks, so none that had not started is lost
            "--cb-failure-threshold", "3", "--retry-max-retries", "8", "--retry-initial-backoff-ms", "100",
            "--retry-max-backoff-ms", "2000"]


def serve_replicas(args: argparse.Namespace, serve_argv: List[str]) -> int:
    try:
        import sglang_router  # noqa: F401
    except ImportError:
        raise ValueError("--replicas needs SGLang's router: pip install -e '.[replicas]' (sglang-router)") from None
    urls = worker_urls(args)
    # the same options; the last --replicas / --host / --port win (over a config file's too)
    base = [sys.executable, "-m", "python_layer.cli", "serve", *serve_argv, "--replicas", "1", "--host", "127.0.0.1"]
    workers = [subprocess.Popen([*base, "--port", str(port)]) for port in worker_ports(args)]
    router = None
    stopping = False

    def stop(signum=None, frame=None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping and not all(_healthy(url) for url in urls):
            dead = [url for url, w in zip(urls, workers) if w.poll() is not None]
            if dead:
                print(f"mili: error: the worker at {dead[0]} exited while loading", file=sys.stderr)
                return 1
            time.sleep(0.5)
        if stopping:
            return 0
        router = subprocess.Popen(router_command(args))
        print(f"[mili] {args.replicas} workers ({', '.join(urls)}) behind SGLang's router on "
              f"http://{args.host}:{args.port} (policy {ROUTER_POLICY})", file=sys.stderr, flush=True)
        while not stopping and router.poll() is None:
            time.sleep(0.5)
        return 0 if stopping else router.returncode or 1
    finally:
        for process in ([router] if router else []) + workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in ([router] if router else []) + workers:
            try:
                process.wait(timeout=args.shutdown_timeout + 30)
            except subprocess.TimeoutExpired:
                process.kill()
