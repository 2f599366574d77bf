"""A transparent HTTP/1.1 proxy in front of Ollama that measures each generate/chat request.

Bytes go through as they arrive: a streamed answer's chunks (NDJSON in
chunked transfer encoding) are written to the client the moment each chunk
is read from Ollama, framing and all, while a copy of the payload feeds the
request's SessionMeter. Requests other than POST /api/generate and /api/chat
are relayed without measuring. Connections to Ollama are kept alive and
reused. It is asyncio over raw streams rather than an HTTP framework: the
proxy must add well under a millisecond per request (bench/bench_llm_proxy.py).
A bad request gets a 4xx; Ollama unreachable gets a 502 (and a failed session).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from shared.models_workload import LlmSession

from .chunked import ChunkedDecoder, ChunkedError
from .ollama_metrics import SessionMeter, request_facts

log = logging.getLogger(__name__)

MEASURED = {b"/api/generate": "/api/generate", b"/api/chat": "/api/chat"}
_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"transfer-encoding",
    b"te",
    b"upgrade",
    b"content-length",
    b"host",
}
MAX_HEAD = 64 * 1024
_DEADLINE: contextvars.ContextVar[asyncio.Timeout | None] = contextvars.ContextVar("deadline", default=None)


class BadRequestError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


Headers = list[tuple[bytes, bytes]]


def _parse_head(head: bytes) -> tuple[bytes, Headers]:
    lines = head.split(b"\r\n")
    headers: Headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise BadRequestError(400, "malformed header line")
        headers.append((name.lower(), value.strip()))
    return lines[0], headers


def _get(headers: Headers, name: bytes) -> bytes | None:
    return next((v for n, v in headers if n == name), None)


def _content_length(headers: Headers) -> int | None:
    raw = _get(headers, b"content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise BadRequestError(400, "bad Content-Length")
    return int(raw)


async def _read_chunked(reader: asyncio.StreamReader, limit: int) -> bytes:
    body = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError as e:
            raise BadRequestError(400, "bad chunk size") from e
        if size == 0:
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return bytes(body)
        if len(body) + size > limit:
            raise BadRequestError(413, f"request body over {limit} bytes")
        body += await reader.readexactly(size)
        await reader.readexactly(2)


class OllamaProxy:
    def __init__(
        self,
        *,
        upstream: str,
        on_session: Callable[[LlmSession], None],
        monitor_id: str,
        max_body_bytes: int = 64 * 1024 * 1024,
        upstream_timeout_s: float = 600.0,
        pool_size: int = 32,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http:// URL, not {upstream!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.upstream, self.on_session, self.monitor_id = upstream.rstrip("/"), on_session, monitor_id
        self.max_body_bytes, self.timeout_s, self.pool_size = max_body_bytes, upstream_timeout_s, pool_size
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        self.server = await asyncio.start_server(self._client, host, port, limit=MAX_HEAD)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        except BadRequestError as e:
            await self._reply(writer, e.status, str(e))
        finally:
            writer.close()

    async def _reply(self, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        body = ('{"error":"' + message.replace('"', "'") + '"}').encode()
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, b"Proxy Error", len(body), body)
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Relay one request and its answer; False when the client connection is done."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        arrived = time.perf_counter()
        request_line, headers = _parse_head(head[:-4])
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise BadRequestError(400, "malformed request line")
        method, target, version = parts
        if _get(headers, b"transfer-encoding") is not None:
            body = await _read_chunked(reader, self.max_body_bytes)
        else:
            length = _content_length(headers) or 0
            if length > self.max_body_bytes:
                raise BadRequestError(413, f"request body over {self.max_body_bytes} bytes")
            body = await reader.readexactly(length)
        connection = (_get(headers, b"connection") or b"").lower()
        keep_alive = connection != b"close" and (version == b"HTTP/1.1" or connection == b"keep-alive")
        endpoint = MEASURED.get(target.split(b"?", 1)[0]) if method == b"POST" else None
        meter, streamed = None, True
        if endpoint is not None:
            model, streamed = request_facts(body)
            meter = SessionMeter(endpoint=endpoint, model=model, started=arrived)  # type: ignore[arg-type]
        out = bytearray(
            b"%s %s HTTP/1.1\r\nHost: %s:%d\r\n" % (method, target, self.host.encode(), self.port)
        )
        for name, value in headers:
            if name not in _HOP:
                out += b"%s: %s\r\n" % (name, value)
        out += (
            b"Content-Length: %d\r\n\r\n" % len(body)
            if body or method in (b"POST", b"PUT", b"PATCH")
            else b"\r\n"
        )
        out += body
        answered: list[int] = []  # the status, once the answer's head went to the client
        try:
            async with asyncio.timeout(self.timeout_s) as deadline:
                _DEADLINE.set(deadline)  # per task: each client connection is its own task
                await self._relay(bytes(out), method, writer, meter, keep_alive, answered)
        except (
            OSError,
            ValueError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            BadRequestError,
        ) as e:
            if meter is not None:
                meter.error = f"upstream failed: {e}"[:500]
            if not answered:  # nothing sent yet: the client gets a clear 502
                await self._reply(writer, 502, f"Ollama at {self.upstream} failed: {type(e).__name__} {e}")
            keep_alive = False  # mid-answer: closing is the only honest end
        finally:
            if meter is not None:
                meter.finish()
                self._record(meter, answered[0] if answered else 502, streamed)
        return keep_alive

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

    async def _read(self, up: asyncio.StreamReader, size: int) -> bytes:
        """One read, pushing the request's inactivity deadline on (cheaper than a wait_for per read)."""
        data = await up.read(size)
        if (deadline := _DEADLINE.get()) is not None:
            deadline.reschedule(asyncio.get_running_loop().time() + self.timeout_s)
        return data

    async def _send(self, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
        """Send upstream and read the answer's head. A kept-alive connection Ollama has closed
        meanwhile fails before any answer: then the request goes once more on a fresh one."""
        while self._idle:
            reader, writer = self._idle.pop()
            if writer.is_closing() or reader.at_eof():
                writer.close()
                continue
            try:
                writer.write(request)
                await writer.drain()
                return reader, writer, await reader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=MAX_HEAD), 10
        )
        try:
            writer.write(request)
            await writer.drain()
            return reader, writer, await reader.readuntil(b"\r\n\r\n")
        except BaseException:
            writer.close()
            raise

    async def _relay(
        self,
        request: bytes,
        method: bytes,
        client: asyncio.StreamWriter,
        meter: SessionMeter | None,
        client_keep_alive: bool,
        answered: list[int],
    ) -> None:
        """Send the request upstream and stream the answer back, noting its status in `answered`."""
        up_reader, up_writer, head = await self._send(request)
        reusable = False
        try:
            status_line, headers = _parse_head(head[:-4])
            status = int(status_line.split(b" ", 2)[1])
            out = bytearray(status_line + b"\r\n")
            for name, value in headers:
                if name not in (b"connection", b"keep-alive"):
                    out += b"%s: %s\r\n" % (name, value)
            out += b"Connection: %s\r\n\r\n" % (b"keep-alive" if client_keep_alive else b"close")
            client.write(bytes(out))
            answered.append(status)
            chunked = (_get(headers, b"transfer-encoding") or b"").lower() == b"chunked"
            length = _content_length(headers)
            if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
                reusable = True
            elif chunked:
                await self._chunks(up_reader, client, meter)
                reusable = True
            elif length is not None:
                await self._exactly(up_reader, client, meter, length)
                reusable = True
            else:
                while data := await self._read(up_reader, 65536):
                    client.write(data)
                    if meter is not None:
                        meter.feed(data)
                    await client.drain()
            await client.drain()
            reusable = reusable and (_get(headers, b"connection") or b"").lower() != b"close"
        finally:
            if reusable and len(self._idle) < self.pool_size:
                self._idle.append((up_reader, up_writer))
            else:
                up_writer.close()

    async def _chunks(
        self, up: asyncio.StreamReader, client: asyncio.StreamWriter, meter: SessionMeter | None
    ) -> None:
        """Forward every read as it comes; the decoder finds the payload and the end of the body."""
        decoder = ChunkedDecoder()
        while not decoder.done:
            data = await self._read(up, 65536)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            payload, used = decoder.feed(data)
            if used < len(data):
                raise ChunkedError("bytes after the end of a chunked body")
            client.write(data)
            if meter is not None and payload:
                meter.feed(payload)
            if client.transport.get_write_buffer_size() > 65536:
                await client.drain()

    async def _exactly(
        self, up: asyncio.StreamReader, client: asyncio.StreamWriter, meter: SessionMeter | None, length: int
    ) -> None:
        left = length
        while left > 0:
            data = await self._read(up, min(left, 65536))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            client.write(data)
            if meter is not None:
                meter.feed(data)
            await client.drain()
