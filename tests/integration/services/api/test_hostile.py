"""The served API against hostile clients, over raw sockets: huge, endless and malformed requests.

The server runs as `python -m services.api` runs it (services.api.server), with
short deadlines so the tests wait seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.settings.common import DatabaseSettings
from tests.helpers.identities import VIEWER, api_env, identities
from tests.paths import REPO

AUTH = b"Authorization"
KEY = b"Bearer " + identities().tokens["operator"].encode()  # a token that may acknowledge
ACK = b"/api/v1/alerts/1/acknowledge"
LIMIT = 65_536
fast = pytest.mark.parametrize(
    "served_api", [{"header_timeout_s": 1.0, "body_timeout_s": 1.0, "max_body_bytes": LIMIT}], indirect=True
)


@contextlib.contextmanager
def connection(url: str, timeout_s: float = 15) -> Iterator[socket.socket]:
    address = urlparse(url)
    with socket.create_connection((address.hostname, address.port), timeout=timeout_s) as sock:
        yield sock


def read_response(sock: socket.socket) -> tuple[int | None, bytes]:
    """(status, body) of one response; (None, b'') when the server closed without answering.

    A socket timeout (the server holding the connection) propagates and fails the test.
    """
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return (None, b"") if not data else (int(data.split()[1]), b"")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        (int(v) for k, _, v in (x.partition(b":") for x in lines[1:]) if k.lower() == b"content-length"), 0
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def request(method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    lines = [method + b" " + path + b" HTTP/1.1", b"Host: test", *(k + b": " + v for k, v in headers)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def pushed_before_refused(sock: socket.socket, total: int) -> int:
    """Send up to `total` bytes of body; how many went out before the server's close stopped us."""
    sent, block = 0, b"x" * (1 << 20)
    try:
        while sent < total:
            sock.sendall(block)
            sent += len(block)
    except OSError:
        return sent
    return sent


@fast
@pytest.mark.parametrize(
    ("framing", "status", "reason"),
    [
        ((b"Content-Length", b"200000000"), 413, b"at most 65536 bytes"),  # the size is checked first
        ((b"Transfer-Encoding", b"chunked"), 401, b"bearer token"),  # no size declared: the token decides
    ],
)
def test_an_unauthenticated_200_mb_body_is_refused_on_its_headers_and_never_read(
    served_api: str, framing: tuple[bytes, bytes], status: int, reason: bytes
) -> None:
    with connection(served_api) as sock:
        sock.sendall(request(b"POST", ACK, [(b"Content-Type", b"application/json"), framing]))
        answer, body = read_response(sock)
        assert (answer, reason in body) == (status, True)
        assert closed_by_server(sock)
        # The server has stopped reading: 200 MB cannot be pushed into a closed connection.
        assert pushed_before_refused(sock, 200_000_000) < 200_000_000


@fast
@pytest.mark.parametrize("key", [KEY, None])
@pytest.mark.parametrize("length", [10**12, LIMIT + 1, 2**63])
def test_a_declared_body_over_the_limit_is_413_before_any_of_it_arrives(
    served_api: str, key: bytes | None, length: int
) -> None:
    headers = [(b"Content-Length", str(length).encode())] + ([(AUTH, key)] if key else [])
    with connection(served_api) as sock:
        sock.sendall(request(b"POST", ACK, headers))
        assert read_response(sock)[0] == 413
        assert closed_by_server(sock)


