"""The FastAPI app: the design documents' routes (/generate, /status, /health, /), /metrics, the OpenAI routes
(openai_api.py), API-key checks, body limits and errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import __version__
from ..inference.async_engine import AsyncEngine, RequestStream
from ..inference.metrics import EngineMetrics
from ..inference.request import RequestDelta, RequestOutput, new_request_id
from . import openai_api
from .errors import HANDLERS
from .middleware import GuardMiddleware
from .protocol import GenerateRequest
from .sse import SSE_DONE, sse_error, sse_event
from .state import ServerConfig, ServerState

Loader = Callable[[EngineMetrics], AsyncEngine]


def build_app(config: ServerConfig, loader: Loader, on_load_failure: Optional[Callable[[], None]] = None) -> FastAPI:
    """The app; `loader` builds the engine on a worker thread after the server starts listening."""
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loading = asyncio.create_task(state.load(loader, on_load_failure or (lambda: None)))
        yield
        state.shutting_down = True
        await loading
        if state.engine is not None:
            await asyncio.to_thread(state.engine.shutdown)

    app = FastAPI(title="MILI", version=__version__, lifespan=lifespan,
                  description="Qwen3 inference server: the design documents' API and an OpenAI-compatible API.")
    app.state.mili = state
    app.add_middleware(GuardMiddleware, max_body_bytes=config.max_body_bytes, api_key=config.api_key,
                       body_timeout=config.body_timeout_seconds)
    for exc, handler in HANDLERS.items():
        app.add_exception_handler(exc, handler)
    app.include_router(openai_api.router)

    @app.get("/")
    async def root() -> dict:
        return {"name": "MILI", "message": "MILI Qwen3 Inference Server", "version": __version__,
                "model": config.model_name,
                "links": {"docs": "/docs", "health": "/health", "generate": "/generate (POST)",
                          "status": "/status/{request_id}", "completions": "/v1/completions (POST)",
                          "chat": "/v1/chat/completions (POST)", "models": "/v1/models", "metrics": "/metrics"}}

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {
            "status": "healthy" if state.ready else _unready_status(state),
            "model_loaded": state.engine is not None,
            "scheduler_ready": state.ready,
        }
        if state.load_error:
            body["error"] = state.load_error
        return JSONResponse(
            body, status_code=200 if state.ready else 503, headers=None if state.ready else {"Retry-After": "5"}
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/status/{request_id}")
    async def status(request_id: str) -> dict:
        return {"request_id": request_id, **state.require_engine().get_request_status(request_id)}

    @app.post("/generate")
    async def generate(body: GenerateRequest, http_request: Request):
        prompt_ids = await state.token_ids(body.prompt)
        room = state.require_engine().engine.max_model_len - len(prompt_ids)
        stream = state.submit([prompt_ids], [body.sampling_params(state.config.sampling_defaults, room)],
                              new_request_id("gen"))
        deltas = state.outputs(http_request, stream)
        if body.stream:
            return StreamingResponse(_generate_events(stream, deltas), media_type="text/event-stream")
        async for _ in deltas:
            pass
        return _generate_response(stream.requests[0].output())

    return app


def _unready_status(state: ServerState) -> str:
    if state.shutting_down:
        return "shutting_down"
    return "failed" if state.load_error else "loading"


def _generate_response(out: RequestOutput) -> dict:
    return {"request_id": out.request_id, "generated_text": out.text, "tokens": out.token_ids,
            "total_tokens": len(out.prompt_token_ids) + len(out.token_ids), "prompt_tokens": len(out.prompt_token_ids),
            "finish_reason": out.finish_reason}


async def _generate_events(stream: RequestStream, deltas: AsyncIterator[RequestDelta]) -> AsyncIterator[str]:
    """SSE: one event per new piece of text ({"request_id", "text", "tokens", "finish_reason"}), then the whole
    response as the last event, then [DONE]."""
    request = stream.requests[0]
    try:
        async for delta in deltas:
            yield sse_event({"request_id": request.request_id, "text": delta.text, "tokens": delta.token_ids,
                             "finish_reason": delta.finish_reason})
            if delta.finished:
                yield sse_event(_generate_response(request.output()))
    except Exception as e:  # the engine failed this request: tell the client in the stream
        yield sse_error(str(e))
    yield SSE_DONE
