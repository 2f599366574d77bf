"""A transparent HTTP/1.1 proxy in front of Ollama that measures each generate/chat request.

HTTP/1.1 framing, on both sides, is h11's (the state machine under httpx and
uvicorn): requests from clients are parsed by an h11 server connection, and
each kept-alive connection to Ollama is an h11 client connection. A request
with both Content-Length and Transfer-Encoding, a bad length, a bad chunk,
an oversized head or a body cut short gets a 4xx (501 for a transfer coding
other than chunked) and the connection is closed, so no two parsers can
disagree on where a request ends. A streamed answer's payload goes to the
client as soon as a read from Ollama brings it, re-framed as one chunk per
read, while a copy feeds the request's SessionMeter. Requests other than POST
/api/generate and /api/chat are relayed without measuring.

A narrow door: only the methods and paths of `allow` are relayed (Ollama's inference and
read-only endpoints by default: no /api/pull, /api/delete, /api/create, /api/push, /api/copy);
anything else is a 403 that closes the connection. A request's head must arrive within
`head_timeout_s` of the connection opening (or of the previous answer) and its body within
`body_timeout_s` of its head, else 408 (an idle kept-alive connection is just closed);
past `max_connections` at once a new connection gets a 503 and is closed. Over asyncio
streams rather than an HTTP framework, to add as little as it can to a
request (bench/bench_llm_proxy.py; docs/performance.md has the figures).
Ollama unreachable gets a 502 (and a failed session).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import h11

from shared.contract.models_workload import LlmSession

from .ollama_metrics import SessionMeter, request_facts

log = logging.getLogger(__name__)

MEASURED = {b"/api/generate": "/api/generate", b"/api/chat": "/api/chat"}
# Not forwarded: hop-by-hop, re-framed by h11 on the way out, or answered by the proxy itself (Expect).
_REQUEST_DROPPED = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"content-length",
        b"host",
        b"expect",
    }
)
_RESPONSE_DROPPED = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"trailer", b"upgrade"}
)
MAX_HEAD = 64 * 1024
# What Ollama serves that a client of a model needs: inference, embeddings, and what is loaded.
# Model management (pull, push, create, copy, delete, blobs) is the operator's, on Ollama itself.
DEFAULT_ALLOW = (
    "POST /api/generate",
    "POST /api/chat",
    "POST /api/embed",
    "POST /api/embeddings",
    "POST /api/show",
    "GET /api/tags",
    "GET /api/ps",
    "GET /api/version",
    "GET /",
    "HEAD /",
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/embeddings",
    "GET /v1/models",
    "GET /v1/models/*",
)
READ_SIZE = 65536
LINGER_S = 2.0
_DEADLINE: contextvars.ContextVar[asyncio.Timeout | None] = contextvars.ContextVar("deadline", default=None)


class BadRequestError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Allowed:
    """`METHOD /path` entries; a path ending in `*` allows what starts with what precedes it."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.exact: set[tuple[bytes, bytes]] = set()
        self.prefixes: list[tuple[bytes, bytes]] = []
        for entry in entries:
            method, _, path = entry.strip().partition(" ")
            if not method or not path.startswith("/"):
                raise ValueError(f"an allowed request is `METHOD /path`, not {entry!r}")
            key = (method.upper().encode(), path.encode())
            if path.endswith("*"):
                self.prefixes.append((key[0], key[1][:-1]))
            else:
                self.exact.add(key)

    def __contains__(self, request: tuple[bytes, bytes]) -> bool:
        method, target = request
        path = target.split(b"?", 1)[0]
        if b"/../" in path + b"/" or b"/./" in path + b"/" or b"%" in path or b"//" in path:
            return False  # no spelling of a path that Ollama could read as another
        if (method, path) in self.exact:
            return True
        return any(method == m and path.startswith(p) for m, p in self.prefixes)


