"""HTTP for the mock fleet: one port per node (like a real dcgm-exporter), one admin port.

Node *i* answers ``GET /metrics`` on ``base_port + i`` (9400, 9401, ...), where a
collector would find dcgm-exporter on that node, and ``GET /processes`` with the
processes its GPUs run (JSON, see processes.py), and ``GET /journal`` with its kernel log as
``journalctl -k -o json`` prints it (kernel_log.py). The admin port (default 9399)
serves:

- ``GET  /fleet``          nodes, their metrics URLs and GPUs
- ``GET  /ground-truth``   every injected fault with its start time and subsystem
- ``POST /faults``         inject a fault (JSON body, see README)
- ``DELETE /faults/<id>``  end a fault now
- ``POST /repairs``        repair a GPU now: its faults end, it is reset
- ``POST /compute-check``  the remediator's compute check on a GPU (its exec driver's webhook): 200
  when it passes, 409 while a fault the mock's `compute_check` setting counts is active on it
- ``POST /reset-gpu``      a GPU reset (the exec driver's webhook): 200 with what it ended and left,
  409 for a GPU off the bus (remedies.py)
- ``POST /reboot``         a reboot of the node named (or of the GPUs' node): 200 with what it ended and left
- ``GET  /metrics``        the mock's own Prometheus metrics
- ``GET  /healthz``
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shared.plumbing.running import serve_until

from .faults import FaultError, NotFoundError, RemedyRefusedError
from .fleet import ComputeCheck, Fleet
from .processes import MockProcesses
from .remedies import Remedy

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
R = TypeVar("R")


class MockMetrics:
    def __init__(self, registry: CollectorRegistry, fleet: Fleet) -> None:
        self.scrapes = Counter("gpuhealth_mock_scrapes", "Node scrapes served", ["node"], registry=registry)
        self.render_seconds = Histogram(
            "gpuhealth_mock_render_seconds",
            "Time to advance and render one node",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self.faults = Counter(
            "gpuhealth_mock_faults_injected", "Faults injected", ["kind"], registry=registry
        )
        self.remedies = Counter(
            "gpuhealth_mock_remedies",
            "Resets and reboots asked for, by whether they ran",
            ["remedy", "ok"],
            registry=registry,
        )
        self.admin_errors = Counter(
            "gpuhealth_mock_admin_errors", "Admin requests refused", registry=registry
        )
        gpus = Gauge("gpuhealth_mock_gpus", "Simulated GPUs", registry=registry)
        gpus.set(sum(len(n.gpus) for n in fleet.nodes))
        sim_time = Gauge(
            "gpuhealth_mock_sim_time_seconds", "Simulated clock (epoch seconds)", registry=registry
        )
        sim_time.set_function(fleet.clock.now)


class _Handler(BaseHTTPRequestHandler):
    server_version = "gpu-health-mock-dcgm"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def reply_json(self, status: int, value: Any) -> None:
        self.reply(status, json.dumps(value, indent=1).encode(), "application/json")


def node_handler(fleet: Fleet, index: int, metrics: MockMetrics, *, timestamps: bool) -> type:
    processes = MockProcesses(fleet)

    class NodeHandler(_Handler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/processes":  # the node's simulated GPU processes (#19)
                self.reply_json(HTTPStatus.OK, processes.node(index))
                return
            if self.path.split("?", 1)[0] == "/journal":  # the node's kernel log (kernel_log.py)
                self.journal()
                return
            if self.path.split("?", 1)[0] != "/metrics":
                self.reply(HTTPStatus.NOT_FOUND, b"only /metrics here\n", "text/plain")
                return
            with metrics.render_seconds.time():
                text, delay = fleet.scrape(index, timestamps=timestamps)
            if delay:
                time.sleep(delay)  # a GPU off the bus makes the driver's queries time out
            metrics.scrapes.labels(str(index)).inc()
            self.reply(HTTPStatus.OK, text.encode(), PROM_CONTENT_TYPE)

        def journal(self) -> None:
            try:
                query = parse_qs(urlsplit(self.path).query, keep_blank_values=True, max_num_fields=4)
            except ValueError:  # more fields than the journal takes
                query = {"": []}
            if set(query) - {"after-cursor", "since"} or any(len(v) > 1 for v in query.values()):
                self.reply(
                    HTTPStatus.BAD_REQUEST, b"the journal takes one after-cursor or one since\n", "text/plain"
                )
                return
            try:
                body, lost = fleet.journal(
                    index,
                    after_cursor=query.get("after-cursor", [None])[0],
                    since=query.get("since", [None])[0],
                )
            except FaultError as e:
                self.reply(HTTPStatus.BAD_REQUEST, f"{e}\n".encode(), "text/plain")
                return
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Journal-Lost", str(lost))  # records the ring overwrote before this read
            self.end_headers()
            self.wfile.write(body)

    return NodeHandler


@dataclass(frozen=True, slots=True)
class Admin:
    """What the admin routes serve: the fleet, the mock's metrics, and what the compute check counts."""

    fleet: Fleet
    metrics: MockMetrics
    registry: CollectorRegistry
    node_url: Callable[[int], str]
    compute_check: ComputeCheck = "hard_failure"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: Any  # JSON; bytes go as they are, as `content_type`
    content_type: str = "application/json"


