"""The request gate (body size, metrics, last-resort 500) and the JSON error format of the server.

:class:`Gatekeeper` is plain ASGI (no per-request task overhead): it reads the body up to
``max_body_bytes`` (413 beyond), records count, status and latency of every request for ``/metrics``, and turns an
unexpected exception into a JSON 500 *without* re-raising it, so the server keeps the connection alive (an
exception escaping the app makes uvicorn drop the kept-alive connection without ``Connection: close``).
The API key is checked by the routes' security dependency (:mod:`embforge.serve.auth`).
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from embforge.serve.config import ServeConfig
from embforge.serve.prometheus import Metrics

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_SURROGATE = re.compile("[\ud800-\udfff]")
log = logging.getLogger("embforge.serve")


class ApiError(Exception):
    """An error answered as ``{"error": {...}}`` with ``status``; ``param`` names the request field; ``headers`` are
    sent with it."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = dict(headers or {})


def error_body(
    message: str, param: str | None = None, kind: str = "invalid_request_error"
) -> dict[str, dict[str, str | None]]:
    """The OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def invalid_value(value: object, path: str) -> tuple[str, str] | None:
    """``(field, problem)`` of the first value in a parsed JSON body that cannot be served: a string with a lone
    surrogate (``"\\ud800"`` is valid JSON but not Unicode text; tokenizers and UTF-8 reject it) or a NaN/infinite
    number (Python's JSON parser accepts ``NaN``); ``None`` when all is well. ``path`` names ``value``."""
    if isinstance(value, str):
        found = _SURROGATE.search(value)
        if found:
            return path, (
                f"'{path}' has a lone surrogate (U+{ord(found.group()):04X} at character {found.start()}), "
                "which is not Unicode text; send UTF-8 text (a surrogate escape must come in a valid pair)"
            )
    elif isinstance(value, float) and not math.isfinite(value):
        return path, f"'{path}' is {value}; numbers must be finite"
    elif isinstance(value, dict):
        for key, item in value.items():
            name = ascii(key)[1:-1] if isinstance(key, str) and _SURROGATE.search(key) else key
            sub = f"{path}.{name}" if path else str(name)
            if isinstance(key, str) and _SURROGATE.search(key):
                return sub, f"the key '{sub}' has a lone surrogate, which is not Unicode text"
            found_item = invalid_value(item, sub)
            if found_item:
                return found_item
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found_item = invalid_value(item, f"{path}[{i}]")
            if found_item:
                return found_item
    return None


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "tuple", "none", "literal"}


def _is_type_tag(part: str) -> bool:
    """pydantic puts the member type of a union in the error location (``input.list[str].0``); drop it."""
    return part in _TYPE_TAGS or ("[" in part and not part.isdigit()) or part.startswith("function-")


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None]:
    """One readable message (every problem, with its field) and the first field, from pydantic's errors."""
    parts = []
    first: str | None = None
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p != "body" and not _is_type_tag(str(p))]
        field = ""
        for p in loc:
            field += f"[{p}]" if p.isdigit() else (f".{p}" if field else p)
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            parts.append(f"the body is not valid JSON ({ctx.get('error', 'parse error')})")
            continue
        first = first if first is not None else (field or None)
        parts.append(f"'{field or 'body'}': {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", first


async def _send_json(send: Send, status: int, body: Mapping[str, object]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class Gatekeeper:
    """ASGI middleware: body-size limit, request metrics, last-resort 500."""

    def __init__(self, app: ASGIApp, *, config: ServeConfig, metrics: Metrics, known_paths: set[str]) -> None:
        self.app = app
        self.config = config
        self.metrics = metrics
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        path = scope["path"] if scope["path"] in self.known_paths else "other"
        try:
            await self._handle(scope, receive, send_and_record)
        finally:
            self.metrics.observe_request(path, scope["method"], status[0], time.perf_counter() - started)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or [])
        limit = self.config.max_body_bytes
        declared = headers.get(b"content-length")
        too_big = error_body(f"the request body is larger than the limit of {limit} bytes", "body")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_json(send, 413, too_big)
            return
        chunks: list[bytes] = []
        size = 0
        more = scope["method"] in ("POST", "PUT", "PATCH")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _send_json(send, 413, too_big)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        started = False

        async def send_and_note(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, replay, send_and_note)
        except Exception as err:
            if started:  # too late for an error response: the connection has to go
                raise
            log.exception("error while serving %s", scope["path"])
            text = f"internal error while serving {scope['path']}: {type(err).__name__}: {err}"
            await _send_json(send, 500, error_body(text, None, "server_error"))
