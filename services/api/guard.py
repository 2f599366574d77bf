"""The API's outermost layer: what a hostile request is refused before any of it is read or parsed.

In this order, each before the next costs anything:

1. a declared `Content-Length` above `max_body_bytes` (10^12 included) is a 413;
2. a method the path does not take is a 405 naming those it does in `Allow` (TRACE included);
   `OPTIONS` is answered here, 204 with `Allow`, for every path;
3. any request but to the public paths (health, metrics, the page's shell, the OpenAPI document)
   needs a bearer token (services.api.auth): none, or one refused, is a 401; a client address
   refused too often is a 429 before its token is looked at; a write (POST) needs at least the
   operator role, else 403 (the route then asks for its own role). Reads may carry the token in
   the page's cookie, writes only in `Authorization`. All decided on the headers alone;
4. the body is then read here, counted as it arrives: more than `max_body_bytes`
   (a chunked body has no declared length) is a 413, a body not complete within
   `body_timeout_s` is a 408.

A refusal says `Connection: close`, so the server drops the rest of an unread body
instead of reading it. Only a body that passed all of these reaches the application,
replayed from memory: FastAPI then parses at most `max_body_bytes`. The caller's Identity
is left in the request's scope (`IDENTITY`) for the routes' role checks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from http.cookies import CookieError, SimpleCookie

from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import COOKIE, Authenticator, AuthError, Identity

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
IDENTITY = "gpuhealth.identity"  # the scope key the verified caller is left under
PUBLIC_PATHS = frozenset(
    {"/healthz", "/readyz", "/metrics", "/favicon.ico", "/openapi.json", "/docs", "/login", "/logout", "/"}
)
PUBLIC_PREFIXES = ("/static/",)


class RefusalError(Exception):
    """A request refused before the application sees it: its status, the reason given, extra headers."""

    def __init__(self, status: int, detail: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = list(headers)


def is_public(path: str) -> bool:
    """Health, metrics, the OpenAPI document and the page's static shell: served to anyone."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


ROUTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
COMMON_METHODS = frozenset({"GET", "HEAD", "POST"})  # the router itself answers these


def path_methods(routes: Iterable[BaseRoute], path: str) -> frozenset[str] | None:
    """Every method some route takes at `path`; None where no route has it, or a mount decides."""
    methods: set[str] = set()
    for method in ROUTED_METHODS:
        scope = {
            "type": "http",
            "path": path,
            "method": method,
            "root_path": "",
            "headers": [],
            "query_string": b"",
        }
        for route in routes:
            if route.matches(scope)[0] is Match.FULL:
                if isinstance(route, Mount):
                    return None
                methods.add(method)
                break
    return frozenset(methods) if methods else None


def allow(methods: frozenset[str]) -> tuple[bytes, bytes]:
    return b"allow", ", ".join(sorted(methods | {"OPTIONS"})).encode()


def bearer(scope: Scope, *, cookie_too: bool) -> str | None:
    """The request's bearer token: `Authorization: Bearer`, else (reads) the page's cookie."""
    for value in _header(scope, b"authorization"):
        scheme, _, token = value.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    if cookie_too:
        for value in _header(scope, b"cookie"):
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except CookieError:
                continue
            if COOKIE in jar and jar[COOKIE].value:
                return jar[COOKIE].value
    return None


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


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
    """ASGI middleware: body limit, methods, authentication and body deadline, before the application."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        authenticator: Authenticator,
        routes: Callable[[], Iterable[BaseRoute]],
        max_body_bytes: int,
        body_timeout_s: float,
        on_refusal: Callable[[int], None] = lambda _status: None,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.routes = routes
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
            method, path = scope["method"], scope["path"]
            if method not in COMMON_METHODS and (methods := path_methods(self.routes(), path)) is not None:
                if method == "OPTIONS":
                    await answer(send, 204, b"", [allow(methods)])
                    return
                if method not in methods:
                    raise RefusalError(405, f"{path} takes {', '.join(sorted(methods))}", [allow(methods)])
            scope[IDENTITY] = await self._identity(scope, method, path)
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

    async def _identity(self, scope: Scope, method: str, path: str) -> Identity | None:
        """The verified caller; None on a public path without a good token. RefusalError otherwise."""
        public = is_public(path)
        client = client_address(scope)
        auth = self.authenticator
        if not public and (wait := auth.throttle.throttled_for(client)):
            auth.refused(client, "throttled")
            raise RefusalError(
                429,
                "too many refused requests from this address: try again later",
                [(b"retry-after", str(int(wait) + 1).encode())],
            )
        token = bearer(scope, cookie_too=method in SAFE_METHODS)
        try:
            if token is None:
                raise AuthError("missing", "a bearer token is required (Authorization: Bearer TOKEN)")
            identity = await auth.identity(token)
            if method not in SAFE_METHODS and not identity.may("operator"):
                raise AuthError("forbidden", f"{identity.role} may only read", 403)
        except AuthError as e:
            if public:
                return None
            auth.refused(client, e.reason)
            headers = [(b"www-authenticate", b'Bearer realm="gpu-health"')] if e.status == 401 else []
            raise RefusalError(e.status, e.detail, headers) from None
        return identity

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
    await answer(
        send,
        refusal.status,
        payload,
        [(b"content-type", b"application/json"), (b"connection", b"close"), *refusal.headers],
    )


async def answer(send: Send, status: int, payload: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload, "more_body": False})
