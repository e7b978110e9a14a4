"""What the routes share: the engine once loaded, the tokenizer, the metrics; submitting requests and reading
their outputs so that a client that goes away (or a stream closed early) aborts its requests."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Union

from fastapi import Request

from ..inference.async_engine import AsyncEngine, EngineOverloaded, EngineStopped, RequestStream
from ..inference.metrics import EngineMetrics
from ..inference.request import RequestDelta, choice_request_id
from ..inference.sampling_params import SamplingParams
from ..tokenizer.chat_template import ChatTemplate
from .errors import ApiError

logger = logging.getLogger("mili.server")
Prompt = Union[str, List[int]]


@dataclass
class ServerConfig:
    model_name: str
    api_key: Optional[str] = None
    max_body_bytes: int = 8 * 2**20
    body_timeout_seconds: float = 30.0  # a body not received in full by then answers 408
    max_queue_len: int = 256
    sampling_defaults: Dict[str, Any] = field(default_factory=dict)
    """temperature / top_p / top_k of requests that leave them out (a config file's `sampling`)."""


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.engine: Optional[AsyncEngine] = None
        self.metrics = EngineMetrics(config.model_name)
        self.formatter: Optional[ChatTemplate] = None
        self.load_error: Optional[str] = None
        self.shutting_down = False

    async def load(self, loader: Callable[[EngineMetrics], AsyncEngine], on_failure: Callable[[], None]) -> None:
        """Run the (blocking) loader on a worker thread; the server answers /health (503) meanwhile."""
        try:
            engine = await asyncio.to_thread(loader, self.metrics)
        except Exception as e:
            # a wrong --model or option is the user's mistake: the message says it all, a traceback would bury it
            logger.error("loading the model failed: %s", e, exc_info=not isinstance(e, (FileNotFoundError, ValueError)))
            self.load_error = f"{type(e).__name__}: {e}"
            on_failure()
            return
        self.formatter = ChatTemplate(engine.engine.tokenizer)
        self.engine = engine

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.is_running and not self.shutting_down

    def require_engine(self) -> AsyncEngine:
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        if self.engine is None:
            reason = (
                f"loading failed: {self.load_error}" if self.load_error else "the model is still loading; retry shortly"
            )
            raise ApiError(503, reason, code="model_not_ready")
        if not self.engine.is_running:
            raise ApiError(503, "the engine stopped", code="engine_stopped")
        return self.engine

    def check_model(self, model: Optional[str]) -> None:
        if model is not None and model != self.config.model_name:
            raise ApiError(404, f"the model '{model}' does not exist: this server serves '{self.config.model_name}' "
                                "(GET /v1/models)", param="model", code="model_not_found")

    async def token_ids(self, prompt: Prompt) -> List[int]:
        """The prompt's token ids (tokenized off the event loop); 400 naming the problem (empty, bad ids,
        longer than the context)."""
        engine = self.require_engine().engine
        try:
            return (await asyncio.to_thread(engine.check_prompt, prompt))[1]
        except ValueError as e:
            raise ApiError(400, str(e), param="prompt", code="invalid_prompt") from None

    def submit(self, prompts: Sequence[List[int]], params: Sequence[SamplingParams], request_id: str) -> RequestStream:
        """Queue the requests of one API call (token ids from `token_ids`). With one request its id is
        `request_id`; with several (n choices, several prompts) each one's is `request_id-i`. 400 when a prompt and
        its max_tokens do not fit in the context."""
        engine = self.require_engine()
        if len(prompts) > engine.capacity:  # would be refused however long the client waits: not a 503
            raise ApiError(400, f"the request asks for {len(prompts)} completions (n times the prompts), more than the "
                                f"server can hold at once: at most {engine.capacity}", param="n")
        context = engine.engine.max_model_len
        for prompt, p in zip(prompts, params):
            if len(prompt) + p.max_tokens > context:  # refused, as vLLM does, rather than cut short without a word
                raise ApiError(400, f"the model's context is {context} tokens (max_model_len), but this request asks "
                                    f"for {len(prompt) + p.max_tokens}: {len(prompt)} in the prompt and max_tokens "
                                    f"{p.max_tokens}: lower max_tokens or shorten the prompt", param="max_tokens",
                               code="context_length_exceeded")
        ids = [request_id] if len(prompts) == 1 else [choice_request_id(request_id, i) for i in range(len(prompts))]
        try:
            return engine.add_requests(prompts, params, ids)
        except EngineOverloaded as e:
            raise ApiError(503, str(e), code="server_overloaded") from None
        except EngineStopped as e:
            raise ApiError(503, str(e), code="shutting_down") from None

    async def outputs(self, http_request: Request, stream: RequestStream) -> AsyncIterator[RequestDelta]:
        """The stream's deltas until all its requests finished. When the client disconnects, or the consumer
        stops iterating early, the unfinished requests are aborted (their KV pages freed)."""
        watcher = asyncio.ensure_future(_end_on_disconnect(http_request, stream))
        try:
            async for output in stream:
                yield output
        except RuntimeError as e:  # the engine failed this request; the server goes on
            raise ApiError(500, str(e), code="engine_error") from e
        finally:
            watcher.cancel()
            if not stream.finished and self.engine is not None:
                self.engine.abort(stream)


async def _end_on_disconnect(http_request: Request, stream: RequestStream) -> None:
    """Ends the stream's iteration when the client disconnects: once the body is read, ASGI's receive waits
    for the disconnect (no polling)."""
    while (await http_request.receive())["type"] != "http.disconnect":
        pass
    if not stream.finished:
        logger.info("client disconnected: aborting %s", ", ".join(stream.request_ids))
        stream.end()
