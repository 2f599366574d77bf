"""Options every test folder can read: where the real Kafka and TimescaleDB are."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu-health")
    group.addoption(
        "--kafka-bootstrap-servers",
        default=None,
        help="Kafka for integration tests (default: GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS or the"
        " broker `make services` started)",
    )
    group.addoption("--db-host", default=None, help="TimescaleDB host (default: GPUHEALTH_DB__HOST or local)")
    group.addoption(
        "--db-port", default=None, type=int, help="TimescaleDB port (default: GPUHEALTH_DB__PORT)"
    )
