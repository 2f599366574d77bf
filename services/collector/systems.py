"""Announces this node's identity on gpu-systems: once at start, then whenever it changes.

Only collectors that read their own node's GPUs (NVML or nvidia-smi) announce;
one that scrapes exporters elsewhere (dcgm, mock) does not know those hosts'
identity. The identity is re-read every `interval_s` on a thread of its own,
and published only when its identity hash differs from the last one published
(the current PCIe link speed, which idles down, is not part of it).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from pydantic import ValidationError

from shared.contract.models_verify import SystemIdentity
from shared.contract.topic_registry import TopicSettings
from shared.gpu.gpu_identity import GpuReader, open_reader
from shared.plumbing.errors import GpuHealthError

from .publisher import Publisher

log = logging.getLogger(__name__)
SYSTEMS = TopicSettings.entry("systems")  # its messages' key and value


class SystemAnnouncer:
    def __init__(
        self, *, read: Callable[[], SystemIdentity], publisher: Publisher, topic: str, interval_s: float
    ) -> None:
        self.read, self.publisher, self.topic, self.interval_s = read, publisher, topic, interval_s
        self.published: str | None = None  # identity hash last published

    def check(self) -> bool:
        """Read the identity; publish it if it is new. True when something was published."""
        try:
            identity = self.read()
        except (GpuHealthError, ValidationError, OSError) as e:
            log.warning("node identity not read: %s", e)
            return False
        if identity.identity_sha256 == self.published:
            return False
        if not self.publisher.publish(self.topic, *SYSTEMS.encode(identity)):
            return False
        if self.published is not None:
            log.info("node identity changed", extra={"identity_sha256": identity.identity_sha256})
        self.published = identity.identity_sha256
        return True

    def run(self, stop: threading.Event) -> None:
        self.check()
        while self.interval_s > 0 and not stop.wait(self.interval_s):
            self.check()


def start_announcer(
    *,
    read: Callable[[], SystemIdentity],
    publisher: Publisher,
    topic: str,
    interval_s: float,
    stop: threading.Event,
) -> threading.Thread:
    announcer = SystemAnnouncer(read=read, publisher=publisher, topic=topic, interval_s=interval_s)
    thread = threading.Thread(target=announcer.run, args=(stop,), name="gpu-systems", daemon=True)
    thread.start()
    return thread


def local_identity(collector_id: str) -> Callable[[], SystemIdentity]:
    """Reads this node's identity, opening NVML (or nvidia-smi) on first use."""
    reader: list[GpuReader] = []

    def read() -> SystemIdentity:
        if not reader:
            reader.append(open_reader())
        return reader[0].identity(socket.gethostname(), collector_id)

    return read
