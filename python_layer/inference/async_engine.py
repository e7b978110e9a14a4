"""AsyncEngine: the InferenceEngine on one background thread, with an asyncio front for the server.

Only the engine thread touches the engine. The event loop hands it requests and aborts through a
command list guarded by a condition variable, and gets each request's outputs back through its own
asyncio queue (`loop.call_soon_threadsafe`), so compute never blocks the loop. The number of unfinished
requests is bounded: past `max_num_seqs + max_queue_len`, `add_requests` raises EngineOverloaded."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Dict, List, Optional, Sequence

from .inference_engine import InferenceEngine, Prompt
from .metrics import EngineMetrics
from .request import RequestOutput
from .sampling_params import SamplingParams

logger = logging.getLogger("mili.engine")


class EngineOverloaded(RuntimeError):
    """The waiting queue is full: the client should retry later (HTTP 503)."""


class EngineStopped(RuntimeError):
    """The engine is shutting down or stopped after an error (HTTP 503)."""


@dataclass
class _Tracked:
    """What the engine thread records of a request for its stream, its status and the latency metrics."""

    stream: "RequestStream"
    max_tokens: int
    num_prompt_tokens: int
    arrival: float = field(default_factory=time.perf_counter)
    last_token_time: Optional[float] = None
    tokens_generated: int = 0


class RequestStream:
    """The outputs of one or more requests submitted together (the n choices of an API call), as an async
    iterator of RequestOutput in the order they come; ends once every request finished. Raises what the
    engine raised if a request failed inside it."""

    def __init__(self, request_ids: List[str], loop: asyncio.AbstractEventLoop) -> None:
        self.request_ids = request_ids
        self.index = {request_id: i for i, request_id in enumerate(request_ids)}
        self.unfinished = set(request_ids)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = loop

    @property
    def finished(self) -> bool:
        return not self.unfinished

    def put(self, item: RequestOutput | BaseException) -> None:
        """Thread-safe: called from the engine thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while self.unfinished:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                self.unfinished.discard(item.request_id)
            yield item


