"""`python -m services.api`: serve the query API (uvicorn) until SIGTERM."""

from __future__ import annotations

import logging
import sys

from prometheus_client import CollectorRegistry

from shared.plumbing.running import ServiceRun
from shared.plumbing.service import start_service

from .app import create_app
from .server import ApiLoop, api_server
from .settings import ApiSettings

log = logging.getLogger("services.api")


def main() -> int:
    settings = start_service(ApiSettings, "api")
    if settings is None:
        return 2
    auth = settings.auth
    if auth.mode == "jwt" and auth.jwks_url is None and auth.jwks_file is None:
        log.error(
            "no issuer to verify callers' tokens by: set GPUHEALTH_AUTH__JWKS_URL or"
            " GPUHEALTH_AUTH__JWKS_FILE (`make up` uses its local issuer's: services.api.local_tokens)"
        )
        return 2
    registry = CollectorRegistry()
    app = create_app(settings.db, settings.api, registry, auth=auth)
    # SIGTERM: stop accepting, finish the requests in flight (at most half the shutdown deadline), exit 0.
    server = api_server(app, settings.api, shutdown_s=settings.shutdown.timeout_s)
    with ServiceRun("api", settings.shutdown) as life:
        life.export_otlp(registry)
        ApiLoop(server).run(life.stop)
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