@fast
def test_a_chunked_body_is_counted_as_it_arrives_and_refused_past_the_limit(served_api: str) -> None:
    chunk = b"4000\r\n" + b" " * 0x4000 + b"\r\n"
    with connection(served_api) as sock:
        sock.sendall(request(b"POST", ACK, [(AUTH, KEY), (b"Transfer-Encoding", b"chunked")]))
        with contextlib.suppress(OSError):
            for _ in range(LIMIT // 0x4000 + 2):
                sock.sendall(chunk)
        assert read_response(sock)[0] == 413


@fast
def test_a_body_at_the_limit_reaches_the_endpoint_and_the_acknowledging_login(served_api: str) -> None:
    body = b'{"by": "oncall"}'
    body += b" " * (LIMIT - len(body))
    headers = [
        (AUTH, KEY),
        (b"Content-Type", b"application/json"),
        (b"Content-Length", str(LIMIT).encode()),
    ]
    with connection(served_api) as sock:
        sock.sendall(request(b"POST", ACK, headers) + body)
        status, detail = read_response(sock)
    assert (status, detail) == (404, b'{"detail":"no alert 1"}')


@fast
@pytest.mark.parametrize(
    "partial",
    [
        b"",
        b"GET /healthz HTTP/1.1\r\nHost: te",
        b"POST /api/v1/alerts/1/acknowledge HTTP/1.1\r\nAuthorization: Bearer ",
    ],
)
def test_headers_that_never_finish_get_a_408_and_the_connection_closes(
    served_api: str, partial: bytes
) -> None:
    with connection(served_api) as sock:
        sock.sendall(partial)
        assert read_response(sock)[0] == 408
        assert closed_by_server(sock)


@fast
def test_the_next_request_on_a_kept_alive_connection_has_the_same_deadline(served_api: str) -> None:
    with connection(served_api) as sock:
        sock.sendall(request(b"GET", b"/healthz", []))
        assert read_response(sock) == (200, b"ok\n")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert read_response(sock)[0] == 408
        assert closed_by_server(sock)


@fast
@pytest.mark.parametrize("framing", [[(b"Content-Length", b"100")], [(b"Transfer-Encoding", b"chunked")]])
def test_a_body_that_never_finishes_gets_a_408(served_api: str, framing: list[tuple[bytes, bytes]]) -> None:
    with connection(served_api) as sock:
        sock.sendall(request(b"POST", ACK, [(AUTH, KEY), *framing]) + b'{"by": ')
        assert read_response(sock)[0] == 408
        assert closed_by_server(sock)


HEADER_NAMES = st.sampled_from(
    [
        b"Content-Length",
        b"Transfer-Encoding",
        AUTH,
        b"Content-Type",
        b"Expect",
        b"Connection",
        b"Host",
    ]
) | st.binary(min_size=1, max_size=40)
HEADER_VALUES = (
    st.integers(-(10**3), 10**20).map(lambda n: str(n).encode())
    | st.sampled_from([KEY, b"chunked", b"gzip, chunked", b"100-continue", b"close", b"application/json"])
    | st.binary(max_size=300)
)


@fast
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    method=st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"HEAD"])
    | st.binary(max_size=12),
    path=st.sampled_from([ACK, b"/healthz", b"/api/v1/gpus", b"/api/v1/alerts", b"/x"])
    | st.binary(max_size=64),
    headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=8),
    body=st.binary(max_size=4096) | st.just(b"x" * (LIMIT + 10)),
)
def test_hostile_requests_get_a_4xx_or_a_close_never_a_5xx_nor_a_hang(
    served_api: str, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    with connection(served_api, timeout_s=20) as sock:
        with contextlib.suppress(OSError):  # the server may refuse and close before the body is sent
            sock.sendall(request(method, path, headers) + body)
        status, _ = read_response(sock)
    assert status is None or status < 500
    assert VIEWER.get(served_api + "/healthz", timeout=10).status_code == 200


def test_sigterm_stops_the_api_with_status_0_even_with_a_stalled_client(migrated: DatabaseSettings) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {
        "GPUHEALTH_DB__HOST": migrated.host, "GPUHEALTH_DB__PORT": str(migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "", "GPUHEALTH_API__PORT": str(port),
        "GPUHEALTH_API__BODY_TIMEOUT_S": "2", "PYTHONPATH": str(REPO),
        **api_env(),
    }  # fmt: skip
    api = subprocess.Popen([sys.executable, "-m", "services.api"], env=env, cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert api.poll() is None, api.stderr.read() if api.stderr else ""
            with contextlib.suppress(httpx.HTTPError):
                if VIEWER.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the API did not come up"
            threading.Event().wait(0.1)
        with connection(url) as stalled:
            # A request whose body never comes is in flight: shutdown waits for it, until its deadline.
            stalled.sendall(request(b"POST", ACK, [(AUTH, KEY), (b"Content-Length", b"10")]))
            api.send_signal(signal.SIGTERM)
            assert api.wait(timeout=60) == 0
    finally:
        if api.poll() is None:
            api.kill()
            api.wait()
