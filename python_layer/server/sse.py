"""Server-sent events as OpenAI streams them: `data: <json>` lines, closed by `data: [DONE]`."""

import json

from .errors import error_body

SSE_DONE = "data: [DONE]\n\n"


def sse_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def sse_error(message: str) -> str:
    """A request that failed after its stream started: the error in OpenAI's shape, as one event."""
    return sse_event(error_body(500, message))
