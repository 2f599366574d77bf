"""Every message of every topic writes its times one way (`...Z`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gpuhealth.contract.training import parse_training_alert
from gpuhealth.contract.wire_time import wire_time
from shared.contract import models
from shared.contract.models_deadletter import (
    DeadLetterHeaders,
    dead_letter_headers,
    parse_dead_letter_headers,
)
from shared.contract.models_health import parse_alert, parse_health_verdict
from shared.contract.models_lifecycle import parse_lifecycle_decision
from shared.contract.models_remediation import parse_remediation
from shared.contract.models_verify import (
    HostIdentity,
    SystemIdentity,
    parse_system,
    parse_verification,
    record_json,
)
from shared.contract.models_workload import parse_gpu_processes, parse_llm_message
from shared.contract.topic_registry import TopicSettings

UUID = "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc"
WIRE_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{6})?Z$")
T = "2026-11-22T18:00:00Z"  # replaced by each example's drawn time

SYSTEM: dict[str, Any] = {
    "schema_version": 1, "time": T, "hostname": "node-1", "source": "none", "collector_id": None,
    "host": HostIdentity(cpu_model="x").model_dump(mode="json"), "driver_version": None,
    "cuda_driver_version": None, "nvml_version": None,
    "gpus": [], "p2p": None,
}  # fmt: skip
SYSTEM["identity_sha256"] = SystemIdentity.identity_digest(SYSTEM)

# One message of every model of every topic, as JSON, with the paths of its times.
EXAMPLES: dict[str, tuple[Callable[[bytes], BaseModel], dict[str, Any], list[tuple[str | int, ...]]]] = {
    "sample": (models.parse_sample, {
        "schema_version": 1, "time": T, "source": "dcgm", "collector_id": "c1", "collection_latency_ms": 3.5,
        "gpu_uuid": UUID, "gpu_index": 0, "model": "NVIDIA H100 80GB HBM3", "hostname": "node-1",
    }, [("time",)]),
    "event": (models.parse_event, {
        "schema_version": 1, "time": T, "kind": "gpu_back", "gpu_uuid": UUID, "hostname": "n1",
        "source": "mock", "collector_id": "c",
    }, [("time",)]),
    "verdict": (parse_health_verdict, {
        "schema_version": 1, "time": T, "gpu_uuid": UUID, "hostname": "n1", "subsystem": "memory",
        "state": "unhealthy", "previous": None, "rule": "volatile_dbe", "action": "reset_gpu", "evidence": {},
    }, [("time",)]),
    "alert_opened": (parse_alert, {
        "schema_version": 1, "time": T, "alert_id": 1, "gpu_uuid": UUID, "hostname": "n1", "kind": "thermal",
        "severity": "warning", "state": "open", "summary": "near the slowdown temperature", "evidence": {},
    }, [("time",)]),
    "alert_resolved": (parse_alert, {
        "schema_version": 1, "time": T, "alert_id": 1, "gpu_uuid": UUID, "hostname": "n1", "kind": "thermal",
        "state": "resolved",
    }, [("time",)]),
    "training_alert": (parse_training_alert, {
        "schema_version": 1, "time": T, "source": "training", "gpu_uuid": UUID, "gpu_index": 0,
        "kind": "thermal", "severity": "warning", "state": "open", "summary": "hot", "value": 90.0,
        "threshold": 82.0, "unit": "C", "job": {"id": "4242", "hostname": "node-7", "pid": 99},
    }, [("time",)]),
    "processes": (parse_gpu_processes, {
        "schema_version": 1, "time": T, "source": "nvml", "collector_id": "node-1", "hostname": "node-1",
        "gpu_uuid": UUID, "gpu_index": 0, "processes": [
            {"pid": 42, "type": "compute", "classification": "training", "rule": "r", "start_time": T},
        ],
    }, [("time",), ("processes", 0, "start_time")]),
    "llm_session": (parse_llm_message, {
        "schema_version": 1, "kind": "session", "request_id": "0" * 32, "time": T, "source": "proxy",
        "monitor_id": "mon", "server": "ollama", "endpoint": "/api/generate", "model": "m", "streamed": True,
        "http_status": 200, "ok": True, "wall_ms": 12.5,
    }, [("time",)]),
    "llm_server": (parse_llm_message, {
        "schema_version": 1, "kind": "server", "time": T, "monitor_id": "mon", "server": "ollama",
        "engine": "ollama", "up": True, "models": [{"name": "m", "expires_at": T}],
    }, [("time",), ("models", 0, "expires_at")]),
    "verification": (parse_verification, {
        "schema_version": 1, "kind": "operation", "time": T, "gpu_uuid": UUID, "seq": 0,
        "prev_sha256": "0" * 64, "hostname": "n1", "verifier_id": "v", "name": "op", "device": "cuda:0",
        "outcome": "recorded",
    }, [("time",)]),
    "system": (parse_system, SYSTEM, [("time",)]),
    "remediation": (parse_remediation, {
        "schema_version": 1, "time": T, "record_id": "6f1c4a2e-0b9d-4c3e-8f7a-1d2e3f4a5b6c", "kind": "action",
        "remediation_id": 1, "gpu_uuid": UUID, "node": "n1", "action": "reset_gpu", "step": "cordon",
        "driver": "kubernetes", "status": "ok", "dry_run": False, "reason": None, "seconds": 0.1,
        "answers": None, "response": {},
    }, [("time",)]),
    "lifecycle": (parse_lifecycle_decision, {
        "schema_version": 1, "time": T, "gpu_uuid": UUID, "serial": None, "hostname": "n1", "model": None,
        "decision": "rma", "expected_cost": 1440.13, "keep_cost": 2412.24, "cost_of_waiting_per_day": 32.4,
        "p_fail_30d": 0.3, "warranty_end": "2026-12-01", "currency": "USD", "horizon_days": 30.0, "why": "w",
        "options": [{"option": "rma", "expected_cost": 1440.13, "parts": {"downtime": 861.34}, "note": ""}],
        "terms": [{"name": "p_fail_30d", "value": 0.3, "source": "predictor"}],
        "missing": [{"input": "spares on hand", "assumed": False, "effect": "rma from False to True"}],
    }, [("time",)]),
}  # fmt: skip


def test_every_message_of_every_topic_has_an_example_here() -> None:
    """So the time-format test below covers each (a dead letter's value is another topic's record)."""
    values = {m.model for r in TopicSettings.registry() for m in r.topic.messages if m.part == "value"}
    assert values == {type(parse(json.dumps(example).encode())) for parse, example, _ in EXAMPLES.values()}


def at(message: dict[str, Any], path: tuple[str | int, ...]) -> Any:
    for step in path:
        message = message[step]  # type: ignore[index]
    return message


def put(message: dict[str, Any], path: tuple[str | int, ...], value: str) -> None:
    at(message, path[:-1])[path[-1]] = value


OFFSETS = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda m: timezone(timedelta(minutes=m)))
TIMES = st.datetimes(
    min_value=datetime(2001, 1, 1), max_value=datetime(2027, 1, 1), timezones=st.just(UTC) | OFFSETS
)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(EXAMPLES)), when=TIMES)
def test_every_message_of_every_topic_writes_its_times_utc_with_a_z(name: str, when: datetime) -> None:
    parse, example, paths = EXAMPLES[name]
    message = json.loads(json.dumps(example))
    for path in paths:
        put(message, path, when.isoformat())  # a producer's offset and microseconds, as it had them
    parsed = parse(json.dumps(message).encode())
    wire = record_json(parsed) if name in ("verification", "system") else models.to_json(parsed)
    expected = when.astimezone(UTC).replace(microsecond=when.microsecond // 1000 * 1000)  # the contract: ms
    for path in paths:
        written = at(wire, path)
        assert WIRE_TIME.match(written), written
        assert written == wire_time(expected)
        assert datetime.fromisoformat(written) == expected


@settings(max_examples=200, deadline=None)
@given(when=TIMES, offset=st.integers(0, 2**40), cut=st.booleans())
def test_dead_letter_headers_write_their_time_the_same_way_and_round_trip(
    when: datetime, offset: int, cut: bool
) -> None:
    headers = DeadLetterHeaders(
        consumer_group="sink", source_topic="gpu-metrics-raw", source_partition=3, source_offset=offset,
        category="contract", error="time: not a plausible sample time", failed_at=when,
        value_truncated_from=2_000_000 if cut else None,
    )  # fmt: skip
    wire = dead_letter_headers(headers)
    failed_at = dict(wire)["dlq.failed_at"]
    assert isinstance(failed_at, bytes)
    assert WIRE_TIME.match(failed_at.decode())
    assert parse_dead_letter_headers([(k, v if isinstance(v, bytes) else None) for k, v in wire]) == headers
    assert ("dlq.value_truncated_from" in dict(wire)) is cut


@settings(max_examples=300, deadline=None)
@given(when=st.datetimes(datetime(1000, 1, 2), datetime(9999, 12, 30), timezones=st.just(UTC) | OFFSETS))
def test_wire_time_is_the_same_instant_in_utc_with_a_z(when: datetime) -> None:
    written = wire_time(when)
    assert WIRE_TIME.match(written), written
    assert written.endswith("Z")
    assert "+" not in written
    assert datetime.fromisoformat(written) == when


def test_a_time_without_a_timezone_has_no_wire_form() -> None:
    with pytest.raises(ValueError, match="timezone"):
        wire_time(datetime(2026, 11, 22, 18, 0))
