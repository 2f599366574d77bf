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
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
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
                self.reply(HTTPStatus.BAD_REQUEST, b"the journal takes one after-cursor or one since\n",
                           "text/plain")  # fmt: skip
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


def admin_handler(
    fleet: Fleet,
    metrics: MockMetrics,
    registry: CollectorRegistry,
    node_url: Any,
    compute_check: ComputeCheck = "hard_failure",
) -> type:
    class AdminHandler(_Handler):
        def fail(self, status: int, message: str) -> None:
            metrics.admin_errors.inc()
            self.reply_json(status, {"error": message})

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self.reply(HTTPStatus.OK, b"ok\n", "text/plain")
            elif path == "/metrics":
                self.reply(HTTPStatus.OK, generate_latest(registry), PROM_CONTENT_TYPE)
            elif path == "/fleet":
                self.reply_json(HTTPStatus.OK, {"nodes": fleet.inventory(node_url)})
            elif path == "/ground-truth":
                self.reply_json(HTTPStatus.OK, fleet.ground_truth())
            else:
                self.fail(HTTPStatus.NOT_FOUND, f"no such endpoint {path!r}")

        def read_json(self) -> tuple[bool, Any]:
            """(True, the body's JSON), or (False, None) once the refusal is sent."""
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.fail(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
                return False, None
            if not 0 < length <= MAX_BODY_BYTES:
                self.fail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body must be 1..{MAX_BODY_BYTES} bytes")
                return False, None
            try:
                return True, json.loads(self.rfile.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                self.fail(HTTPStatus.BAD_REQUEST, f"body is not JSON: {e}")
                return False, None

        def do_POST(self) -> None:
            if self.path not in ("/faults", "/compute-check", "/repairs", "/reset-gpu", "/reboot"):
                where = "/faults, /compute-check, /repairs, /reset-gpu or /reboot"
                self.fail(HTTPStatus.NOT_FOUND, f"POST goes to {where}")
                return
            read, request = self.read_json()
            if not read:
                return
            if self.path == "/compute-check":
                self.compute_check(request)
                return
            if self.path in ("/reset-gpu", "/reboot"):
                self.remedy("reset_gpu" if self.path == "/reset-gpu" else "reboot_node", request)
                return
            if self.path == "/repairs":
                try:
                    repaired = fleet.repair(request)
                except FaultError as e:
                    self.fail(HTTPStatus.BAD_REQUEST, str(e))
                    return
                log.info("GPU repaired", extra=repaired)
                self.reply_json(HTTPStatus.CREATED, repaired)
                return
            try:
                fault = fleet.inject(request)
            except FaultError as e:
                self.fail(HTTPStatus.BAD_REQUEST, str(e))
                return
            metrics.faults.labels(fault.kind.value).inc()
            log.info("fault injected", extra={"fault_id": fault.id, "kind": fault.kind.value})
            self.reply_json(HTTPStatus.CREATED, fleet.describe(fault))

        def remedy(self, remedy: Remedy, request: Any) -> None:
            """The exec driver's reset or reboot webhook: 200 with its effect, 409 when it cannot run, 404
            for a GPU or node not here, 400 for a body that is not such a request."""
            try:
                done = fleet.remedy(remedy, request)
            except RemedyRefusedError as e:
                metrics.remedies.labels(remedy, "false").inc()
                self.fail(HTTPStatus.CONFLICT, str(e))
                return
            except NotFoundError as e:
                self.fail(HTTPStatus.NOT_FOUND, str(e))
                return
            except FaultError as e:
                self.fail(HTTPStatus.BAD_REQUEST, str(e))
                return
            metrics.remedies.labels(remedy, "true").inc()
            log.info("remedy", extra={k: done[k] for k in ("remedy", "hostname", "plan_id", "faults_ended")})
            self.reply_json(HTTPStatus.OK, done)

        def compute_check(self, request: Any) -> None:
            """The remediator's exec driver's webhook (`{"gpu_uuid": ...}`, several comma-separated when
            it asks once per node): 200 when every GPU passes, 409 when one fails, naming its faults."""
            uuids = request.get("gpu_uuid") if isinstance(request, dict) else None
            if not isinstance(uuids, str) or not uuids:
                self.fail(HTTPStatus.BAD_REQUEST, "the compute check needs gpu_uuid (comma-separated)")
                return
            try:
                answer = fleet.compute_check(uuids.split(","), compute_check)
            except FaultError as e:
                self.fail(HTTPStatus.NOT_FOUND, str(e))
                return
            self.reply_json(HTTPStatus.OK if answer["passed"] else HTTPStatus.CONFLICT, answer)

        def do_DELETE(self) -> None:
            prefix = "/faults/"
            if not self.path.startswith(prefix) or not self.path[len(prefix) :].isdigit():
                self.fail(HTTPStatus.NOT_FOUND, "DELETE goes to /faults/<id>")
                return
            try:
                fault = fleet.clear(int(self.path[len(prefix) :]))
            except FaultError as e:
                self.fail(HTTPStatus.NOT_FOUND, str(e))
                return
            self.reply_json(HTTPStatus.OK, fleet.describe(fault))

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
            admin_handler(fleet, metrics, self.registry, node_url, compute_check),
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