class RefusedError(Exception):
    """An admin request refused: its status, and the message its JSON `error` carries."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def inject(a: Admin, request: Any) -> Reply:
    try:
        fault = a.fleet.inject(request)
    except FaultError as e:
        raise RefusedError(HTTPStatus.BAD_REQUEST, str(e)) from e
    a.metrics.faults.labels(fault.kind.value).inc()
    log.info("fault injected", extra={"fault_id": fault.id, "kind": fault.kind.value})
    return Reply(HTTPStatus.CREATED, a.fleet.describe(fault))


def repair(a: Admin, request: Any) -> Reply:
    try:
        repaired = a.fleet.repair(request)
    except FaultError as e:
        raise RefusedError(HTTPStatus.BAD_REQUEST, str(e)) from e
    log.info("GPU repaired", extra=repaired)
    return Reply(HTTPStatus.CREATED, repaired)


def compute_check(a: Admin, request: Any) -> Reply:
    """The remediator's exec driver's webhook (`{"gpu_uuid": ...}`, several comma-separated when it asks
    once per node): 200 when every GPU passes, 409 when one fails, naming its faults."""
    uuids = request.get("gpu_uuid") if isinstance(request, dict) else None
    if not isinstance(uuids, str) or not uuids:
        raise RefusedError(HTTPStatus.BAD_REQUEST, "the compute check needs gpu_uuid (comma-separated)")
    try:
        answer = a.fleet.compute_check(uuids.split(","), a.compute_check)
    except FaultError as e:
        raise RefusedError(HTTPStatus.NOT_FOUND, str(e)) from e
    return Reply(HTTPStatus.OK if answer["passed"] else HTTPStatus.CONFLICT, answer)


def remedy(remedy: Remedy) -> Callable[[Admin, Any], Reply]:
    """The exec driver's reset or reboot webhook: 200 with its effect, 409 when it cannot run, 404 for a
    GPU or node not here, 400 for a body that is not such a request."""

    def run(a: Admin, request: Any) -> Reply:
        try:
            done = a.fleet.remedy(remedy, request)
        except RemedyRefusedError as e:
            a.metrics.remedies.labels(remedy, "false").inc()
            raise RefusedError(HTTPStatus.CONFLICT, str(e)) from e
        except NotFoundError as e:
            raise RefusedError(HTTPStatus.NOT_FOUND, str(e)) from e
        except FaultError as e:
            raise RefusedError(HTTPStatus.BAD_REQUEST, str(e)) from e
        a.metrics.remedies.labels(remedy, "true").inc()
        log.info("remedy", extra={k: done[k] for k in ("remedy", "hostname", "plan_id", "faults_ended")})
        return Reply(HTTPStatus.OK, done)

    return run


def clear(a: Admin, path: str) -> Reply:
    """`DELETE /faults/<id>`: the fault ends now."""
    prefix = "/faults/"
    if not path.startswith(prefix) or not path[len(prefix) :].isdigit():
        raise RefusedError(HTTPStatus.NOT_FOUND, "DELETE goes to /faults/<id>")
    try:
        fault = a.fleet.clear(int(path[len(prefix) :]))
    except FaultError as e:
        raise RefusedError(HTTPStatus.NOT_FOUND, str(e)) from e
    return Reply(HTTPStatus.OK, a.fleet.describe(fault))


GETS: dict[str, Callable[[Admin], Reply]] = {
    "/healthz": lambda a: Reply(HTTPStatus.OK, b"ok\n", "text/plain"),
    "/metrics": lambda a: Reply(HTTPStatus.OK, generate_latest(a.registry), PROM_CONTENT_TYPE),
    "/fleet": lambda a: Reply(HTTPStatus.OK, {"nodes": a.fleet.inventory(a.node_url)}),
    "/ground-truth": lambda a: Reply(HTTPStatus.OK, a.fleet.ground_truth()),
}
POSTS: dict[str, Callable[[Admin, Any], Reply]] = {  # each takes the body's JSON
    "/faults": inject,
    "/compute-check": compute_check,
    "/repairs": repair,
    "/reset-gpu": remedy("reset_gpu"),
    "/reboot": remedy("reboot_node"),
}
POST_WHERE = f"POST goes to {', '.join(list(POSTS)[:-1])} or {list(POSTS)[-1]}"


def route(routes: Mapping[str, R], path: str, refusal: str) -> R:
    if path not in routes:
        raise RefusedError(HTTPStatus.NOT_FOUND, refusal)
    return routes[path]


def admin_handler(admin: Admin) -> type:
    class AdminHandler(_Handler):
        def answer(self, reply: Callable[[], Reply]) -> None:
            """Send what `reply` gives, or its refusal as JSON (an admin error)."""
            try:
                got = reply()
            except RefusedError as e:
                admin.metrics.admin_errors.inc()
                self.reply_json(e.status, {"error": str(e)})
                return
            if isinstance(got.body, bytes):
                self.reply(got.status, got.body, got.content_type)
            else:
                self.reply_json(got.status, got.body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            self.answer(lambda: route(GETS, path, f"no such endpoint {path!r}")(admin))

        def do_POST(self) -> None:  # the route first: a body is read only for one
            self.answer(lambda: route(POSTS, self.path, POST_WHERE)(admin, self.read_json()))

        def do_DELETE(self) -> None:
            self.answer(lambda: clear(admin, self.path))

        def read_json(self) -> Any:
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise RefusedError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required") from None
            if not 0 < length <= MAX_BODY_BYTES:
                too_long = f"body must be 1..{MAX_BODY_BYTES} bytes"
                raise RefusedError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, too_long)
            try:
                return json.loads(self.rfile.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RefusedError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {e}") from None

    return AdminHandler


class MockServer:
    """Starts every node's HTTP server and the admin server, each on its own thread."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        bind: str,
        base_port: int,
        admin_port: int,
        timestamps: bool,
        registry: CollectorRegistry | None = None,
        compute_check: ComputeCheck = "hard_failure",
    ) -> None:
        self.registry = registry or CollectorRegistry()
        metrics = MockMetrics(self.registry, fleet)
        self.servers: list[ThreadingHTTPServer] = []
        for i in range(len(fleet.nodes)):
            handler = node_handler(fleet, i, metrics, timestamps=timestamps)
            port = 0 if base_port == 0 else base_port + i  # 0: any free port, for tests
            self.servers.append(self._listen(bind, port, handler, f"node {i}'s exporter"))
        # Port 0 means "any free port"; ask each server which one it got.
        host = "127.0.0.1" if bind in ("0.0.0.0", "") else bind  # noqa: S104 - just a comparison

        def node_url(i: int) -> str:
            return f"http://{host}:{self.servers[i].server_address[1]}/metrics"

        self.node_url = node_url
        self.admin = self._listen(
            bind,
            admin_port,
            admin_handler(Admin(fleet, metrics, self.registry, node_url, compute_check)),
            "the admin API",
        )
        self.servers.append(self.admin)
        for server in self.servers:
            server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    def _listen(self, bind: str, port: int, handler: Any, what: str) -> ThreadingHTTPServer:
        """A server on bind:port; if the port is taken, the error says which port and what it was for."""
        try:
            return ThreadingHTTPServer((bind, port), handler)
        except OSError as e:
            for server in self.servers:  # the ports already taken are given back
                server.server_close()
            raise OSError(e.errno, f"cannot listen on {bind}:{port} for {what}: {e.strerror or e}") from e

    @property
    def admin_url(self) -> str:
        host, port = self.admin.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        for server in self.servers:
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            self._threads.append(thread)

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set; the ports are given back however it ends."""
        serve_until(self, stop)

    def stop(self) -> None:
        """Stop serving and give the ports back; safe twice, and before start()."""
        threads, self._threads = self._threads, []
        if threads:  # shutdown() waits for serve_forever, so only a started server is asked
            for server in self.servers:
                server.shutdown()
        for server in self.servers:
            server.server_close()
        for thread in threads:
            thread.join(timeout=5)

    def __enter__(self) -> MockServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
