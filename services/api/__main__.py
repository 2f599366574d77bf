"""`python -m services.api`: serve the query API (uvicorn) until SIGTERM."""

from __future__ import annotations

import sys

import uvicorn
from prometheus_client import CollectorRegistry

from shared import otlp
from shared.service import start_service

from .app import create_app
from .settings import ApiSettings


def main() -> int:
    settings = start_service(ApiSettings, "api")
    if settings is None:
        return 2
    registry = CollectorRegistry()
    otlp.export_registry(registry)
    app = create_app(settings.db, settings.api, registry)
    # uvicorn handles SIGTERM itself: it stops accepting, finishes requests in flight, exits 0.
    uvicorn.run(app, host=settings.api.bind, port=settings.api.port, log_config=None, access_log=False)
    otlp.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
