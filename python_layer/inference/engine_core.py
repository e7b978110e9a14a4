"""The engine's side of a served engine: one loop that takes commands (add, abort, stop), steps the
InferenceEngine and publishes each step's deltas, run on a thread of the server's process (`ThreadCore`) or in a
process of its own (`engine_process.ProcessCore`). The server's side is async_engine.AsyncEngine."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .inference_engine import InferenceEngine
from .request import RequestDelta
from .sampling_params import SamplingParams

logger = logging.getLogger("mili.engine")

Command = Tuple  # ("add", request_id, token_ids, SamplingParams) | ("abort", request_id) | ("stop",)
Failure = Tuple[str, BaseException]  # (request_id, what failed it)
Publish = Callable[[List[RequestDelta], List[Failure], Dict[str, Any]], None]
NextCommands = Callable[[bool], List[Command]]  # (block until one comes) -> the commands that came


def add_command(request_id: str, token_ids: List[int], params: SamplingParams) -> Command:
    return ("add", request_id, token_ids, params)


def abort_command(request_id: str) -> Command:
    return ("abort", request_id)


STOP: Command = ("stop",)


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know of an engine it may not hold: its limits, its tokenizer's checkpoint."""

    model_path: Optional[str]
    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    generation_defaults: Dict[str, Any]

    @classmethod
    def of(cls, engine: InferenceEngine) -> "EngineInfo":
        config = engine.model.config
        path = engine.model.model_path
        return cls(None if path is None else str(Path(path).resolve()), engine.max_model_len, config.vocab_size,
                   engine.scheduler.max_num_seqs, dict(config.generation_defaults))


def engine_snapshot(engine: InferenceEngine) -> Dict[str, Any]:
    """The gauges and cumulative counters of /metrics, as plain numbers (they cross processes)."""
    scheduler, times, prefix = engine.scheduler, engine.times, engine.prefix_cache
    return {
        "running": len(scheduler.running),
        "waiting": len(scheduler.waiting),
        "prefix_pages": prefix.num_cached_pages if prefix else 0,
        # pages referenced only by the prefix cache are reusable: they do not count as used
        "kv_usage": engine.num_request_pages / engine.kv_cache.num_usable_pages,
        "preemptions": scheduler.num_preemptions,
        "prefix_queries": prefix.queried_tokens if prefix else 0,
        "prefix_hits": prefix.hit_tokens if prefix else 0,
        "seconds": dict(times.seconds),
        "steps": dict(times.steps),
        "rows": dict(times.rows),
        "tokens": dict(times.tokens),
    }


def run_engine_loop(engine: InferenceEngine, next_commands: NextCommands, publish: Publish) -> None:
    """Until a stop command: apply the commands that came, step while requests are unfinished, publish what each
    round made (and the engine's snapshot). At the stop, what is still running ends with finish_reason "abort"."""
    while True:
        commands = next_commands(not engine.has_unfinished_requests())
        deltas: List[RequestDelta] = []
        failures: List[Failure] = []
        stop = False
        for command in commands:
            if command[0] == "add":
                _, request_id, token_ids, params = command
                try:
                    engine.submit(engine.new_request(token_ids, params, request_id))
                except ValueError as e:
                    failures.append((request_id, e))
            elif command[0] == "abort":
                deltas += _abort(engine, [command[1]])
            else:
                stop = True
        if stop:
            deltas += _abort(engine, list(engine.requests))
        elif engine.has_unfinished_requests():
            deltas += _step(engine, failures)
        if commands or deltas or failures:
            with engine.times.phase("deliver"):
                publish(deltas, failures, engine_snapshot(engine))
        if stop:
            return


def _abort(engine: InferenceEngine, request_ids: List[str]) -> List[RequestDelta]:
    return [d for d in (engine.abort(request_id) for request_id in request_ids) if d is not None]


def _step(engine: InferenceEngine, failures: List[Failure]) -> List[RequestDelta]:
    try:
        return engine.step()
    except Exception as e:  # an engine bug must not kill the server: fail the requests in flight, go on
        logger.exception("engine step failed; failing the %d requests in flight", len(engine.requests))
        error = RuntimeError(f"the engine failed while running this request: {e}")
        request_ids = list(engine.requests)
        _abort(engine, request_ids)
        failures += [(request_id, error) for request_id in request_ids]
        return []


class ThreadCore:
    """The engine loop on a thread of this process. Its engine is `engine` (tests look inside it)."""

    def __init__(self, engine: InferenceEngine) -> None:
        self.engine = engine
        self.info = EngineInfo.of(engine)
        self.tokenizer = engine.tokenizer
        self._cv = threading.Condition()
        self._commands: List[Command] = []
        self._thread: Optional[threading.Thread] = None

    def start(self, publish: Publish, on_exit: Callable[[], None]) -> None:
        def run() -> None:
            try:
                run_engine_loop(self.engine, self._next_commands, publish)
            finally:
                on_exit()

        self._thread = threading.Thread(target=run, name="mili-engine", daemon=True)
        self._thread.start()

    def send(self, commands: List[Command]) -> None:
        with self._cv:
            self._commands += commands
            self._cv.notify()

    def _next_commands(self, block: bool) -> List[Command]:
        with self._cv:
            while block and not self._commands:
                self._cv.wait()
            commands, self._commands = self._commands, []
        return commands

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
