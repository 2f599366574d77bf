"""What every long-running service does at start and stop, written once.

Settings from the environment (an invalid one is a clear message and exit code
2, before logging exists), JSON logging, the configuration logged once with
secrets masked, Prometheus /metrics about the service itself, and a stop event
set by SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import CollectorRegistry, start_http_server

from shared import otlp
from shared.config import DatabaseSettings, Settings, load_settings, log_settings
from shared.db import wait_for_database
from shared.errors import GpuHealthError
from shared.logging import setup_logging

S = TypeVar("S", bound=Settings)
log = logging.getLogger(__name__)


def start_service(cls: type[S], name: str) -> S | None:
    """Settings with logging set up and logged; None (after saying why) when they are invalid.

    Starts the OTLP export too when it is configured (shared.otlp: off by default).
    """
    try:
        settings = load_settings(cls)
        otlp_section = load_settings(otlp.OtlpSettings).otlp
        otlp.otlp_target(otlp_section, os.environ)
    except GpuHealthError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return None
    setup_logging(settings.log.level, json_format=settings.log.json_format, service=name)
    log_settings(settings, name)
    try:
        otlp.start_export(name, otlp_section)
    except GpuHealthError as e:
        log.error("%s cannot start: %s", name, e)
        return None
    return settings


def serve_metrics(registry: CollectorRegistry, port: int, bind: str) -> Callable[[], None]:
    """Serve /metrics (and export it over OTLP when that is on); returns the function that stops both.

    Stopping flushes the OTLP export first, so the points up to SIGTERM reach the receiver.
    OSError if the port is taken.
    """
    server, _ = start_http_server(port, addr=bind, registry=registry)
    otlp.export_registry(registry)

    def stop() -> None:
        otlp.shutdown()
        server.shutdown()

    return stop


def serve_when_ready(
    name: str, registry: CollectorRegistry, port: int, bind: str, database: DatabaseSettings | None = None
) -> Callable[[], None] | None:
    """Wait for the database (for services that need one), then serve /metrics.

    Returns the function that stops serving, or None after logging why the service cannot start.
    """
    try:
        if database is not None:
            wait_for_database(database, timeout_s=120).close()
        return serve_metrics(registry, port, bind)
    except (GpuHealthError, OSError) as e:
        log.error("%s cannot start: %s", name, e)
        return None


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set: the service finishes its work in hand and exits 0."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop
