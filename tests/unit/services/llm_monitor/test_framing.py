"""The proxy's request framing under hostile input: no request smuggled, no valid request lost.

A client pipelines valid requests, then at most one hostile one, then more valid requests, on
one connection. Ollama (a recording echo server) must see exactly the valid requests before the
hostile one, byte for byte; the client must get their answers in order, then a 4xx (501 for an
unimplemented transfer coding) that closes the connection, and nothing after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.llm_monitor.proxy import DEFAULT_ALLOW, MAX_HEAD, READ_SIZE, OllamaProxy

MAX_BODY = 4096
ECHO = [
    *DEFAULT_ALLOW,
    "GET /echo/*",
    "POST /echo/*",
    "POST /smuggled",
    "GET /smuggled",
]  # and what the recording echo server answers


@dataclass(frozen=True)
class Wire:
    raw: bytes
    target: bytes = b""  # what Ollama must see of a valid request
    body: bytes = b""
    refused_with: frozenset[int] = frozenset()  # a hostile request: the statuses it may get
    last: bool = False  # nothing can follow it (a body cut short by the end of the stream)


def _head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method, target), b"Host: ollama"]
    lines += [b"%s: %s" % (n, v) for n, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _chunked(parts: list[bytes], extension: bytes = b"") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in parts if p) + b"0\r\n\r\n"


names = st.sampled_from([b"Accept", b"X-Trace", b"User-Agent", b"Content-Type", b"X-Empty"])
values = st.binary(max_size=40).map(lambda b: bytes(c for c in b if 0x21 <= c <= 0x7E))
extra_headers = st.lists(st.tuples(names, values), max_size=4)


@st.composite
def valid_requests(draw: st.DrawFn, i: int) -> Wire:
    target = b"/echo/%d?q=%d" % (i, draw(st.integers(0, 99)))
    headers = draw(extra_headers)
    if draw(st.booleans()):
        return Wire(_head(b"GET", target, headers), target)
    body = draw(st.binary(max_size=MAX_BODY))
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        extension = draw(st.sampled_from([b"", b";x=1", b';name="v"']))
        framing = _chunked(parts, extension)
        return Wire(
            _head(b"POST", target, [*headers, (b"Transfer-Encoding", b"chunked")]) + framing, target, body
        )
    return Wire(
        _head(b"POST", target, [*headers, (b"Content-Length", b"%d" % len(body))]) + body, target, body
    )


def _garbage_length(draw: st.DrawFn) -> bytes:
    digits = draw(st.text("0123456789", max_size=3))
    bad = draw(st.sampled_from("abxz+-.;/_=\"'"))
    tail = draw(st.text("0123456789ab+-. ", max_size=3)).strip()
    return (digits + bad + tail).encode()


@st.composite
def hostile_requests(draw: st.DrawFn) -> Wire:
    kind = draw(
        st.sampled_from(
            [
                "length and chunked",
                "garbage length",
                "conflicting lengths",
                "overlong length",
                "body too big",
                "unknown coding",
                "bad chunk size",
                "chunk longer than its size",
                "oversized head",
                "garbage request line",
                "cut short",
            ]
        )
    )
    target = b"/smuggled"
    chunk = _chunked([b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"])
    if kind == "length and chunked":
        headers = [(b"Content-Length", b"%d" % draw(st.integers(0, 80))), (b"Transfer-Encoding", b"chunked")]
        if draw(st.booleans()):
            headers.reverse()
        return Wire(_head(b"POST", target, headers) + chunk, refused_with=frozenset({400}))
    if kind == "garbage length":
        return Wire(
            _head(b"POST", target, [(b"Content-Length", _garbage_length(draw))]),
            refused_with=frozenset({400}),
        )
    if kind == "conflicting lengths":
        a, b = draw(st.lists(st.integers(0, 50), min_size=2, max_size=2, unique=True))
        headers = (
            [(b"Content-Length", b"%d" % a), (b"Content-Length", b"%d" % b)]
            if draw(st.booleans())
            else [(b"Content-Length", b"%d, %d" % (a, b))]
        )
        return Wire(_head(b"POST", target, headers) + b"x" * 50, refused_with=frozenset({400}))
    if kind == "overlong length":
        return Wire(
            _head(b"POST", target, [(b"Content-Length", b"1" * draw(st.integers(21, 60)))]),
            refused_with=frozenset({400}),
        )
    if kind == "body too big":
        length = draw(st.integers(MAX_BODY + 1, 10**15))
        return Wire(
            _head(b"POST", target, [(b"Content-Length", b"%d" % length)]), refused_with=frozenset({413})
        )
    if kind == "unknown coding":
        coding = draw(
            st.sampled_from(
                [b"gzip", b"chunked, gzip", b"gzip, chunked", b"identity", b"chunkedx", b"chunked, chunked"]
            )
        )
        headers = [(b"Transfer-Encoding", coding)]
        if draw(st.booleans()):
            headers = [(b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", coding)]
        return Wire(_head(b"POST", target, headers) + chunk, refused_with=frozenset({501}))
    if kind == "bad chunk size":
        size_line = draw(st.sampled_from([b"zz", b"-1", b"0x5", b"", b"+5", b"5 5", b"1" * 21, b"g"]))
        body = b"%s\r\nabcde\r\n0\r\n\r\n" % size_line
        return Wire(
            _head(b"POST", target, [(b"Transfer-Encoding", b"chunked")]) + body, refused_with=frozenset({400})
        )
    if kind == "chunk longer than its size":
        size = draw(st.integers(1, 20))
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (size, b"y" * (size + draw(st.integers(1, 5))))
        return Wire(
            _head(b"POST", target, [(b"Transfer-Encoding", b"chunked")]) + body, refused_with=frozenset({400})
        )
    if kind == "oversized head":
        # h11 refuses a head still incomplete with MAX_HEAD buffered; one read more may complete it
        big = MAX_HEAD + READ_SIZE + draw(st.integers(1, 4096))
        return Wire(_head(b"GET", target, [(b"X-Big", b"a" * big)]), refused_with=frozenset({431}))
    if kind == "garbage request line":
        line = draw(
            st.sampled_from(
                [
                    b"NONSENSE",
                    b"GET /x HTTP/1",
                    b"GET  /x HTTP/1.1",
                    b"G\x00T /x HTTP/1.1",
                    b"GET /x\x7f HTTP/1.1",
                ]
            )
        )
        return Wire(line + b"\r\nHost: x\r\n\r\n", refused_with=frozenset({400, 505}))
    # cut short: the stream ends inside the declared body
    length = draw(st.integers(2, 200))
    sent = draw(st.integers(0, length - 1))
    if draw(st.booleans()):
        raw = _head(b"POST", target, [(b"Content-Length", b"%d" % length)]) + b"z" * sent
    else:
        raw = (
            _head(b"POST", target, [(b"Transfer-Encoding", b"chunked")]) + (b"%x\r\n" % length) + b"z" * sent
        )
    return Wire(raw, refused_with=frozenset({400}), last=True)


@st.composite
def pipelines(draw: st.DrawFn, hostile: bool) -> list[Wire]:
    n_before = draw(st.integers(0 if hostile else 1, 4))
    wires = [draw(valid_requests(i)) for i in range(n_before)]
    if hostile:
        bad = draw(hostile_requests())
        wires.append(bad)
        if not bad.last:
            wires += [draw(valid_requests(100 + i)) for i in range(draw(st.integers(0, 2)))]
    return wires


class RecordingOllama:
    """Answers every request with its target and body length; keeps what it saw, in order, and
    any request whose framing the proxy should not have sent (a Transfer-Encoding, two lengths)."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, bytes]] = []
        self.misframed: list[h11.Request] = []

    async def _event(
        self, http: h11.Connection, reader: asyncio.StreamReader
    ) -> h11.Event | type[h11.PAUSED]:
        while (event := http.next_event()) is h11.NEED_DATA:
            http.receive_data(await reader.read(65536))
        return event  # type: ignore[return-value]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        http = h11.Connection(h11.SERVER)
        try:
            while isinstance(request := await self._event(http, reader), h11.Request):
                framing = [n for n, _ in request.headers if n in (b"content-length", b"transfer-encoding")]
                if framing not in ([], [b"content-length"]):
                    self.misframed.append(request)
                body = bytearray()
                while isinstance(part := await self._event(http, reader), h11.Data):
                    body += part.data
                self.seen.append((request.target, bytes(body)))
                answer = json.dumps({"target": request.target.decode(), "length": len(body)}).encode()
                head = h11.Response(status_code=200, headers=[(b"Content-Length", b"%d" % len(answer))])
                writer.write(
                    http.send(head) + http.send(h11.Data(data=answer)) + http.send(h11.EndOfMessage())
                )
                await writer.drain()
                http.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError):
            pass
        finally:
            writer.close()


