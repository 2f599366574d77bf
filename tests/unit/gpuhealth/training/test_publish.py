"""The job's Prometheus metrics under a chosen prefix, and the gpu-alerts message it publishes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth.contract.training import TrainingAlert, TrainingJob, parse_training_alert
from gpuhealth.training import (
    Alert,
    AlertKind,
    AlertPublisher,
    Andon,
    AndonChecker,
    AndonExporter,
    GpuMonitor,
)
from gpuhealth.training.publish import ALERTS_TOPIC, PublisherSettings, alert_message, job_from_env
from shared.fakes.scripted_nvml import ScriptedNvml
from shared.plumbing.errors import ConfigError, ContractError
from shared.settings.common import Settings

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_exporter_serves_the_gpus_and_alerts_under_its_prefix() -> None:
    nvml = ScriptedNvml()
    nvml.temp_c = [91, 50]
    exporter = AndonExporter(prefix="myjob")
    andon = Andon(monitor=GpuMonitor(nvml=nvml, devices=[0, 1]), checker=AndonChecker(), exporter=exporter)
    port = exporter.serve(0)
    try:
        andon.check_now()
        got = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
    finally:
        andon.close()
    gpu0 = (("gpu", "0"), ("uuid", UUID))
    assert got[("myjob_gpu_temp_celsius", gpu0)] == 91
    assert got[("myjob_gpu_util_ratio", gpu0)] == 0.9
    assert got[("myjob_gpu_memory_used_ratio", gpu0)] == 0.5
    assert got[("myjob_gpu_power_watts", gpu0)] == 300
    assert got[("myjob_gpu_power_limit_watts", gpu0)] == 700
    assert got[("myjob_alerts_total", (("kind", "thermal"), ("severity", "critical")))] == 1
    assert got[("myjob_alerts_open", (("kind", "thermal"),))] == 1
    assert got[("myjob_alerts_open", (("kind", "idle"),))] == 0
    assert got[("myjob_checks_total", ())] == 1
    assert not [name for name, _ in got if not name.startswith("myjob_")]


@given(st.text(max_size=30))
def test_only_valid_metric_prefixes_are_taken(prefix: str) -> None:
    try:
        exporter = AndonExporter(prefix=prefix)
    except ValueError:
        return
    assert exporter.prefix.endswith("_")
    assert all(f.name.startswith(exporter.prefix) for f in exporter.registry.collect())


def alert(**changes: Any) -> Alert:
    base: dict[str, Any] = dict(
        kind=AlertKind.THERMAL, severity="critical", gpu_index=0, gpu_uuid=UUID, value=90.0, threshold=82.0,
        unit="C", summary="thermal: 90 °C, limit 82 °C", time=datetime(2026, 11, 22, 12, 0, tzinfo=UTC),
        evidence={"slowdown_c": 87.0, "reasons": ["hw_thermal_slowdown"]},
    )  # fmt: skip
    return Alert(**(base | changes))


def test_job_identity_comes_from_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    job = job_from_env({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "llama-ft", "RANK": "3"})
    assert (job.id, job.name, job.rank) == ("4242", "llama-ft", 3)
    assert job_from_env({"GPUHEALTH_JOB_ID": "mine", "SLURM_JOB_ID": "1"}, name="x").id == "mine"
    fallback = job_from_env({})
    assert fallback.id == f"{fallback.hostname}-{fallback.pid}"
    assert fallback.rank is None


class RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, Any]] = []
        self.flushed = False

    def produce(self, topic: str, key: str | None, value: Any) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout_s: float = 30.0) -> int:
        self.flushed = True
        return 0


def test_published_alerts_are_valid_training_messages_keyed_by_gpu() -> None:
    producer = RecordingProducer()
    job = TrainingJob(id="4242", name="llama-ft", hostname="node-7", pid=99, rank=0)
    publisher = AlertPublisher(producer, topic="alerts-x", job=job)
    publisher.publish(alert(), "open")
    publisher.publish(alert(), "resolved")
    publisher.close()
    assert producer.flushed
    assert publisher.published == 2
    (topic, key, value), (_, _, resolved) = producer.sent
    assert (topic, key) == ("alerts-x", UUID)
    msg = parse_training_alert(json.dumps(value))
    assert (msg.source, msg.kind, msg.state, msg.value, msg.threshold, msg.job.id) == (
        "training", "thermal", "open", 90.0, 82.0, "4242",
    )  # fmt: skip
    assert value["time"] == "2026-11-22T12:00:00Z"
    assert resolved["state"] == "resolved"


@given(value=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
       summary=st.text(max_size=600), uuid=st.text(max_size=20))  # fmt: skip
def test_a_message_that_breaks_the_contract_is_refused(value: float | None, summary: str, uuid: str) -> None:
    job = TrainingJob(id="j", hostname="h", pid=1)
    try:
        msg = alert_message(alert(value=value, summary=summary, gpu_uuid=uuid), "open", job)
    except ValueError:  # pydantic's ValidationError
        return
    assert msg.value is None or abs(msg.value) <= 1e15
    assert 1 <= len(msg.summary) <= 500
    assert msg.gpu_uuid.startswith(("GPU-", "MIG-"))
    assert parse_training_alert(msg.model_dump_json()) == msg


def test_unknown_versions_and_kinds_are_refused() -> None:
    good = alert_message(alert(), "open", TrainingJob(id="j", hostname="h", pid=1)).model_dump(mode="json")
    assert isinstance(parse_training_alert(json.dumps(good)), TrainingAlert)
    for bad in (
        {**good, "schema_version": 2},
        {**good, "kind": "xid"},
        {**good, "source": "scorer"},
        {**good, "x": 1},
    ):
        with pytest.raises(ContractError):
            parse_training_alert(json.dumps(bad))


def test_a_training_alert_without_schema_version_is_refused_on_the_wire() -> None:
    good = alert_message(alert(), "open", TrainingJob(id="j", hostname="h", pid=1)).model_dump(mode="json")
    assert good["schema_version"] == 1  # built in Python: the version this code writes
    unstated = {k: v for k, v in good.items() if k != "schema_version"}
    with pytest.raises(ContractError, match="schema_version is required"):
        parse_training_alert(json.dumps(unstated))


def test_the_publisher_reads_the_services_kafka_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().topics.alerts == ALERTS_TOPIC  # one default name for both
    monkeypatch.setenv("GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS", "broker-9:9093")
    monkeypatch.setenv("GPUHEALTH_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("GPUHEALTH_TOPICS__ALERTS", "team-alerts")
    monkeypatch.setenv("GPUHEALTH_DB__HOST", "db-1")  # another section: the services' alone
    ours, theirs = PublisherSettings(), Settings()
    assert ours.kafka == theirs.kafka
    assert ours.topics.alerts == theirs.topics.alerts == "team-alerts"


def test_bad_publisher_settings_are_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEALTH_KAFKA__EXTRA", "not a JSON object")
    with pytest.raises(ConfigError, match="alert publisher"):
        AlertPublisher.connect()
