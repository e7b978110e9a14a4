"""uvicorn's HTTP/1.1 protocol (h11) with a deadline on each request's head: a client that opens a connection, or
starts a request, and does not finish its request line and headers within `header_timeout` seconds gets a 408 and
the connection is closed (nginx's client_header_timeout). uvicorn bounds only the idle time between requests; the
body has its own deadline (middleware.GuardMiddleware)."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body


class HeaderTimeoutProtocol(H11Protocol):
    header_timeout: float = 30.0

    _head_timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request begun (or none yet): its head is still to come
            self._await_head()
        else:
            self._cancel_head_timer()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        body = json.dumps(error_body(408, f"the request line and headers were not received within "
                                          f"{self.header_timeout:g} s")).encode()
        head = (f"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
                "connection: close\r\n\r\n").encode()
        self.transport.write(head + body)
        self.transport.close()