def _answers(wire: bytes) -> tuple[list[tuple[int, bytes, bytes]], bool]:
    """(status, body, Connection header) of each answer in `wire`, and whether it ended cleanly."""
    http = h11.Connection(h11.CLIENT)
    http.receive_data(wire)
    http.receive_data(b"")
    answers: list[tuple[int, bytes, bytes]] = []
    while True:
        if http.trailing_data == (b"", True):
            return answers, True
        http.send(h11.Request(method=b"GET", target=b"/", headers=[(b"Host", b"p")]))
        http.send(h11.EndOfMessage())
        event = http.next_event()
        assert isinstance(event, h11.Response), event
        body = bytearray()
        while isinstance(part := http.next_event(), h11.Data):
            body += part.data
        assert isinstance(part, h11.EndOfMessage), part
        answers.append((event.status_code, bytes(body), dict(event.headers).get(b"connection", b"")))
        if http.our_state is not h11.DONE or http.their_state is not h11.DONE:
            return answers, http.trailing_data == (b"", True)
        http.start_next_cycle()


@contextlib.asynccontextmanager
async def _proxy_before(ollama: RecordingOllama) -> AsyncIterator[int]:
    """The proxy's port, with `ollama` behind it."""
    server = await asyncio.start_server(ollama.serve, "127.0.0.1", 0)
    proxy = OllamaProxy(
        upstream=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
        on_session=lambda s: None,
        monitor_id="t",
        max_body_bytes=MAX_BODY,
        allow=ECHO,
    )
    try:
        yield await proxy.start("127.0.0.1", 0)
    finally:
        await proxy.close()
        server.close()


