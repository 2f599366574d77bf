"""The Ollama proxy: streaming kept chunk by chunk, bytes unchanged, sessions recorded, failures answered."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable

import h11
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.llm_monitor.proxy import OllamaProxy
from services.llm_monitor.servers import VllmScraper
from services.mock_ollama.server import MockOllamaServer
from shared.contract.models_workload import LlmSession
from tests.paths import DATA

GENERATE = (DATA / "ollama" / "generate-stream.ndjson").read_bytes()
Upstream = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _with_proxy(
    upstream: Upstream, body: Callable[[httpx.AsyncClient, list[LlmSession]], Awaitable[None]]
) -> None:
    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = server.sockets[0].getsockname()[1]
    sessions: list[LlmSession] = []
    proxy = OllamaProxy(upstream=f"http://127.0.0.1:{up_port}", on_session=sessions.append, monitor_id="t")
    port = await proxy.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            await body(client, sessions)
    finally:
        await proxy.close()
        server.close()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    return head + await reader.readexactly(length)


def test_chunks_reach_the_client_while_ollama_is_still_generating() -> None:
    lines = GENERATE.splitlines(keepends=True)

    async def main() -> None:
        release = asyncio.Event()

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await _read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            writer.write(b"%x\r\n%s\r\n" % (len(lines[0]), lines[0]))
            await writer.drain()
            await release.wait()  # the rest only once the client has the first chunk
            rest = b"".join(lines[1:])
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
            await writer.drain()
            writer.close()

        async def body(client: httpx.AsyncClient, sessions: list[LlmSession]) -> None:
            got = b""
            async with client.stream(
                "POST", "/api/generate", json={"model": "llama3.1:8b", "prompt": "why"}
            ) as r:
                async for data in r.aiter_raw():
                    if not got:
                        assert data == lines[0]  # the first token, before Ollama sent anything more
                        release.set()
                    got += data
            assert got == GENERATE  # byte for byte
            (s,) = sessions
            assert s.ok
            assert s.completion_tokens == 9
            assert s.ttft_ms is not None
            assert s.ttft_ms <= s.wall_ms
            assert s.tokens_per_s == pytest.approx(9 / 0.079104)

        await _with_proxy(upstream, body)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_other_endpoints_pass_through_unmeasured_and_connections_are_reused() -> None:
    async def main() -> None:
        connections = []

        async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(writer)
            while True:
                try:
                    request = await _read_request(reader)
                except asyncio.IncompleteReadError:
                    return
                payload = json.dumps({"echo": request.split(b"\r\n", 1)[0].decode()}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload))
                await writer.drain()

        async def body(client: httpx.AsyncClient, sessions: list[LlmSession]) -> None:
            for _ in range(5):
                r = await client.get("/api/ps?verbose=1")
                assert r.json() == {"echo": "GET /api/ps?verbose=1 HTTP/1.1"}
            r = await client.request("DELETE", "/api/delete", content=b'{"model":"x"}')
            assert r.status_code == 403  # model management is not proxied: the connection closes
            assert sessions == []
            assert len(connections) == 1

        await _with_proxy(upstream, body)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_ollama_unreachable_is_a_502_and_a_failed_session() -> None:
    async def main() -> None:
        sessions: list[LlmSession] = []
        proxy = OllamaProxy(upstream="http://127.0.0.1:9", on_session=sessions.append, monitor_id="t")
        port = await proxy.start("127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.post("/api/chat", json={"model": "m", "messages": []})
        await proxy.close()
        assert r.status_code == 502
        assert "failed" in r.json()["error"]
        (s,) = sessions
        assert not s.ok
        assert s.http_status == 502
        assert s.error is not None
        assert s.endpoint == "/api/chat"

    asyncio.run(asyncio.wait_for(main(), 30))


def test_through_the_mock_ollama_every_kind_of_request_is_measured() -> None:
    mock = MockOllamaServer("127.0.0.1", 0, time_scale=0).start()

    async def main() -> list[LlmSession]:
        sessions: list[LlmSession] = []
        proxy = OllamaProxy(upstream=mock.url, on_session=sessions.append, monitor_id="t")
        port = await proxy.start("127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            streamed = await client.post("/api/generate", json={"model": "qwen2.5:0.5b", "prompt": "a"})
            assert streamed.status_code == 200
            assert streamed.text.count("\n") >= 2
            whole = await client.post(
                "/api/chat",
                json={"model": "mistral:7b", "stream": False, "messages": [{"role": "user", "content": "b"}]},
            )
            assert whole.json()["done"] is True
            missing = await client.post("/api/generate", json={"model": "nope"})
            assert missing.status_code == 404
        await proxy.close()
        return sessions

    try:
        a, b, c = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        mock.stop()
    assert a.ok
    assert a.streamed
    assert a.ttft_ms is not None
    assert a.load_ms == pytest.approx(400.0)
    assert b.ok
    assert not b.streamed
    assert b.ttft_ms is None
    assert b.endpoint == "/api/chat"
    assert not c.ok
    assert c.http_status == 404
    assert c.error is not None
    assert "not found" in c.error


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=2000))
def test_any_vllm_exposition_is_a_status_or_a_clear_error(text: str) -> None:
    try:
        status = VllmScraper("http://v:8000").status(text, "m")
    except ValueError:
        return  # the poll turns this into up=false
    assert status.up


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"


async def _answer_from(wire: bytes, cuts: list[int]) -> tuple[int | None, bytes, list[LlmSession]]:
    """Ollama answers a generate request with `wire`, as its socket happens to split it: what the
    client gets (status and payload; None when the connection closes without a complete answer)."""
    edges = [0, *sorted(c for c in cuts if c < len(wire)), len(wire)]

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        for a, b in itertools.pairwise(edges):
            writer.write(wire[a:b])
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    sessions: list[LlmSession] = []
    proxy = OllamaProxy(
        upstream=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
        on_session=sessions.append,
        monitor_id="t",
    )
    port = await proxy.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /api/generate HTTP/1.1\r\nHost: p\r\nConnection: close\r\nContent-Length: 26\r\n\r\n"
            b'{"model":"m","prompt":"p"}'
        )
        received = await reader.read()
        writer.close()
    finally:
        await proxy.close()
        server.close()
    http = h11.Connection(h11.CLIENT)  # httpx would do, at a hundred times the cost per example
    http.send(h11.Request(method=b"POST", target=b"/", headers=[(b"Host", b"p"), (b"Content-Length", b"0")]))
    http.send(h11.EndOfMessage())
    http.receive_data(received)
    http.receive_data(b"")
    try:
        response = http.next_event()
        assert isinstance(response, h11.Response)
        payload = b""
        while isinstance(event := http.next_event(), h11.Data):
            payload += event.data
        assert isinstance(event, h11.EndOfMessage)
    except h11.RemoteProtocolError:
        return None, b"", sessions
    return response.status_code, payload, sessions


@settings(max_examples=150, deadline=None)
@given(
    parts=st.lists(st.binary(min_size=1, max_size=300), max_size=12),
    cuts=st.lists(st.integers(0, 5000), max_size=30),
)
def test_a_chunked_answer_reaches_the_client_whole_however_ollama_splits_it(
    parts: list[bytes], cuts: list[int]
) -> None:
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(parts)
    status, payload, sessions = asyncio.run(asyncio.wait_for(_answer_from(wire, cuts), 30))
    assert status == 200
    assert payload == b"".join(parts)
    (s,) = sessions
    assert s.http_status == 200


@pytest.mark.parametrize(
    "answer",
    [
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nabcdeXY",
        b"Transfer-Encoding: chunked\r\n\r\n-1\r\n",
        b"Transfer-Encoding: chunked\r\n\r\n0x5\r\n",
        b"Transfer-Encoding: chunked\r\n\r\n" + b"5" * 2000,
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nab",  # cut short
        b"Content-Length: 10\r\n\r\nabc",  # cut short
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n",
    ],
)
def test_a_misframed_answer_from_ollama_is_a_502_or_a_closed_connection_and_a_failed_session(
    answer: bytes,
) -> None:
    status, _, sessions = asyncio.run(asyncio.wait_for(_answer_from(b"HTTP/1.1 200 OK\r\n" + answer, []), 30))
    assert status in (None, 502)
    (s,) = sessions
    assert not s.ok
    assert s.error is not None
    assert "upstream failed" in s.error
