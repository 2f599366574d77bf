"""The API process's memory under 200 MB request bodies, next to its memory at rest, in the same run.

`python -m services.api` runs as a child process over a scratch schema. Its
resident set is read from /proc at rest (after a few ordinary requests), then its
peak (VmHWM) after each hostile request to the acknowledge endpoint: 200 MB with a
declared Content-Length and no key, 200 MB chunked with no key, and 200 MB chunked
with the right key. Before the request guard, the first of these alone took the
process from 66 MiB to 2,035 MiB.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench._common import callers, report
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import Settings

REPO = Path(__file__).resolve().parents[1]
BODY = 200_000_000


def memory_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def push(port: int, headers: list[str], chunked: bool) -> tuple[str, int]:
    """Send a 200 MB body as fast as the server takes it; the status line it answered and bytes sent."""
    head = "\r\n".join(["POST /api/v1/alerts/1/acknowledge HTTP/1.1", "Host: bench", *headers]) + "\r\n\r\n"
    block = b"x" * (1 << 20)
    if chunked:
        block = f"{len(block):x}\r\n".encode() + block + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        with contextlib.suppress(OSError):
            while sent < BODY:
                sock.sendall(block)
                sent += 1 << 20
        answer = b""
        with contextlib.suppress(OSError):
            while b"\r\n" not in answer and (chunk := sock.recv(4096)):
                answer += chunk
    return answer.split(b"\r\n")[0].decode() or "(closed)", sent


def main() -> int:
    settings = Settings()
    with migrated_schema(settings.db, "bench_api_body") as db, callers() as who:
        port = free_port()
        env = os.environ | {
            "GPUHEALTH_DB__SEARCH_PATH": db.search_path or "", "GPUHEALTH_API__PORT": str(port),
            "GPUHEALTH_LOG__LEVEL": "WARNING", "PYTHONPATH": str(REPO),
            "GPUHEALTH_API__TRUSTED_HOSTS": '["127.0.0.1", "bench"]', **who.env,
        }  # fmt: skip
        api = subprocess.Popen([sys.executable, "-m", "services.api"], env=env, cwd=REPO)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline or api.poll() is not None:
                    raise RuntimeError("the API did not start")
                time.sleep(0.1)
            for path in ("/api/v1/fleet/summary", "/api/v1/gpus", "/api/v1/alerts", "/metrics"):
                httpx.get(url + path, headers=who.headers(), timeout=10).raise_for_status()
            at_rest = memory_mib(api.pid, "VmRSS")
            cases = [
                ("declared 200 MB, no token", [f"Content-Length: {BODY}"], False),
                ("chunked 200 MB, no token", ["Transfer-Encoding: chunked"], True),
                (
                    "chunked 200 MB, an operator's token",
                    [
                        "Transfer-Encoding: chunked",
                        f"Authorization: {who.headers('operator')['Authorization']}",
                    ],
                    True,
                ),
            ]
            for name, headers, chunked in cases:
                status, sent = push(port, headers, chunked)
                print(f"{name}: answered {status!r} after the client pushed {sent / 2**20:,.0f} MiB")
            peak = memory_mib(api.pid, "VmHWM")
            report("API peak RSS after three 200 MB bodies", peak, "MiB", "RSS at rest", at_rest)
        finally:
            api.terminate()
            print(f"API exit status on SIGTERM: {api.wait(timeout=60)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