async def _exchange(pipeline: list[Wire], pieces: list[int]) -> tuple[RecordingOllama, bytes]:
    ollama = RecordingOllama()
    async with _proxy_before(ollama) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        wire = b"".join(w.raw for w in pipeline)
        edges = [0, *sorted(p for p in pieces if p < len(wire)), len(wire)]
        try:
            for a, b in itertools.pairwise(edges):  # as the socket happens to split it
                writer.write(wire[a:b])
                await writer.drain()
            writer.write_eof()
        except ConnectionError:
            pass  # the proxy refused and closed before the client finished sending
        received = await reader.read()
        writer.close()
    return ollama, received


def _check(pipeline: list[Wire], ollama: RecordingOllama, received: bytes) -> None:
    hostile = next((i for i, w in enumerate(pipeline) if w.refused_with), None)
    valid = pipeline[:hostile]
    assert ollama.seen == [(w.target, w.body) for w in valid]  # nothing smuggled, nothing lost
    assert ollama.misframed == []
    answers, clean = _answers(received)
    assert clean
    for w, (status, body, _) in zip(valid, answers, strict=False):
        assert status == 200
        assert json.loads(body) == {"target": w.target.decode(), "length": len(w.body)}
    if hostile is None:
        assert len(answers) == len(valid)
        return
    assert len(answers) == len(valid) + 1  # the refusal, then nothing
    status, body, connection = answers[-1]
    assert status in pipeline[hostile].refused_with, (status, body)
    assert connection == b"close"
    assert json.loads(body)["error"]


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(pipeline=pipelines(hostile=True), pieces=st.lists(st.integers(0, 80_000), max_size=6))
def test_a_hostile_request_is_refused_and_closes_without_smuggling_or_losing_the_valid_ones(
    pipeline: list[Wire], pieces: list[int]
) -> None:
    ollama, received = asyncio.run(asyncio.wait_for(_exchange(pipeline, pieces), 30))
    _check(pipeline, ollama, received)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(pipeline=pipelines(hostile=False), pieces=st.lists(st.integers(0, 20_000), max_size=6))
