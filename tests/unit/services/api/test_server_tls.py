"""The API over TLS: with a certificate and key set, uvicorn speaks HTTPS only (uvicorn's ssl settings)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from services.api.server import api_server
from services.api.settings import ApiSection
from shared.plumbing.local_pki import ensure_ca, ensure_identity


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_api_speaks_https_only_when_given_a_certificate(tmp_path: Path) -> None:
    ca = ensure_ca(tmp_path)
    ensure_identity(tmp_path, "api-server", ca, ["127.0.0.1"])
    api = ApiSection(tls_cert_file=tmp_path / "api-server.pem", tls_key_file=tmp_path / "api-server.key")
    port = free_port()
    server = api_server(hello, api, host="127.0.0.1", port=port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        trusting = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        answer = httpx.get(f"https://127.0.0.1:{port}/", verify=trusting, timeout=5)
        assert (answer.status_code, answer.text) == (200, "hello")
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
            httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        with pytest.raises(httpx.ConnectError):  # nor does a client that does not trust the CA
            httpx.get(f"https://127.0.0.1:{port}/", timeout=5)
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="go together"):
        ApiSection(tls_cert_file=tmp_path / "cert.pem")
