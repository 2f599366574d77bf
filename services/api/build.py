"""The API its settings describe: the app, its uvicorn server and its metrics (`python -m services.api`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import ConfigError
from shared.plumbing.running import Loop, ServiceRun

from .app import create_app
from .server import ApiLoop, api_server
from .settings import ApiSettings


class ApiService:
    """Serves the query API until SIGTERM: then it stops accepting and finishes the requests in flight (at
    most half the shutdown deadline)."""

    def __init__(self, settings: ApiSettings) -> None:
        """ConfigError when JWT callers have no issuer to be verified by."""
        auth = settings.auth
        if auth.mode == "jwt" and auth.jwks_url is None and auth.jwks_file is None:
            raise ConfigError(
                "no issuer to verify callers' tokens by: set GPUHEALTH_AUTH__JWKS_URL or"
                " GPUHEALTH_AUTH__JWKS_FILE (`make up` uses its local issuer's: services.api.local_tokens)"
            )
        self.registry = CollectorRegistry()
        app = create_app(settings.db, settings.api, self.registry, auth=auth)
        self.server = api_server(app, settings.api, shutdown_s=settings.shutdown.timeout_s)

    def start(self, life: ServiceRun) -> Loop:
        return Serving(self.registry, ApiLoop(self.server), life)

    def stopped(self) -> int:
        return 0 if self.server.started else 1


@dataclass(frozen=True, slots=True)
class Serving:
    """The API's loop: its metrics exported over OTLP (when that is on) while it serves."""

    registry: CollectorRegistry
    loop: ApiLoop
    life: ServiceRun

    def run(self, stop: threading.Event) -> None:
        self.life.export_otlp(self.registry)
        self.loop.run(stop)
