"""OTLP metric receivers for tests: gRPC (grpcio + opentelemetry-proto) and HTTP/protobuf.

Both decode each ExportMetricsServiceRequest with the opentelemetry-proto
package's generated classes and keep flat points a test can search.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class Point:
    """One data point as received, with its resource and metric around it."""

    resource: dict[str, Any]
    scope: str
    metric: str
    kind: str  # gauge | sum | histogram
    attributes: dict[str, Any]
    value: float
    monotonic: bool = False
    unit: str = ""
    bucket_counts: tuple[int, ...] = ()


def _any(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any(kv.value) for kv in kvs}


def flatten(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[Point]:
    points: list[Point] = []
    for rm in request.resource_metrics:
        resource = _attrs(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                base = {"resource": resource, "scope": sm.scope.name, "metric": m.name, "unit": m.unit}
                if kind in ("gauge", "sum"):
                    data = getattr(m, kind)
                    for dp in data.data_points:
                        value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                        monotonic = kind == "sum" and data.is_monotonic
                        points.append(Point(**base, kind=kind, attributes=_attrs(dp.attributes),
                                            value=value, monotonic=monotonic))  # fmt: skip
                elif kind == "histogram":
                    for dp in m.histogram.data_points:
                        counts = tuple(dp.bucket_counts)
                        points.append(Point(**base, kind=kind, attributes=_attrs(dp.attributes),
                                            value=dp.count, bucket_counts=counts))  # fmt: skip
    return points


class Received:
    """Everything a receiver got, thread-safe, with a wait on a condition."""

    def __init__(self) -> None:
        self._points: list[Point] = []
        self._cond = threading.Condition()
        self.requests = 0

    def add(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self._cond:
            self._points.extend(flatten(request))
            self.requests += 1
            self._cond.notify_all()

    def points(self) -> list[Point]:
        with self._cond:
            return list(self._points)

    def wait_for(self, check: Callable[[list[Point]], bool], timeout_s: float = 30) -> list[Point]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not check(self._points):
                left = deadline - time.monotonic()
                assert left > 0, f"the receiver did not get what was expected within {timeout_s} s"
                self._cond.wait(left)
            return list(self._points)


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(
        self, request: metrics_service_pb2.ExportMetricsServiceRequest, context: Any
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        self.received.add(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@contextmanager
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/gRPC metrics receiver on a free loopback port: (endpoint URL, what it received)."""
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service = _MetricsService(received)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


@contextmanager
def http_receiver() -> Iterator[tuple[str, Received]]:
    """An OTLP/HTTP (protobuf) receiver answering POST /v1/metrics: (base endpoint URL, received)."""
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            encoding = (self.headers.get("Content-Encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if self.path != "/v1/metrics" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404 if self.path != "/v1/metrics" else 415)
                self.end_headers()
                return
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            request.ParseFromString(body)
            received.add(request)
            reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
