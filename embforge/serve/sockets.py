"""Connection guard for uvicorn: deadlines for a request's head and body, and a cap on open connections.

uvicorn closes idle kept-alive connections (``timeout_keep_alive``) and can answer 503 past a number of
concurrent requests (``limit_concurrency``), but a client that connects and trickles its headers a byte at a time
(slowloris), or never sends its body, holds a socket and a file descriptor for as long as it likes, and
``limit_concurrency`` counts only connections that finished a request head. :func:`guarded_protocol` subclasses
uvicorn's own HTTP protocol (httptools, else h11) with three small additions:

- a request's head must be complete within ``header_timeout_s`` of the connection (or of the request's first byte
  on a kept-alive connection), else ``408`` and close — bytes arriving meanwhile do not extend the deadline;
- its body must be complete within ``body_timeout_s`` of the head, else the connection is closed (the app sees a
  disconnect);
- a connection beyond ``max_connections`` open ones is answered ``503`` and closed at once.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


def _response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps(
        {"error": {"message": message, "type": "timeout", "param": None, "code": None}}
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Guard:
    """The deadline logic shared by both protocol subclasses (a mixin; attributes come from uvicorn)."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_connections = 1024
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set[Any]
    _guard_timer: asyncio.TimerHandle | None = None
    _guard_phase = "head"

    def _arm(self, phase: str, seconds: float) -> None:
        self._disarm()
        self._guard_phase = phase
        self._guard_timer = self.loop.call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._guard_timer is not None:
            self._guard_timer.cancel()
            self._guard_timer = None

    def _expire(self) -> None:
        self._guard_timer = None
        if self.transport.is_closing():
            return
        if self._guard_phase == "head":
            message = f"the request head did not arrive within {self.header_timeout_s:g} s"
            self.transport.write(_response(408, "Request Timeout", message))
        self.transport.close()  # in the body phase the app is reading: it gets a disconnect

    # uvicorn's protocol comes next in the subclasses' MRO: these wrap its callbacks
    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._admit(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _admit(self, transport: asyncio.Transport) -> bool:
        """Whether a new connection may stay; the one over the cap gets a 503 and is closed."""
        if len(self.connections) > self.max_connections:
            message = f"the server has {self.max_connections} open connections, its limit; retry later"
            transport.write(_response(503, "Service Unavailable", message))
            transport.close()
            return False
        self._arm("head", self.header_timeout_s)
        return True


def _httptools_guard(base: type) -> type:
    class GuardedHttpToolsProtocol(_Guard, base):  # type: ignore[misc, valid-type]
        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._guard_timer is None:  # a new request on a kept-alive connection
                self._arm("head", self.header_timeout_s)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm("body", self.body_timeout_s)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

    return GuardedHttpToolsProtocol


def _h11_guard(base: type) -> type:
    import h11

    class GuardedH11Protocol(_Guard, base):  # type: ignore[misc, valid-type]
        def handle_events(self) -> None:
            super().handle_events()
            state = self.conn.their_state
            if state is h11.SEND_BODY and self._guard_phase != "body":
                self._arm("body", self.body_timeout_s)
            elif state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
                self._disarm()
                self._guard_phase = "done"
            elif state is h11.IDLE and self.conn.trailing_data[0] and self._guard_timer is None:
                self._arm("head", self.header_timeout_s)

    return GuardedH11Protocol


def guarded_protocol(*, header_timeout_s: float, body_timeout_s: float, max_connections: int) -> type:
    """A uvicorn HTTP protocol class (pass it as ``uvicorn.Config(http=...)``) with the guard's settings."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        cls = _httptools_guard(HttpToolsProtocol)
    except ImportError:  # httptools not installed: uvicorn's pure-Python h11 protocol
        from uvicorn.protocols.http.h11_impl import H11Protocol

        cls = _h11_guard(H11Protocol)
    settings = {
        "header_timeout_s": header_timeout_s,
        "body_timeout_s": body_timeout_s,
        "max_connections": max_connections,
    }
    return type(cls.__name__, (cls,), settings)
