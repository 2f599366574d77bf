"""Free TCP ports on 127.0.0.1 for a test's servers (other processes share this machine: a port is
free when asked, and taken by whoever binds it first)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """n consecutive free ports (a mock fleet's nodes listen on base + i)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        held = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no run of free ports")
