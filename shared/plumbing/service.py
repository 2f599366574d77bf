"""What every long-running service does at start, written once.

Settings from the environment (an invalid one is a clear message and exit code
2, before logging exists), JSON logging, the configuration logged once with
secrets masked (and a warning naming any GPUHEALTH_* variable that nothing
reads), and Prometheus /metrics about the service itself. The stop
event, the signals and the teardown are shared.plumbing.running's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, start_http_server

from shared.plumbing import otlp
from shared.plumbing.errors import GpuHealthError
from shared.plumbing.logging import setup_logging
from shared.plumbing.secrets import default_secrets_off_loopback
from shared.settings.common import Settings, load_settings, log_settings
from shared.settings.env import warn_unknown_variables

S = TypeVar("S", bound=Settings)
log = logging.getLogger(__name__)


def refuse_arguments(cls: type[Settings], name: str, argv: Sequence[str]) -> None:
    """A service takes no arguments: `--help` says where its settings come from (exit 0), any
    other argument is refused (exit 2)."""
    sections = ", ".join(f"GPUHEALTH_{section.upper()}__*" for section in cls.model_fields)
    argparse.ArgumentParser(
        prog=f"gpuhealth-{name.replace('_', '-')}",
        description=f"Takes no arguments: the settings come from environment variables ({sections}).",
    ).parse_args(argv)


def named_on_the_database(settings: S, name: str) -> S:
    """The settings with the service's name as its connections' `application_name` (pg_stat_activity,
    the server's log), `gpu-health-<name>`, unless GPUHEALTH_DB__APPLICATION_NAME says otherwise."""
    if "application_name" not in settings.db.model_fields_set:
        settings.db = settings.db.model_copy(update={"application_name": f"gpu-health-{name}"})
    return settings


def start_service(cls: type[S], name: str, argv: Sequence[str] | None = None) -> S | None:
    """Settings with logging set up and logged; None (after saying why) when they are invalid.

    Starts the OTLP export too when it is configured (shared.plumbing.otlp: off by default). `argv`
    (the command line's, by default) may only ask for --help.
    """
    refuse_arguments(cls, name, sys.argv[1:] if argv is None else argv)
    try:
        settings = named_on_the_database(load_settings(cls), name)
        otlp_section = load_settings(otlp.OtlpSettings).otlp
        otlp.otlp_target(otlp_section, os.environ)
    except GpuHealthError as e:
        print(f"{name}: {e}", file=sys.stderr)
        return None
    setup_logging(settings.log.level, json_format=settings.log.json_format, service=name)
    log_settings(settings, name)
    if defaults := default_secrets_off_loopback(settings):
        log.error("%s refuses to start: %s (set your own)", name, "; ".join(defaults))
        return None
    warn_unknown_variables(os.environ, cls, otlp.OtlpSettings)
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
    try:
        server, _ = start_http_server(port, addr=bind, registry=registry)
    except OSError as e:  # name the port at fault: "Address already in use" alone does not say which
        raise OSError(e.errno, f"cannot serve /metrics on {bind}:{port}: {e.strerror or e}") from e
    otlp.export_registry(registry)

    def stop() -> None:
        otlp.shutdown()
        server.shutdown()

    return stop
