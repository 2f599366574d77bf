"""The LLM proxy as a narrow door (services/llm_monitor/proxy.py): only the allowed methods and paths
reach Ollama; slow and hostile clients are cut off by the head and body deadlines and the connection cap."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.llm_monitor.proxy import DEFAULT_ALLOW, Allowed, OllamaProxy


@asynccontextmanager
async def door(**limits: float) -> AsyncIterator[tuple[int, list[bytes]]]:
    """The proxy before a recording upstream that answers 200 to anything: (port, request lines seen)."""
    seen: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            seen.append(head.split(b"\r\n", 1)[0])
            length = next((int(v) for k, _, v in (line.partition(b":") for line in head.split(b"\r\n"))
                           if k.lower() == b"content-length"), 0)  # fmt: skip
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    proxy = OllamaProxy(upstream=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
                        on_session=lambda s: None, monitor_id="t", **limits)  # type: ignore[arg-type]  # fmt: skip
    port = await proxy.start("127.0.0.1", 0)
    try:
        yield port, seen
    finally:
        await proxy.close()
        server.close()


async def exchange(port: int, raw: bytes, wait_s: float = 10) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    try:
        async with asyncio.timeout(wait_s):
            return await reader.read()  # until the proxy closes
    finally:
        writer.close()


def status(answer: bytes) -> int | None:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/api/pull"), ("DELETE", "/api/delete"), ("POST", "/api/create"), ("POST", "/api/push"),
    ("POST", "/api/copy"), ("POST", "/api/blobs/sha256:00"), ("GET", "/api/generate"), ("PUT", "/api/chat"),
    ("POST", "/api/generate/../pull"), ("POST", "/api/%70ull"), ("POST", "//api/pull"), ("TRACE", "/"),
])  # fmt: skip
def test_model_management_and_other_requests_never_reach_ollama(method: str, path: str) -> None:
    async def main() -> None:
        async with door() as (port, seen):
            answer = await exchange(
                port, f"{method} {path} HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\n{{}}".encode()
            )
            assert status(answer) == 403, answer
            ok = await exchange(port, b"GET /api/tags HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n")
            assert status(ok) == 200
            assert seen == [b"GET /api/tags HTTP/1.1"]

    asyncio.run(asyncio.wait_for(main(), 30))


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]),
    path=st.text(st.sampled_from("/api.%2e_-abcdegilnoprstuvx*?=&1"), min_size=1, max_size=30),
)
def test_only_what_the_allow_list_names_is_relayed(method: str, path: str) -> None:
    allowed = Allowed(DEFAULT_ALLOW)
    target = ("/" + path.lstrip("/")).encode()
    relayed = (method.encode(), target) in allowed
    bare = target.split(b"?", 1)[0].decode()
    named = f"{method} {bare}" in DEFAULT_ALLOW or (method == "GET" and bare.startswith("/v1/models/"))
    assert relayed == (named and "%" not in bare and "/./" not in bare + "/" and "/../" not in bare + "/"
                       and "//" not in bare)  # fmt: skip


def test_a_head_that_never_finishes_is_a_408_within_the_deadline() -> None:
    async def main() -> None:
        async with door(head_timeout_s=0.5) as (port, seen):
            started = time.monotonic()
            answer = await exchange(port, b"POST /api/generate HTTP/1.1\r\nHost: p\r\nContent-Le")
            assert status(answer) == 408
            assert time.monotonic() - started < 5
            idle = await exchange(port, b"")  # an idle connection: closed, without a word
            assert idle == b""
            assert seen == []

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_body_that_trickles_is_a_408_within_the_deadline() -> None:
    async def main() -> None:
        async with door(body_timeout_s=0.5) as (port, seen):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /api/generate HTTP/1.1\r\nHost: p\r\nContent-Length: 1000\r\n\r\n")
            started = time.monotonic()
            answered = asyncio.create_task(reader.read(4096))  # the proxy's answer, whenever it comes
            for _ in range(100):  # a byte every 0.1 s: each arrives in time, the whole body does not
                if answered.done():
                    break
                with contextlib.suppress(ConnectionError):
                    writer.write(b"x")
                    await writer.drain()
                await asyncio.sleep(0.1)
            answer = await answered
            writer.close()
            assert status(answer) == 408
            assert time.monotonic() - started < 5
            assert seen == []

    asyncio.run(asyncio.wait_for(main(), 30))


def test_past_the_connection_cap_a_new_client_gets_a_503_and_the_held_ones_are_served() -> None:
    async def main() -> None:
        async with door(max_connections=3, head_timeout_s=5) as (port, _seen):
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0.2)
            refused = await exchange(port, b"GET /api/tags HTTP/1.1\r\nHost: p\r\n\r\n")
            assert status(refused) == 503
            reader, writer = held[0]
            writer.write(b"GET /api/tags HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n")
            assert status(await reader.read()) == 200
            for _, w in held:
                w.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_default_body_cap_is_8_mib_and_refused_on_the_declared_length() -> None:
    async def main() -> None:
        async with door() as (port, seen):
            answer = await exchange(port, b"POST /api/chat HTTP/1.1\r\nHost: p\r\nContent-Length: %d\r\n\r\n"
                                    % (8 * 1024 * 1024 + 1))  # fmt: skip
            assert status(answer) == 413
            assert seen == []

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_malformed_allow_entry_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="METHOD /path"):
        Allowed(["/api/generate"])
    from services.llm_monitor.settings import LlmSection

    with pytest.raises(ValueError, match="METHOD /path"):
        LlmSection(proxy_allow=["pull everything"])
    assert socket  # (the sockets of the tests above are asyncio's)
