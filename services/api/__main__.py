"""`python -m services.api`: serve the query API (uvicorn) until SIGTERM."""

from __future__ import annotations

import sys

from prometheus_client import CollectorRegistry

from shared import otlp
from shared.service import start_service

from .app import create_app
from .server import api_server
from .settings import ApiSettings


def main() -> int:
    settings = start_service(ApiSettings, "api")
    if settings is None:
        return 2
    registry = CollectorRegistry()
    otlp.export_registry(registry)
    app = create_app(settings.db, settings.api, registry)
    # SIGTERM: stop accepting, finish the requests in flight (at most shutdown_timeout_s), exit 0.
    server = api_server(app, settings.api)
    try:
        server.run()
    finally:
        otlp.shutdown()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
