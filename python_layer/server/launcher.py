"""`mili serve`: listen at once (/health answers 503 while loading), load the model on a worker thread with a
progress display (a live counter on a terminal, a line every 10 s in a log), then serve; SIGINT/SIGTERM stop
admitting, let in-flight requests finish for a grace period, abort the rest, and exit 0."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import uvicorn

from bindings.gpu_options import GpuOptions

from ..inference.async_engine import AsyncEngine
from ..inference.inference_engine import InferenceEngine
from ..inference.metrics import EngineMetrics
from ..inference.sampling_params import SamplingParams
from ..model.loader import load_model
from .app import build_app
from .config_file import ensure_random_model, random_model_dir
from .header_timeout import HeaderTimeoutProtocol
from .state import ServerConfig


@contextlib.contextmanager
def _phase(name: str, interval: float = 10.0) -> Iterator[None]:
    """A loading phase on stderr: a start line, a progress line every `interval` seconds, and an end line, each a line
    of its own (the server's other log lines come between them)."""
    started, done = time.perf_counter(), threading.Event()

    def tick() -> None:
        while not done.wait(interval):
            print(f"[mili] {name} ... {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)

    print(f"[mili] {name} ...", file=sys.stderr, flush=True)
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    status = "failed"
    try:
        yield
        status = "done"
    finally:
        done.set()
        ticker.join()
        print(f"[mili] {name}: {status} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


class _NotReadyYet(logging.Filter):
    """Drops uvicorn's "Uvicorn running on ..." line: it comes as the socket opens, before the model has loaded.
    MILI says when it listens, and `serving NAME on URL` when it answers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Uvicorn running on")


def served_name(args: argparse.Namespace) -> str:
    if args.model:
        return Path(args.model).name
    return random_model_dir(args.random_model).name if args.random_model else "mili-builtin"


def make_loader(args: argparse.Namespace, gpu_options: GpuOptions) -> Callable[[EngineMetrics], AsyncEngine]:
    def load(metrics: EngineMetrics) -> AsyncEngine:
        path = args.model
        if args.random_model is not None:  # a config file's model config, without a checkpoint
            with _phase("generating random weights of the config file's model shape"):
                path = ensure_random_model(args.random_model)
        # --kv-memory-fraction's share of the memory free before the weights: more than after, as room to leave
        model = load_model(path, device=args.device, dtype=args.dtype, backend=args.backend, on_phase=_phase,
                           weight_dtype=args.weight_dtype, kv_cache_dtype=args.kv_cache_dtype,
                           num_kv_pages=args.kv_pages, kv_cache_memory_gb=_kv_memory_gb(args), page_size=args.page_size,
                           gpu_options=gpu_options)
        with _phase("allocating the KV cache and warming up"):
            engine = InferenceEngine(model, num_kv_pages=args.kv_pages, kv_cache_memory_gb=_kv_memory_gb(args),
                                     page_size=args.page_size, max_model_len=args.max_model_len,
                                     max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                                     device_graphs=args.device_graphs, overlap=args.overlap)
            engine.generate([[0, 1]], SamplingParams(max_tokens=2, ignore_eos=True))
        print(f"[mili] serving {args.served_model_name} on http://{args.host}:{args.port} "
              f"(max_model_len {engine.max_model_len}, {engine.kv_cache.num_pages} KV pages, "
              f"max_num_seqs {args.max_num_seqs})", file=sys.stderr, flush=True)
        return AsyncEngine(engine, max_queue_len=args.max_queue_len, metrics=metrics)

    return load


def _kv_memory_gb(args: argparse.Namespace) -> Optional[float]:
    """What sizes the KV pool when --kv-pages does not (config_file.check_options checked the values); None: the
    engine's default."""
    if args.kv_memory_fraction is None:
        return args.kv_cache_memory_gb
    if args.device.startswith("cuda"):
        import torch

        free = torch.cuda.mem_get_info(torch.device(args.device))[0]
    else:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return args.kv_memory_fraction * free / 2**30


class _Server(uvicorn.Server):
    """On SIGINT/SIGTERM: stop admitting at once, give in-flight requests `grace` seconds, then abort them (their
    streams end with finish_reason "abort"), and exit 0 instead of re-raising the signal as uvicorn does."""

    grace: float = 10.0
    _abort_timer: Optional[threading.Timer] = None

    def handle_exit(self, sig, frame) -> None:
        state = self.config.app.state.mili
        state.shutting_down = True
        if state.engine is not None and self._abort_timer is None:
            state.engine.stop_accepting()
            self._abort_timer = threading.Timer(self.grace, state.engine.shutdown)
            self._abort_timer.daemon = True
            self._abort_timer.start()
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def api_key_of(args: argparse.Namespace) -> Optional[str]:
    """--api-key, else $MILI_API_KEY (a key kept off the command line, where `ps` shows it), else none."""
    return args.api_key or os.environ.get("MILI_API_KEY") or None


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.served_model_name = args.served_model_name or served_name(args)
    try:  # before the server starts: a bad value stops it here, naming the variable
        gpu_options = GpuOptions.from_environment()
    except ValueError as e:
        print(f"mili: error: {e}", file=sys.stderr)
        return 2
    api_key = api_key_of(args)
    config = ServerConfig(model_name=args.served_model_name, api_key=api_key, max_queue_len=args.max_queue_len,
                          sampling_defaults=getattr(args, "sampling_defaults", {}))
    server: Optional[_Server] = None

    def on_load_failure() -> None:
        server.should_exit = True

    app = build_app(config, make_loader(args, gpu_options), on_load_failure)
    server = _Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                                    http=HeaderTimeoutProtocol, loop="uvloop",
                                    timeout_graceful_shutdown=args.shutdown_timeout + 5))
    server.grace = args.shutdown_timeout
    logging.getLogger("uvicorn.error").addFilter(_NotReadyYet())
    print(f"[mili] listening on http://{args.host}:{args.port} (GET /health answers 503 until the model has loaded)",
          file=sys.stderr, flush=True)
    server.run()
    state = app.state.mili
    if state.load_error:
        print(f"mili: error: {state.load_error}", file=sys.stderr)
        return 1
    return 0
