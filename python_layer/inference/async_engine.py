"""AsyncEngine: the server's side of an engine whose loop runs elsewhere (engine_core.py: on a thread of this
process, or in a process of its own), with an asyncio front for the routes.

The event loop hands the engine commands (add, abort) and never touches it. The engine's side publishes each
step's deltas; here they update each request's `ClientRequest` and its metrics, and go to its stream's asyncio
queue, all of a step's in one `loop.call_soon_threadsafe` (one wake-up of the loop a step, whatever the batch).
The number of unfinished requests is bounded: past `max_num_seqs + max_queue_len`, `add_requests` raises
EngineOverloaded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Any, AsyncIterator, Dict, List, Optional, Sequence, Tuple, Union

from ..tokenizer.qwen_tokenizer import CheckpointTokenizer
from .client_request import ClientRequest
from .engine_core import STOP, Failure, ThreadCore, abort_command, add_command
from .engine_process import ProcessCore
from .inference_engine import Prompt, check_prompt
from .metrics import EngineMetrics
from .request import RequestDelta, choice_request_id
from .sampling_params import SamplingParams

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

    def __init__(self, requests: List[ClientRequest], loop: asyncio.AbstractEventLoop) -> None:
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

    @staticmethod
    def put_all(items: Sequence[Tuple["RequestStream", RequestDelta | BaseException]]) -> None:
        """Thread-safe: each item onto its stream, in one wake-up of each event loop."""
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
    def __init__(self, core: Union[ThreadCore, ProcessCore], max_queue_len: int = 256,
                 metrics: Optional[EngineMetrics] = None, max_finished_requests: int = 1024) -> None:
        if max_queue_len < 0:
            raise ValueError(f"max_queue_len must be >= 0, got {max_queue_len}")
        self.core = core
        self.info = core.info
        self.tokenizer: CheckpointTokenizer = core.tokenizer
        self.capacity = core.info.max_num_seqs + max_queue_len
        self.metrics = metrics
        self._lock = threading.Lock()
        # written by the event loop (add) and the core's thread (deltas) under _lock
        self._unfinished: Dict[str, ClientRequest] = {}
        self._streams: Dict[str, RequestStream] = {}
        self._finished: "OrderedDict[str, ClientRequest]" = OrderedDict()  # the latest, for /status
        self._max_finished = max_finished_requests
        self._accepting = True
        self._stopped = False
        self._exited = False
        core.start(self._publish, self._on_exit)

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def generation_defaults(self) -> Dict[str, Any]:
        return self.info.generation_defaults

    def check_prompt(self, prompt: Prompt) -> Tuple[Optional[str], List[int]]:
        """(text or None, token ids) of a prompt; ValueError naming the problem when it cannot run here."""
        return check_prompt(prompt, self.tokenizer, self.info.vocab_size, self.info.max_model_len)

    # ---- event-loop side -------------------------------------------------------------------------------------

    def add_requests(self, prompts: Sequence[List[int]], params: Sequence[SamplingParams],
                     request_ids: Sequence[str]) -> RequestStream:
        """Queue requests that belong together; their deltas come through the returned stream. The prompts are
        token ids that `check_prompt` passed. Call it on the event loop. Raises EngineOverloaded when the
        queue is full, EngineStopped when the engine no longer accepts requests."""
        requests = [ClientRequest(rid, list(p), min(self.max_model_len, len(p) + sp.max_tokens) - len(p),
                                  [] if sp.logprobs is not None else None)
                    for p, sp, rid in zip(prompts, params, request_ids)]
        stream = RequestStream(requests, asyncio.get_running_loop())
        with self._lock:
            if not self._accepting:
                raise EngineStopped("the server is shutting down and accepts no new requests")
            if len(self._unfinished) + len(requests) > self.capacity:
                raise EngineOverloaded(f"the server is at capacity ({len(self._unfinished)} requests running or "
                                       f"waiting, at most {self.capacity}); retry later")
            for request in requests:
                self._unfinished[request.request_id] = request
                self._streams[request.request_id] = stream
        self.core.send([add_command(r.request_id, r.prompt_token_ids, sp) for r, sp in zip(requests, params)])
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Thread-safe; the stream's unfinished requests end with finish_reason "abort", their KV pages freed."""
        with self._lock:
            request_ids = [rid for rid in stream.request_ids if rid in self._unfinished]
        if request_ids:
            self.core.send([abort_command(rid) for rid in request_ids])

    def get_request_status(self, request_id: str) -> dict:
        """The design documents' {"status": "processing" | "completed" | "not_found", ...}. The id of an API call
        that made several requests (`id-0`, `id-1`, ...: n choices, several prompts) answers for them all, each in
        "choices"."""
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
        with self._lock:
            request = self._unfinished.get(request_id) or self._finished.get(request_id)
        return request.status_dict() if request is not None else {"status": "not_found"}

    @property
    def num_unfinished(self) -> int:
        return len(self._unfinished)

    @property
    def is_running(self) -> bool:
        return not (self._exited or self._stopped)

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting, abort what is still in flight (their streams end with "abort"), stop the engine."""
        with self._lock:
            self._accepting, self._stopped = False, True
        self.core.send([STOP])
        self.core.join(timeout)

    # ---- the core's thread -----------------------------------------------------------------------------------

    def _publish(self, deltas: List[RequestDelta], failures: List[Failure], snapshot: Dict[str, Any]) -> None:
        now = time.perf_counter()
        items: List[Tuple[RequestStream, RequestDelta | BaseException]] = []
        for request_id, error in failures:
            stream = self._finish(request_id, "error", now)
            if stream is not None:
                items.append((stream, error))
        for delta in deltas:
            request, stream = self._unfinished.get(delta.request_id), self._streams.get(delta.request_id)
            if request is None or stream is None:
                continue
            request.apply(delta, now)
            if self.metrics is not None and delta.token_ids:
                self.metrics.observe_tokens(request, len(delta.token_ids))
            if delta.finished:
                self._finish(delta.request_id, delta.finish_reason, now)
            items.append((stream, delta))
        if self.metrics is not None:
            self.metrics.observe_engine(snapshot)
        RequestStream.put_all(items)

    def _finish(self, request_id: str, finish_reason: str, now: float) -> Optional[RequestStream]:
        with self._lock:
            request = self._unfinished.pop(request_id, None)
            stream = self._streams.pop(request_id, None)
            if request is None:
                return None
            self._finished[request_id] = request
            while len(self._finished) > self._max_finished:
                self._finished.popitem(last=False)
        if self.metrics is not None:
            self.metrics.observe_finished(finish_reason, now - request.arrival_time)
        return stream

    def _on_exit(self) -> None:
        """The engine's loop ended: after a stop every request was aborted; otherwise it died with them."""
        self._exited = True
        now = time.perf_counter()
        error = RuntimeError("the engine stopped while running this request (see the server's log)")
        items = [(stream, error) for stream in
                 {s for s in (self._finish(rid, "error", now) for rid in list(self._unfinished)) if s is not None}]
        RequestStream.put_all(items)
