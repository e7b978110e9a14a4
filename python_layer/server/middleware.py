"""One ASGI middleware for what every request must pass before routing: the API key (every route but
/health), a JSON content type on bodies, a bound on the body size (checked while it is read, so a
chunked upload cannot get past it) and on the time a client may take to send it (408 after body_timeout
seconds without the rest of the body, so a half-sent body cannot hold a connection forever)."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Optional

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_body

_OPEN_PATHS = {"/health"}
_BODY_METHODS = {"POST", "PUT", "PATCH"}


class _BodyRefused(HTTPException):
    """Raised while the body is read: FastAPI passes HTTPExceptions through, the app answers 413 or 408."""


class GuardMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, api_key: Optional[str] = None,
                 body_timeout: float = 30.0) -> None:
        self.app, self.max_body_bytes, self.api_key, self.body_timeout = app, max_body_bytes, api_key, body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.api_key is not None and scope["path"] not in _OPEN_PATHS:
            scheme, _, key = headers.get("authorization", "").strip().partition(" ")
            # the scheme is case-insensitive (RFC 7235), the key is not
            if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
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
        received, more_body = 0, True
        deadline = asyncio.get_running_loop().time() + self.body_timeout  # for the whole body: no slow trickle

        async def counting_receive() -> Message:
            nonlocal received, more_body
            if not more_body:  # the body is in: the app now waits for a disconnect, for as long as it likes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                raise _BodyRefused(408, f"the request body was not received within {self.body_timeout:g} s") from None
            if message["type"] == "http.request":
                more_body = message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyRefused(413, self._too_large())
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
