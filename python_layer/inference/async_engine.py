"""AsyncEngine: the InferenceEngine on one background thread, with an asyncio front for the server.

Only the engine thread touches the engine. The event loop hands it requests and aborts through a command list
guarded by a condition variable, and gets each request's deltas back through its own asyncio queue, all of a
step's deltas in one `loop.call_soon_threadsafe` (one wake-up of the loop a step, whatever the batch), so compute
never blocks the loop. The number of unfinished requests is bounded: past `max_num_seqs + max_queue_len`,
`add_requests` raises EngineOverloaded."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from typing import AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple

from .inference_engine import InferenceEngine
from .metrics import EngineMetrics
from .request import InferenceRequest, RequestDelta, choice_request_id
from .sampling_params import SamplingParams

logger = logging.getLogger("mili.engine")


class EngineOverloaded(RuntimeError):
    """The waiting queue is full: the client should retry later (HTTP 503)."""


class EngineStopped(RuntimeError):
    """The engine is shutting down or stopped after an error (HTTP 503)."""


_ENDED = object()  # queued by RequestStream.end: the iteration stops there


def _put_each(items: List[tuple]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


class RequestStream:
    """The deltas of one or more requests submitted together (the n choices of an API call), as an async
    iterator of RequestDelta in the order they come; ends once every request finished, or at `end`. Raises what
    the engine raised if a request failed inside it. Once a request finished, `requests[i].output()` is its
    result."""

    def __init__(self, requests: List[InferenceRequest], loop: asyncio.AbstractEventLoop) -> None:
        self.requests = requests
        self.index = {r.request_id: i for i, r in enumerate(requests)}
        self.unfinished = set(self.index)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = loop

    @property
    def request_ids(self) -> List[str]:
        return [r.request_id for r in self.requests]

    @property
    def finished(self) -> bool:
        return not self.unfinished

    def put(self, item: RequestDelta | BaseException) -> None:
        """Thread-safe: called from the engine thread."""
        RequestStream.put_all([(self, item)])

    @staticmethod
    def put_all(items: Sequence[Tuple["RequestStream", RequestDelta | BaseException]]) -> None:
        """Thread-safe, from the engine thread: each item onto its stream, in one wake-up of each event loop."""
        by_loop: Dict[asyncio.AbstractEventLoop, List[tuple]] = {}
        for stream, item in items:
            by_loop.setdefault(stream._loop, []).append((stream._queue, item))
        for loop, queued in by_loop.items():
            loop.call_soon_threadsafe(_put_each, queued)

    def end(self) -> None:
        """On the event loop: the iteration stops after what is queued (its consumer went away)."""
        self._queue.put_nowait(_ENDED)

    async def __aiter__(self) -> AsyncIterator[RequestDelta]:
        while self.unfinished:
            item = await self._queue.get()
            if item is _ENDED:
                return
            if isinstance(item, BaseException):
                raise item
            if item.finished:
                self.unfinished.discard(item.request_id)
            yield item


class AsyncEngine:
    def __init__(
        self, engine: InferenceEngine, max_queue_len: int = 256, metrics: Optional[EngineMetrics] = None
    ) -> None:
        if max_queue_len < 0:
            raise ValueError(f"max_queue_len must be >= 0, got {max_queue_len}")
        self.engine = engine
        self.capacity = engine.scheduler.max_num_seqs + max_queue_len
        self.metrics = metrics
        self._cv = threading.Condition()
        self._commands: List[Callable[[], None]] = []
        # the unfinished requests (written by both threads under _cv): their state lives on the request objects
        self._unfinished: Dict[str, InferenceRequest] = {}
        self._streams: Dict[str, RequestStream] = {}
        self._accepting = True
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="mili-engine", daemon=True)
        self._thread.start()

    # ---- event-loop side -------------------------------------------------------------------------------------

    def add_requests(self, prompts: Sequence[List[int]], params: Sequence[SamplingParams],
                     request_ids: Sequence[str]) -> RequestStream:
        """Queue requests that belong together; their deltas come through the returned stream. The prompts are
        token ids that `engine.check_prompt` passed. Call it on the event loop. Raises EngineOverloaded when the
        queue is full, EngineStopped when the engine no longer accepts requests."""
        requests = [self.engine.new_request(p, sp, rid) for p, sp, rid in zip(prompts, params, request_ids)]
        stream = RequestStream(requests, asyncio.get_running_loop())
        with self._cv:
            if not self._accepting:
                raise EngineStopped("the server is shutting down and accepts no new requests")
            if len(self._unfinished) + len(requests) > self.capacity:
                raise EngineOverloaded(f"the server is at capacity ({len(self._unfinished)} requests running or "
                                       f"waiting, at most {self.capacity}); retry later")
            for request in requests:
                self._unfinished[request.request_id] = request
                self._streams[request.request_id] = stream
                self._commands.append(functools.partial(self._add, request))
            self._cv.notify()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Thread-safe; the stream's unfinished requests end with finish_reason "abort", their KV pages freed."""
        with self._cv:
            for request_id in stream.request_ids:
                if request_id in self._unfinished:
                    self._commands.append(functools.partial(self._abort, request_id))
            self._cv.notify()

    def get_request_status(self, request_id: str) -> dict:
        """The design documents' {"status": "processing" | "completed" | "not_found", ...}: queued requests
        the engine thread has not taken yet are processing too. The id of an API call that made several requests
        (`id-0`, `id-1`, ...: n choices, several prompts) answers for them all, each in "choices"."""
        status = self._status(request_id)
        if status["status"] != "not_found":
            return status
        choices = []
        while (child := self._status(choice_request_id(request_id, len(choices))))["status"] != "not_found":
            choices.append(child)
        if not choices:
            return status
        return {"status": "processing" if any(c["status"] == "processing" for c in choices) else "completed",
                "tokens_generated": sum(c["tokens_generated"] for c in choices),
                "tokens_remaining": sum(c["tokens_remaining"] for c in choices),
                "choices": [{"index": i, **c} for i, c in enumerate(choices)]}

    def _status(self, request_id: str) -> dict:
        request = self._unfinished.get(request_id)
        return request.status_dict() if request is not None else self.engine.get_request_status(request_id)

    @property
    def num_unfinished(self) -> int:
        return len(self._unfinished)

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
            deltas = self.engine.step()
        except Exception as e:  # an engine bug must not kill the server: fail the requests in flight, go on
            logger.exception("engine step failed; failing the %d requests in flight", len(self.engine.requests))
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
                self._fail(request_id, RuntimeError(f"the engine failed while running this request: {e}"))
            return
        with self.engine.times.phase("deliver"):
            routed = [(self._route(delta), delta) for delta in deltas]
            RequestStream.put_all([(stream, delta) for stream, delta in routed if stream is not None])

    def _add(self, request: InferenceRequest) -> None:
        try:
            self.engine.submit(request)
        except ValueError as e:
            self._fail(request.request_id, e)

    def _abort(self, request_id: str) -> None:
        delta = self.engine.abort(request_id)
        if delta is not None:
            self._deliver(delta)

    def _fail(self, request_id: str, error: BaseException) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            self._forget(request_id, "error")
            stream.put(error)

    def _forget(self, request_id: str, finish_reason: str) -> None:
        with self._cv:
            request = self._unfinished.pop(request_id)
            del self._streams[request_id]
        if self.metrics is not None:
            self.metrics.observe_finished(finish_reason, time.perf_counter() - request.arrival_time)

    def _deliver(self, delta: RequestDelta) -> None:
        stream = self._route(delta)
        if stream is not None:
            stream.put(delta)

    def _route(self, delta: RequestDelta) -> Optional[RequestStream]:
        """The stream a delta goes to (None: its request is no longer followed), its metrics and bookkeeping done."""
        stream = self._streams.get(delta.request_id)
        if stream is None:
            return None
        if self.metrics is not None and delta.token_ids:
            request = self._unfinished[delta.request_id]
            self.metrics.observe_tokens(request, len(delta.token_ids))
        if delta.finished:
            self._forget(delta.request_id, delta.finish_reason)
        return stream

