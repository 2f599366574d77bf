"""The API's outermost layer: what a hostile request is refused before any of it is read or parsed.

In this order, each before the next costs anything:

1. a declared `Content-Length` above `max_body_bytes` (10^12 included) is a 413;
2. a request that could write (any method but GET, HEAD, OPTIONS) without the right
   `X-API-Key` is a 401 (403 when no key is configured), decided on the headers alone;
3. the body is then read here, counted as it arrives: more than `max_body_bytes`
   (a chunked body has no declared length) is a 413, a body not complete within
   `body_timeout_s` is a 408.

A refusal says `Connection: close`, so the server drops the rest of an unread body
instead of reading it. Only a body that passed all three reaches the application,
replayed from memory: FastAPI then parses at most `max_body_bytes`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Callable

from pydantic import SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class RefusalError(Exception):
    """A request refused before the application sees it: its status and the reason given."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def key_refusal(configured: SecretStr | None, presented: str | None) -> RefusalError | None:
    """Why `presented` may not write, or None when it is the configured key (compared in constant time)."""
    if configured is None:
        return RefusalError(403, "acknowledging is disabled: no API key is configured")
    expected = configured.get_secret_value().encode()
    if presented is None or not hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected):
        return RefusalError(401, "a valid X-API-Key header is required")
    return None


def _header(scope: Scope, name: bytes) -> list[bytes]:
    return [value for key, value in scope["headers"] if key.lower() == name]


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length; None when it has none. RefusalError(400) when it is not one number."""
    values = {v.strip() for v in _header(scope, b"content-length")}
    if not values:
        return None
    if len(values) > 1 or not next(iter(values)).isdigit():
        raise RefusalError(400, "Content-Length must be one non-negative integer")
    return int(next(iter(values)))


class RequestGuard:
    """ASGI middleware: body limit, key check and body deadline, before the application."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: SecretStr | None,
        max_body_bytes: int,
        body_timeout_s: float,
        on_refusal: Callable[[int], None] = lambda _status: None,
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.on_refusal = on_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            length = declared_length(scope)
            if length is not None and length > self.max_body_bytes:
                raise RefusalError(413, f"a request body may have at most {self.max_body_bytes} bytes")
            if scope["method"] not in SAFE_METHODS:
                keys = _header(scope, b"x-api-key")
                presented = keys[0].decode("latin-1") if len(keys) == 1 else None
                if refusal := key_refusal(self.api_key, presented):
                    raise refusal
            chunked = any(b"chunked" in v.lower() for v in _header(scope, b"transfer-encoding"))
            if not length and not chunked:
                await self.app(scope, receive, send)
                return
            body = await self._read_body(receive)
        except RefusalError as refusal:
            self.on_refusal(refusal.status)
            await refuse(send, refusal)
            return
        if body is None:  # the client went away
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        deadline = time.monotonic() + self.body_timeout_s
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                raise RefusalError(
                    408, f"the request body did not arrive within {self.body_timeout_s:g} s"
                ) from None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RefusalError(413, f"a request body may have at most {self.max_body_bytes} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that hands over the body already read, then defers to the server (disconnects)."""
    pending = [body]

    async def replayed() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await receive()

    return replayed


async def refuse(send: Send, refusal: RefusalError) -> None:
    payload = json.dumps({"detail": refusal.detail}).encode()
    await send({
        "type": "http.response.start",
        "status": refusal.status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close")],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": payload, "more_body": False})
