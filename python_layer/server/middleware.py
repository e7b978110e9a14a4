"""One ASGI middleware for what every request must pass before routing: the API key (every route but
/health), a JSON content type on bodies, and a bound on the body size (checked while it is read, so a
chunked upload cannot get past it)."""

from __future__ import annotations

import hmac
import json
from typing import Optional

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body

_OPEN_PATHS = {"/health"}
_BODY_METHODS = {"POST", "PUT", "PATCH"}


class _BodyTooLarge(HTTPException):
    """Raised while the body is read: FastAPI passes HTTPExceptions through, the app answers 413."""


class GuardMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, api_key: Optional[str] = None) -> None:
        self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and scope["path"] not in _OPEN_PATHS:
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                return await _reply(send, 401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                    {"www-authenticate": "Bearer"})
        if scope["method"] not in _BODY_METHODS:
            return await self.app(scope, receive, send)
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            return await _reply(send, 415, f"the body must be JSON (Content-Type: application/json), got "
                                           f"'{media_type or 'none'}'")
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            return await _reply(send, 413, self._too_large())
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge(413, self._too_large())
            return message

        await self.app(scope, counting_receive, send)

    def _too_large(self) -> str:
        return f"the request body is larger than the limit of {self.max_body_bytes} bytes"


async def _reply(send: Send, status: int, message: str, extra_headers: Optional[dict] = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
