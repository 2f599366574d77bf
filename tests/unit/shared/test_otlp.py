"""OTLP export: when it is on, what the Prometheus registries become, and the GPU instruments."""

from __future__ import annotations

import math
import socket
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from prometheus_client import CollectorRegistry, Counter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram

from services.collector.gpu_otlp import PREFIX, GpuInstruments, gpu_attributes, unit_of
from shared.contract.models import GpuSample, Source
from shared.gpu.dcgm import FIELDS, PromType
from shared.plumbing import otlp
from shared.plumbing.errors import ConfigError
from shared.plumbing.otlp import OtlpExport, OtlpSection, make_exporter, otlp_target, service_resource
from shared.plumbing.otlp_prometheus import per_bucket, registry_metrics
from tests.helpers.otlp_receiver import grpc_receiver, http_receiver

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
env_values = st.one_of(
    st.text(max_size=12), st.sampled_from(["true", "TRUE ", "false", "none", "grpc", "1500"])
)
# The machine running the suite may be busy: slow generation is not a failure here.
relaxed = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
env_names = st.sampled_from([
    "OTEL_SDK_DISABLED", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_METRIC_EXPORT_INTERVAL",
])  # fmt: skip


def test_off_by_default() -> None:
    assert otlp_target(OtlpSection(), {}) is None
    assert otlp_target(OtlpSection(enabled=False), ENDPOINT) is None


def test_an_endpoint_or_the_switch_turns_it_on_with_the_standard_defaults() -> None:
    assert otlp_target(OtlpSection(), ENDPOINT) == otlp.OtlpTarget("http/protobuf", 60.0, 30.0)
    target = otlp_target(
        OtlpSection(enabled=True),
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
         "OTEL_METRIC_EXPORT_INTERVAL": "1500", "OTEL_METRIC_EXPORT_TIMEOUT": "2000"},
    )  # fmt: skip
    assert target == otlp.OtlpTarget("grpc", 1.5, 2.0)  # the signal-specific variable wins


@relaxed
@given(env=st.dictionaries(env_names, env_values), enabled=st.booleans())
def test_sdk_disabled_always_wins(env: dict[str, str], enabled: bool) -> None:
    env = {**env, "OTEL_SDK_DISABLED": "true"}
    assert otlp_target(OtlpSection(enabled=enabled), env) is None


@relaxed
@given(
    env=st.dictionaries(env_names, env_values),
    enabled=st.sampled_from([None, True]),
)
def test_any_environment_gives_a_target_or_a_clear_config_error(
    env: dict[str, str], enabled: bool | None
) -> None:
    try:
        target = otlp_target(OtlpSection(enabled=enabled), env)
    except ConfigError as e:
        message = str(e)
        target = None
        assert "OTEL_" in message or "protocol" in message
    if target is not None:
        assert target.protocol in otlp.PROTOCOLS
        assert 0 < target.interval_s < 86_400
        assert env.get("OTEL_SDK_DISABLED", "").strip().lower() != "true"


@pytest.mark.parametrize(
    "env",
    [{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, {"OTEL_METRIC_EXPORT_INTERVAL": "soon"},
     {"OTEL_METRIC_EXPORT_INTERVAL": "0"}, {"OTEL_METRIC_EXPORT_TIMEOUT": "-5"}],
)  # fmt: skip
def test_invalid_standard_variables_are_config_errors(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        otlp_target(OtlpSection(enabled=True), env)


def test_the_resource_names_the_service_and_lets_the_standard_variables_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,host.name=override")
    attrs = service_resource("scorer").attributes
    assert attrs["service.name"] == "gpuhealth-scorer"
    assert attrs["service.version"] == otlp.project_version() != "0+unknown"
    assert attrs["deployment.environment"] == "prod"
    assert attrs["host.name"] == "override"


@relaxed
@given(st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=12))
def test_cumulative_buckets_become_per_bucket_counts_that_add_up(increments: list[int]) -> None:
    bounds = [0.001 * 2**i for i in range(len(increments) - 1)]
    cumulative, total = [], 0
    for le, inc in zip([*bounds, math.inf], increments, strict=True):
        total += inc
        cumulative.append((le, float(total)))
    got_bounds, counts = per_bucket(reversed(cumulative))  # any order in, sorted out
    assert got_bounds == bounds
    assert counts == increments
    assert sum(counts) == total


label_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)


@relaxed
@given(rows=st.dictionaries(label_text, st.integers(min_value=0, max_value=2**40), max_size=5),
       level=st.floats(allow_nan=False, allow_infinity=False, width=64))  # fmt: skip
def test_a_registry_converts_with_its_labels_and_values(rows: dict[str, int], level: float) -> None:
    registry = CollectorRegistry()
    written = Counter("rows_written", "Rows", ["table"], registry=registry)
    for table, n in rows.items():
        written.labels(table).inc(n)
    PromGauge("lag", "Lag", registry=registry).set(level)
    PromHistogram("batch_seconds", "Time", registry=registry, buckets=(0.1, 1.0)).observe(0.5)
    metrics = {m.name: m for m in registry_metrics(registry, start_ns=1, now_ns=2)}
    if rows:
        counter = metrics["rows_written"].data
        assert isinstance(counter, Sum)
        assert counter.is_monotonic
        assert {p.attributes["table"]: p.value for p in counter.data_points} == rows  # type: ignore[index]
        assert all(p.start_time_unix_nano > 1 for p in counter.data_points)  # from _created
    else:
        assert "rows_written" not in metrics  # a labelled family with no child has no point
    gauge = metrics["lag"].data
    assert isinstance(gauge, Gauge)
    assert gauge.data_points[0].value == level
    hist = metrics["batch_seconds"].data
    assert isinstance(hist, Histogram)
    assert list(hist.data_points[0].bucket_counts) == [0, 1, 0]
    assert (hist.data_points[0].count, hist.data_points[0].sum) == (1, 0.5)


