"""Server-sent events as OpenAI streams them: `data: <json>` lines, closed by `data: [DONE]`."""

import json

SSE_DONE = "data: [DONE]\n\n"


def sse_event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