def test_pipelined_valid_requests_are_all_relayed_in_order(pipeline: list[Wire], pieces: list[int]) -> None:
    ollama, received = asyncio.run(asyncio.wait_for(_exchange(pipeline, pieces), 30))
    _check(pipeline, ollama, received)


@pytest.mark.parametrize(
    "raw",
    [
        # the textbook CL.TE smuggle: a front end trusting Content-Length would pass "GET /smuggled" on
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        # TE.CL: one trusting Transfer-Encoding reads the chunk; one trusting the length, a request
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
        b"23\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n\r\n0\r\n\r\n",
        # an obfuscated coding a lenient parser would take for chunked
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: xchunked\r\n\r\n"
        b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        # a header folded over two lines (obsolete line folding)
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n"
        b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
        # a space before the colon
        b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n"
        b"0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
    ],
)
def test_the_known_smuggling_shapes_never_reach_ollama(raw: bytes) -> None:
    ollama, received = asyncio.run(
        asyncio.wait_for(_exchange([Wire(raw, refused_with=frozenset({400, 501}))], []), 30)
    )
    assert ollama.seen == []
    (answer,), clean = _answers(received)
    assert clean
    assert answer[0] in (400, 501)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"POST /api/generate HTTP/1.1\r\nHost: p\r\nContent-Length: x\r\n\r\n", 400),
        (b"POST /api/generate HTTP/1.1\r\nHost: p\r\nContent-Length: 99999999999\r\n\r\n", 413),
        (b"GET / HTTP/1.1\r\nHost: p\r\nbad header\r\n\r\n", 400),
        (b"POST /api/generate HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # RFC 9112 3.2: an HTTP/1.1 request names its Host
        (b"CONNECT ollama:11434 HTTP/1.1\r\nHost: ollama:11434\r\n\r\n", 405),
    ],
)
def test_malformed_requests_get_a_4xx(raw: bytes, status: int) -> None:
    pipeline = [Wire(raw, refused_with=frozenset({status}))]
    ollama, received = asyncio.run(asyncio.wait_for(_exchange(pipeline, []), 30))
    _check(pipeline, ollama, received)


def test_a_client_that_sends_expect_100_continue_gets_it_and_its_answer() -> None:
    async def main() -> tuple[list[tuple[bytes, bytes]], bytes]:
        ollama = RecordingOllama()
        async with _proxy_before(ollama) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                _head(b"POST", b"/echo/1", [(b"Content-Length", b"5"), (b"Expect", b"100-continue")])
            )
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(b"hello")
            writer.write_eof()
            final = await reader.read()
            writer.close()
        assert interim.startswith(b"HTTP/1.1 100 ")
        return ollama.seen, final

    seen, final = asyncio.run(asyncio.wait_for(main(), 30))
    assert seen == [(b"/echo/1", b"hello")]
    ((status, body, _),), _ = _answers(final)
    assert status == 200
    assert json.loads(body)["length"] == 5


def test_an_idle_client_connection_closed_between_requests_is_no_error() -> None:
    async def main() -> bytes:
        proxy = OllamaProxy(upstream="http://127.0.0.1:9", on_session=lambda s: None, monitor_id="t")
        port = await proxy.start("127.0.0.1", 0)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.shutdown(socket.SHUT_WR)
            got = await asyncio.get_running_loop().run_in_executor(None, sock.recv, 100)
        await proxy.close()
        return got

    assert asyncio.run(asyncio.wait_for(main(), 30)) == b""