def sample(**fields: Any) -> GpuSample:
    base: dict[str, Any] = {
        "time": datetime(2026, 11, 1, tzinfo=UTC), "source": Source.NVML, "collector_id": "c",
        "collection_latency_ms": 1.0, "gpu_uuid": "GPU-12345678-aaaa", "gpu_index": 3, "model": "H100",
        "hostname": "node-1", "cluster": "c1", "rack": "r2", "pod": "train-0",
    }  # fmt: skip
    return GpuSample(**{**base, **fields})


def test_gpu_attributes_carry_identity_and_placement_and_skip_unset() -> None:
    attrs = gpu_attributes(sample(pci_bus_id="00000000:18:00.0"))
    assert attrs == {
        "gpu.uuid": "GPU-12345678-aaaa", "gpu.index": 3, "gpu.model": "H100", "gpu.source": "nvml",
        "host.name": "node-1", "cluster": "c1", "rack": "r2", "k8s.pod.name": "train-0",
        "gpu.pci_bus_id": "00000000:18:00.0",
    }  # fmt: skip


def test_units_follow_the_field_suffix() -> None:
    assert [unit_of(f) for f in ("gpu_temp_c", "power_usage_w", "fb_used_mib", "pcie_tx_bytes_per_s")] == [
        "Cel", "W", "MiBy", "By/s",
    ]  # fmt: skip
    assert unit_of("ecc_dbe_volatile_total") == "1"


@relaxed
@given(temp=st.one_of(st.none(), st.floats(min_value=-60, max_value=250)), sbe=st.integers(0, 2**62))
def test_gpu_instruments_observe_the_latest_sample_and_forget_stale_gpus(
    temp: float | None, sbe: int
) -> None:
    now = [0.0]
    reader = InMemoryMetricReader()
    instruments = GpuInstruments(
        MeterProvider(metric_readers=[reader]).get_meter("t"), stale_after_s=60, clock=lambda: now[0]
    )
    instruments.observe([sample(gpu_temp_c=20.0, ecc_sbe_volatile_total=0)])
    instruments.observe([sample(gpu_temp_c=temp, ecc_sbe_volatile_total=sbe)])
    data = reader.get_metrics_data()
    assert data is not None
    metrics = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
    kinds = {f.sample_field: f.prom_type for f in FIELDS}
    assert all(
        isinstance(m.data, Sum) == (kinds[m.name.removeprefix(PREFIX)] is PromType.COUNTER)
        for m in metrics.values()
    )
    sbe_points = metrics[PREFIX + "ecc_sbe_volatile_total"].data.data_points
    assert [getattr(p, "value", None) for p in sbe_points] == [sbe]
    assert sbe_points[0].attributes["gpu.uuid"] == "GPU-12345678-aaaa"  # type: ignore[index]
    if temp is None:
        assert PREFIX + "gpu_temp_c" not in metrics  # an unreported value is not exported as a number
    else:
        assert [getattr(p, "value", None) for p in metrics[PREFIX + "gpu_temp_c"].data.data_points] == [temp]
    now[0] = 61.0
    later = reader.get_metrics_data()
    assert later is None or not any(
        m.name == PREFIX + "gpu_temp_c" and m.data.data_points
        for s in later.resource_metrics[0].scope_metrics
        for m in s.metrics
    )


@pytest.mark.parametrize(
    ("protocol", "receiver"), [("grpc", grpc_receiver), ("http/protobuf", http_receiver)]
)
def test_the_export_reaches_a_receiver_and_shutdown_flushes(
    protocol: otlp.Protocol, receiver: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with receiver() as (endpoint, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        registry = CollectorRegistry()
        Counter("jobs", "Jobs", registry=registry).inc(3)
        export = OtlpExport(
            resource=service_resource("api"), exporter=make_exporter(protocol), interval_s=3600, timeout_s=5
        )
        export.start()
        export.add_registry(registry)
        export.shutdown()  # no interval passed: only the flush can have sent it
        points = received.wait_for(lambda ps: any(p.metric == "jobs" for p in ps), timeout_s=10)
    assert [(p.value, p.monotonic, p.resource["service.name"]) for p in points if p.metric == "jobs"] == [
        (3, True, "gpuhealth-api")
    ]
    assert export.exports == {"ok": 1, "failed": 0}
    assert not export.export_once()  # closed: nothing more is sent


def test_an_unreachable_receiver_counts_a_failure_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    export = OtlpExport(
        resource=service_resource("api"),
        exporter=make_exporter("http/protobuf"),
        interval_s=3600,
        timeout_s=1,
    )
    assert export.export_once() is False
    assert export.exports["failed"] == 1


def test_an_invalid_exporter_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="OTLP exporter"):
        otlp.start_export("api", OtlpSection(enabled=True, protocol="grpc"))
    assert otlp.meter("x") is None  # nothing half-started


def test_a_receiver_that_hangs_cannot_hold_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
        export = OtlpExport(
            resource=service_resource("api"),
            exporter=make_exporter("http/protobuf"),
            interval_s=0.05,
            timeout_s=60,
        )
        export.start()
        listener.settimeout(30)
        connection, _ = listener.accept()  # the periodic export is now stuck on the silent receiver
        started = time.monotonic()
        export.shutdown()
        assert time.monotonic() - started < otlp.FLUSH_TIMEOUT_S * 3
        connection.close()
    assert export.exports["ok"] == 0