class _Upstream:
    """One connection to Ollama with its h11 client state; `received` tells a stale kept-alive one."""

    __slots__ = ("http", "reader", "received", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.http = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self.received = 0


def _refusal(http: h11.Connection, status: int, message: str) -> bytes:
    """The bytes of a JSON error answer that closes the connection; none once an answer has begun."""
    body = json.dumps({"error": message}, separators=(",", ":")).encode()
    headers = [
        (b"Content-Type", b"application/json"),
        (b"Content-Length", b"%d" % len(body)),
        (b"Connection", b"close"),
    ]
    try:
        head = http.send(h11.Response(status_code=status, headers=headers, reason=b"Proxy Error"))
        return head + http.send(h11.Data(data=body)) + http.send(h11.EndOfMessage())
    except h11.LocalProtocolError:
        return b""


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refusal: bytes) -> None:
    """Send the refusal, then read what the client still sends for a moment before closing:
    closing with unread bytes makes the kernel reset the connection, and the client could lose the
    refusal it was sent."""
    with contextlib.suppress(ConnectionError, TimeoutError):
        writer.write(refusal)
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await reader.read(READ_SIZE):
                pass


class OllamaProxy:
    def __init__(
        self,
        *,
        upstream: str,
        on_session: Callable[[LlmSession], None],
        monitor_id: str,
        max_body_bytes: int = 8 * 1024 * 1024,
        upstream_timeout_s: float = 600.0,
        pool_size: int = 32,
        allow: Sequence[str] = DEFAULT_ALLOW,
        head_timeout_s: float = 10.0,
        body_timeout_s: float = 30.0,
        max_connections: int = 256,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, not {upstream!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.upstream, self.on_session, self.monitor_id = upstream.rstrip("/"), on_session, monitor_id
        self.max_body_bytes, self.timeout_s, self.pool_size = max_body_bytes, upstream_timeout_s, pool_size
        self.allowed = Allowed(allow)
        self.head_timeout_s, self.body_timeout_s = head_timeout_s, body_timeout_s
        self.max_connections, self.connections = max_connections, 0
        self._host_header = b"%s:%d" % (self.host.encode(), self.port)
        self._idle: list[_Upstream] = []
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._client, host, port)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)
        for up in self._idle:
            up.writer.close()
        self._idle.clear()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        if self.connections >= self.max_connections:  # refused at once, before any of its request is read
            busy = f"the proxy serves at most {self.max_connections} connections at once"
            await _linger(reader, writer, _refusal(http, 503, busy))
            writer.close()
            return
        self.connections += 1
        refusal = b""
        try:
            while await self._one(http, reader, writer):
                http.start_next_cycle()  # a pipelined request waits in h11's buffer
        except (ConnectionError, TimeoutError):
            pass
        except h11.ProtocolError as e:  # the client's framing (h11 says which status fits)
            refusal = _refusal(http, e.error_status_hint, str(e))
        except BadRequestError as e:
            refusal = _refusal(http, e.status, str(e))
        finally:
            self.connections -= 1
            if refusal:
                await _linger(reader, writer, refusal)
            writer.close()

    async def _request(
        self, http: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[h11.Request, bytes] | None:
        """The client's next request and its whole body; None once the client is done."""
        try:
            async with asyncio.timeout(self.head_timeout_s):
                event = await self._client_event(http, reader, writer)
        except TimeoutError:
            if http.trailing_data[0]:  # part of a head came, and no more
                raise BadRequestError(
                    408, f"the request head did not arrive within {self.head_timeout_s:g} s"
                ) from None
            return None  # an idle kept-alive connection: closed without a word
        if type(event) is not h11.Request:
            return None  # ConnectionClosed (h11 raises on anything else)
        if event.method == b"CONNECT":
            raise BadRequestError(405, "CONNECT is not proxied")
        has_length = has_chunked = False
        for name, value in event.headers:
            if name == b"content-length":
                has_length = True
                if int(value) > self.max_body_bytes:
                    raise BadRequestError(413, f"request body over {self.max_body_bytes} bytes")
            elif name == b"transfer-encoding":
                has_chunked = True
        if has_length and has_chunked:  # RFC 9112 6.1: the classic smuggling shape; refuse and close
            raise BadRequestError(400, "both Content-Length and Transfer-Encoding")
        if (event.method, event.target) not in self.allowed:
            asked = f"{event.method.decode('latin-1')} {event.target.decode('latin-1')[:200]}"
            raise BadRequestError(403, f"{asked} is not proxied (GPUHEALTH_LLM__PROXY_ALLOW)")
        body = bytearray()
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while type(part := await self._client_event(http, reader, writer)) is h11.Data:
                    body += part.data
                    if len(body) > self.max_body_bytes:
                        raise BadRequestError(413, f"request body over {self.max_body_bytes} bytes")
        except TimeoutError:
            raise BadRequestError(
                408, f"the request body did not arrive within {self.body_timeout_s:g} s"
            ) from None
        return event, bytes(body)  # EndOfMessage: h11 raises on a body cut short

    async def _client_event(
        self, http: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> h11.Event:
        while (event := http.next_event()) is h11.NEED_DATA:
            if http.they_are_waiting_for_100_continue:
                writer.write(http.send(h11.InformationalResponse(status_code=100, headers=[])))
            http.receive_data(await reader.read(READ_SIZE))
        if not isinstance(event, h11.Event):  # PAUSED comes only between cycles, never asked for here
            raise h11.RemoteProtocolError("no request expected now")
        return event

    async def _one(
        self, http: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Relay one request and its answer; False when the client connection is done."""
        got = await self._request(http, reader, writer)
        if got is None:
            return False
        arrived = time.perf_counter()
        request, body = got
        method = request.method
        endpoint = MEASURED.get(request.target.split(b"?", 1)[0]) if method == b"POST" else None
        meter, streamed = None, True
        if endpoint is not None:
            model, streamed = request_facts(body)
            meter = SessionMeter(endpoint=endpoint, model=model, started=arrived)  # type: ignore[arg-type]
        headers = [(b"Host", self._host_header)]
        headers += [(n, v) for n, v in request.headers if n not in _REQUEST_DROPPED]
        if body or method in (b"POST", b"PUT", b"PATCH"):
            headers.append((b"Content-Length", b"%d" % len(body)))
        upstream_request = h11.Request(method=method, target=request.target, headers=headers)
        answered: list[int] = []  # the status, once the answer's head went to the client
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                _DEADLINE.set(deadline)  # per task: each client connection is its own task
                await self._relay(upstream_request, body, http, writer, meter, answered)
        except (OSError, ValueError, h11.ProtocolError) as e:
            if meter is not None:
                meter.error = f"upstream failed: {e}"[:500]
            if not answered:  # nothing sent yet: the client gets a clear 502
                writer.write(_refusal(http, 502, f"Ollama at {self.upstream} failed: {type(e).__name__} {e}"))
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
            return False  # mid-answer: closing is the only honest end
        finally:
            if meter is not None:
                meter.finish()
                self._record(meter, answered[0] if answered else 502, streamed)
        return http.our_state is h11.DONE and http.their_state is h11.DONE

    def _record(self, meter: SessionMeter, status: int, streamed: bool) -> None:
        try:
            session = meter.session(
                status=status,
                streamed=streamed,
                ended=time.perf_counter(),
                source="proxy",
                monitor_id=self.monitor_id,
                server=self.upstream,
            )
            self.on_session(session)
        except Exception:  # a measurement must never break the relay
            log.exception("session not recorded")

    async def _up_read(self, up: _Upstream) -> None:
        """One read from Ollama into its h11 connection, pushing the request's inactivity deadline
        on (cheaper than a wait_for per read)."""
        data = await up.reader.read(READ_SIZE)
        if (deadline := _DEADLINE.get()) is not None:
            deadline.reschedule(asyncio.get_running_loop().time() + self.timeout_s)
        up.received += len(data)
        up.http.receive_data(data)

    async def _up_event(self, up: _Upstream) -> h11.Event:
        """Ollama's next event, reading as much as it takes."""
        while (event := up.http.next_event()) is h11.NEED_DATA:
            await self._up_read(up)
        if not isinstance(event, h11.Event):
            raise h11.RemoteProtocolError("no answer expected now")
        return event

    async def _send(self, request: h11.Request, body: bytes) -> tuple[_Upstream, h11.Response]:
        """Send upstream and read the answer's head. A kept-alive connection Ollama has closed
        meanwhile fails before any answer: then the request goes once more on a fresh one."""
        while self._idle:
            up = self._idle.pop()
            if up.writer.is_closing() or up.reader.at_eof():
                up.writer.close()
                continue
            try:
                return up, await self._exchange(up, request, body)
            except (ConnectionError, h11.RemoteProtocolError):
                up.writer.close()
                if up.received:
                    raise  # Ollama answered something: not a stale connection
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 10)
        up = _Upstream(reader, writer)
        try:
            return up, await self._exchange(up, request, body)
        except BaseException:
            writer.close()
            raise

    async def _exchange(self, up: _Upstream, request: h11.Request, body: bytes) -> h11.Response:
        up.received = 0
        data = up.http.send(request)
        if body:
            data += up.http.send(h11.Data(data=body))
        up.writer.write(data + up.http.send(h11.EndOfMessage()))
        await up.writer.drain()
        while True:  # a 1xx (Ollama's own 100 Continue, say) is Ollama's business, not the client's
            event = await self._up_event(up)
            if type(event) is h11.Response:
                framing = {n for n, _ in event.headers if n in (b"content-length", b"transfer-encoding")}
                if len(framing) == 2:  # RFC 9112 6.3: "ought to be handled as an error"
                    raise h11.RemoteProtocolError("an answer with both Content-Length and Transfer-Encoding")
                return event
            if type(event) is not h11.InformationalResponse:
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} before the answer")

    async def _relay(
        self,
        request: h11.Request,
        body: bytes,
        http: h11.Connection,
        client: asyncio.StreamWriter,
        meter: SessionMeter | None,
        answered: list[int],
    ) -> None:
        """Send the request upstream and stream the answer back, noting its status in `answered`."""
        up, response = await self._send(request, body)
        try:
            headers = [(n, v) for n, v in response.headers if n not in _RESPONSE_DROPPED]
            head = h11.Response(status_code=response.status_code, headers=headers, reason=response.reason)
            payload: list[bytes] = []  # of one read from Ollama: one chunk to the client
            while True:
                event = up.http.next_event()
                if type(event) is h11.Data:
                    payload.append(event.data)
                    continue
                if event is not h11.NEED_DATA and type(event) is not h11.EndOfMessage:
                    raise h11.RemoteProtocolError(f"unexpected {event} in the answer")
                out = bytearray()  # a fresh one each time: the transport may still hold a view of the last
                if not answered:  # the head goes with the first read that framed well (else a 502)
                    out += http.send(head)
                    answered.append(response.status_code)
                if payload:
                    data = b"".join(payload)
                    payload.clear()
                    if meter is not None:
                        meter.feed(data)
                    out += http.send(h11.Data(data=data))
                if event is h11.NEED_DATA:
                    client.write(out)
                    if client.transport.get_write_buffer_size() > READ_SIZE:
                        await client.drain()
                    await self._up_read(up)
                else:
                    client.write(out + http.send(h11.EndOfMessage()))
                    break
            await client.drain()
        finally:
            if (
                up.http.our_state is h11.DONE
                and up.http.their_state is h11.DONE
                and len(self._idle) < self.pool_size
            ):
                up.http.start_next_cycle()
                self._idle.append(up)
            else:
                up.writer.close()
