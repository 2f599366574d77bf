"""uvicorn as the API runs it: a deadline on request headers, bounded headers and connections, exit 0.

uvicorn bounds the time between requests (keep-alive) but not the time a client
takes to send one: a connection that sends half a request line and stops would be
held for as long as the client likes. `GuardedH11Protocol` gives every request
`header_timeout_s` from the moment the connection opens, or the previous answer
goes out, to finish its headers; then it answers 408 and closes. The body's own
deadline is :class:`services.api.guard.RequestGuard`'s.

uvicorn re-raises SIGTERM after its graceful shutdown, so the process would end
with status 143; `ApiServer` shuts down the same way and returns, and `main()`
exits 0, as every service of the project does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from .settings import ApiSection

_TIMEOUT_BODY = b'{"detail":"the request headers did not arrive in time"}'
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_TIMEOUT_BODY)).encode() + b"\r\n\r\n" + _TIMEOUT_BODY
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        # The request whose answer started the current wait (None: the connection's first).
        self._waiting_after: RequestResponseCycle | None = None

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._waiting_after = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.cycle is not self._waiting_after:
            return
        self.logger.info("closing a connection whose request headers did not arrive in time")
        self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_timer is not None and self.cycle is not self._waiting_after:
            self._disarm_header_timer()  # a new request's headers are complete

    def on_response_complete(self) -> None:
        answered = self.cycle
        super().on_response_complete()
        # Unless a pipelined request already came in whole, the next one's headers are awaited.
        if not self.transport.is_closing() and self.cycle is answered:
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)


class ApiServer(uvicorn.Server):
    """uvicorn.Server that stops gracefully on SIGTERM/SIGINT and returns instead of re-raising them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class ApiLoop:
    """The server in the shape of every service's loop: `run(stop)` serves until `stop` is set.

    SIGTERM/SIGINT still go to uvicorn while it serves (ApiServer.capture_signals): it stops
    accepting and finishes the requests in flight.
    """

    def __init__(self, server: ApiServer) -> None:
        self.server = server

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self._exit_on, args=(stop,), name="api-stop", daemon=True).start()
        self.server.run()

    def _exit_on(self, stop: threading.Event) -> None:
        stop.wait()
        self.server.should_exit = True


def api_server(
    app: Any, api: ApiSection, *, host: str | None = None, port: int | None = None, shutdown_s: float = 20.0
) -> ApiServer:
    """The server for `app` with the limits of `api` (host/port override api.bind/api.port).

    On SIGTERM the requests in flight get half of `shutdown_s` (the shutdown deadline,
    GPUHEALTH_SHUTDOWN__TIMEOUT_S) to finish; the rest is for closing the pools."""
    protocol = type("ApiH11Protocol", (GuardedH11Protocol,), {"header_timeout_s": api.header_timeout_s})
    config = uvicorn.Config(
        app,
        host=host or api.bind,
        port=api.port if port is None else port,
        http=protocol,
        ws="none",
        lifespan="on",
        log_config=None,
        access_log=False,
        h11_max_incomplete_event_size=api.max_header_bytes,
        limit_concurrency=api.max_connections,
        timeout_graceful_shutdown=max(1, int(shutdown_s / 2)),
        ssl_certfile=str(api.tls_cert_file) if api.tls_cert_file else None,
        ssl_keyfile=str(api.tls_key_file) if api.tls_key_file else None,
    )
    return ApiServer(config)