class AsyncEngine:
    def __init__(self, engine: InferenceEngine, max_queue_len: int = 256, metrics: Optional[EngineMetrics] = None,
                 max_status_entries: int = 1024) -> None:
        if max_queue_len < 0:
            raise ValueError(f"max_queue_len must be >= 0, got {max_queue_len}")
        self.engine = engine
        self.capacity = engine.scheduler.max_num_seqs + max_queue_len
        self.metrics = metrics
        self._cv = threading.Condition()
        self._commands: List[Callable[[], None]] = []
        self._tracked: Dict[str, _Tracked] = {}  # unfinished requests (written by both threads under _cv)
        self._finished: "OrderedDict[str, dict]" = OrderedDict()  # status of the latest finished requests
        self._max_status_entries = max_status_entries
        self._accepting = True
        self._stop = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="mili-engine", daemon=True)
        self._thread.start()

    # ---- event-loop side -------------------------------------------------------------------------------------

    def add_requests(self, prompts: Sequence[Prompt], params: Sequence[SamplingParams]) -> RequestStream:
        """Queue requests that belong together; their outputs come through the returned stream. Call it on the
        event loop. Raises ValueError for a bad prompt (then nothing is queued), EngineOverloaded when the
        queue is full, EngineStopped when the engine no longer accepts requests."""
        token_ids = [self.engine.check_prompt(p)[1] for p in prompts]
        base = f"mili-{next(self._ids)}-{time.monotonic_ns():x}"
        ids = [base] if len(prompts) == 1 else [f"{base}-{i}" for i in range(len(prompts))]
        stream = RequestStream(ids, asyncio.get_running_loop())
        with self._cv:
            if not self._accepting:
                raise EngineStopped("the server is shutting down and accepts no new requests")
            if len(self._tracked) + len(ids) > self.capacity:
                raise EngineOverloaded(f"the server is at capacity ({len(self._tracked)} requests running or "
                                       f"waiting, at most {self.capacity}); retry later")
            for i, rid in enumerate(ids):
                self._tracked[rid] = _Tracked(stream, params[i].max_tokens, len(token_ids[i]))
                self._commands.append(functools.partial(self._add, rid, token_ids[i], params[i]))
            self._cv.notify()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Thread-safe; the stream's unfinished requests end with finish_reason "abort", their KV pages freed."""
        with self._cv:
            for request_id in stream.request_ids:
                if request_id in self._tracked:
                    self._commands.append(functools.partial(self._abort, request_id))
            self._cv.notify()

    def get_request_status(self, request_id: str) -> dict:
        """The design documents' {"status": "processing" | "completed" | "not_found", ...}."""
        with self._cv:
            tracked = self._tracked.get(request_id)
            if tracked is not None:
                return {"status": "processing", "tokens_generated": tracked.tokens_generated,
                        "tokens_remaining": tracked.max_tokens - tracked.tokens_generated}
            return dict(self._finished.get(request_id, {"status": "not_found"}))

    @property
    def num_unfinished(self) -> int:
        return len(self._tracked)

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def stop_accepting(self) -> None:
        with self._cv:
            self._accepting = False

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting, abort what is still in flight (their streams end with "abort"), stop the thread."""
        with self._cv:
            self._accepting, self._stop = False, True
            self._cv.notify()
        self._thread.join(timeout)

    # ---- engine thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cv:
                while not (self._commands or self._stop or engine.has_unfinished_requests()):
                    self._cv.wait()
                commands, self._commands, stop = self._commands, [], self._stop
            for command in commands:
                command()
            if stop:
                for request_id in list(engine.requests):
                    self._abort(request_id)
                return
            if engine.has_unfinished_requests():
                self._step()
            if self.metrics is not None:
                self.metrics.observe_engine(engine)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:  # an engine bug must not kill the server: fail the requests in flight, go on
            logger.exception("engine step failed; failing the %d requests in flight", len(self.engine.requests))
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
                self._fail(request_id, RuntimeError(f"the engine failed while running this request: {e}"))
            return
        now = time.perf_counter()
        for out in outputs:
            self._deliver(out, now)

    def _add(self, request_id: str, token_ids: List[int], params: SamplingParams) -> None:
        try:
            self.engine.add_request(token_ids, params, request_id=request_id)
        except ValueError as e:
            self._fail(request_id, e)

    def _abort(self, request_id: str) -> None:
        self.engine.abort(request_id)
        result = self.engine.get_completed_result(request_id)
        if result is not None and request_id in self._tracked:
            self._deliver(result, time.perf_counter())

    def _fail(self, request_id: str, error: BaseException) -> None:
        tracked = self._tracked.get(request_id)
        if tracked is not None:
            self._finish(request_id, tracked, "error", time.perf_counter())
            tracked.stream.put(error)

    def _finish(self, request_id: str, tracked: _Tracked, finish_reason: str, now: float) -> None:
        with self._cv:
            del self._tracked[request_id]
            self._finished[request_id] = {"status": "completed", "finish_reason": finish_reason,
                                          "tokens_generated": tracked.tokens_generated, "tokens_remaining": 0}
            while len(self._finished) > self._max_status_entries:
                self._finished.popitem(last=False)
        if self.metrics is not None:
            self.metrics.observe_finished(finish_reason, now - tracked.arrival)

    def _deliver(self, out: RequestOutput, now: float) -> None:
        tracked = self._tracked.get(out.request_id)
        if tracked is None:
            return
        new_tokens = len(out.token_ids) - tracked.tokens_generated
        if self.metrics is not None and new_tokens > 0:
            self.metrics.observe_tokens(tracked.last_token_time, tracked.arrival, now, new_tokens,
                                        tracked.num_prompt_tokens)
        tracked.tokens_generated = len(out.token_ids)
        tracked.last_token_time = now if new_tokens > 0 else tracked.last_token_time
        if out.finished:
            self._finish(out.request_id, tracked, out.finish_reason, now)
        tracked.stream.put(out)
