"""The gpu-health and gpu-alerts contracts: strict like every topic's, committed, values defined once."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhealth.contract.training import TrainingAlert
from shared.contract.models import to_json
from shared.contract.models_health import (
    ALERT_SEVERITIES,
    ALERT_STATES,
    HEALTH_STATES,
    LADDER,
    SUBSYSTEMS,
    AlertOpened,
    AlertResolved,
    HealthVerdict,
    parse_alert,
    parse_health_verdict,
)
from shared.plumbing.errors import ContractError
from tests.paths import REPO

UUID = "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc"
VERDICT: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-22T18:00:00.123Z", "gpu_uuid": UUID, "hostname": "node-7",
    "subsystem": "xid", "state": "unhealthy", "previous": "healthy", "rule": "xid_79",
    "action": "reboot_node",
    "evidence": {"xid": 79, "name": "GPU has fallen off the bus", "count_in_window": 1, "window_s": 3600,
                 "repeats_counted": {"xid_79": ["2026-11-22T17:59:00Z"], "gpu_lost": []}, "ratio": 0.5,
                 "last_seen": None, "reasons": ["hw_slowdown"], "fell": True},
}  # fmt: skip
OPENED: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-22T18:00:00Z", "source": "scorer", "alert_id": 42, "gpu_uuid": UUID,
    "hostname": "node-7", "kind": "unhealthy_xid", "severity": "critical", "state": "open",
    "summary": "xid: xid_79", "evidence": {"xid": 79},
}  # fmt: skip
RESOLVED: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-22T18:10:00Z", "source": "scorer", "alert_id": 42, "gpu_uuid": UUID,
    "hostname": "", "kind": "unhealthy_xid", "state": "resolved",
}  # fmt: skip
TRAINING: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-22T12:00:00Z", "source": "training", "gpu_uuid": UUID,
    "gpu_index": 0, "kind": "thermal", "severity": "warning", "state": "open", "summary": "hot",
    "value": 90.0, "threshold": 82.0, "unit": "C", "job": {"id": "4242", "hostname": "node-7", "pid": 99},
}  # fmt: skip
MESSAGES = {"verdict": VERDICT, "opened": OPENED, "resolved": RESOLVED}


def parse(name: str, raw: str | bytes) -> Any:
    return parse_health_verdict(raw) if name == "verdict" else parse_alert(raw)


def test_every_schema_requires_its_version() -> None:
    for model in (HealthVerdict, AlertOpened, AlertResolved):  # committed by the registry's test
        schema = model.model_json_schema()
        assert schema["required"][0] == "schema_version"
        assert "default" not in schema["properties"]["schema_version"]
        assert schema["additionalProperties"] is False


def test_good_messages_parse_and_round_trip_with_the_one_time_format() -> None:
    verdict = parse_health_verdict(json.dumps(VERDICT))
    assert to_json(verdict)["time"] == "2026-11-22T18:00:00.123000Z"
    assert parse_health_verdict(json.dumps(to_json(verdict))) == verdict
    assert isinstance(parse_alert(json.dumps(OPENED)), AlertOpened)
    assert isinstance(parse_alert(json.dumps(RESOLVED)), AlertResolved)
    assert isinstance(parse_alert(json.dumps(TRAINING)), TrainingAlert)


def test_messages_the_scorer_wrote_before_the_contract_still_parse() -> None:
    # no `source` yet, `+00:00` times, and alerts' hostname added after the fact
    old_opened = {k: v for k, v in OPENED.items() if k != "source"} | {"time": "2026-11-22T18:00:00+00:00"}
    assert parse_alert(json.dumps(old_opened)) == parse_alert(json.dumps(OPENED))
    old_verdict = {**VERDICT, "time": "2026-11-22T20:00:00.123+02:00"}
    assert parse_health_verdict(json.dumps(old_verdict)) == parse_health_verdict(json.dumps(VERDICT))


@pytest.mark.parametrize(
    ("name", "change", "reason"),
    [
        ("verdict", {"schema_version": 2}, "unknown schema_version 2"),
        ("verdict", {"schema_version": True}, "schema_version"),
        ("verdict", {"subsystem": "gpu"}, "subsystem"),
        ("verdict", {"state": "fine"}, "state"),
        ("verdict", {"previous": "ok"}, "previous"),
        ("verdict", {"action": "pray"}, "action"),
        ("verdict", {"gpu_uuid": "GPU-x"}, "gpu_uuid"),
        ("verdict", {"time": "1970-01-01T00:00:00Z"}, "time"),
        ("verdict", {"time": "2026-11-22T18:00:00"}, "time"),
        ("verdict", {"evidence": {"bad key": 1}}, "evidence"),
        ("verdict", {"evidence": {"x": {"y": {"z": "a\u0000b"}}}}, "evidence"),
        ("verdict", {"evidence": {"x": [1] * 1001}}, "evidence"),
        ("verdict", {"rule": "a rule"}, "rule"),
        ("verdict", {"surprise": 1}, "surprise"),
        ("opened", {"alert_id": 0}, "alert_id"),
        ("opened", {"alert_id": "42"}, "alert_id"),
        ("opened", {"severity": "doom"}, "severity"),
        ("opened", {"summary": ""}, "summary"),
        ("opened", {"hostname": "node\n7"}, "hostname"),
        ("resolved", {"summary": "extra"}, "summary"),
        ("resolved", {"state": "acknowledged"}, "state"),
        ("resolved", {"source": "pager"}, "source"),
    ],
)
def test_hostile_messages_are_refused_with_the_field_named(
    name: str, change: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ContractError, match=reason):
        parse(name, json.dumps({**MESSAGES[name], **change}))


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_schema_version_is_required_on_the_wire(name: str) -> None:
    without = {k: v for k, v in MESSAGES[name].items() if k != "schema_version"}
    with pytest.raises(ContractError, match="schema_version is required"):
        parse(name, json.dumps(without))


@pytest.mark.parametrize(
    "raw",
    [b"", b"not json", b"[1, 2]", b"null", b'{"state": "open"', b"{" * 100 + b"}" * 100, b"x" * 1_000_001],
)
def test_what_is_not_a_message_is_refused(raw: bytes) -> None:
    for name in MESSAGES:
        with pytest.raises(ContractError):
            parse(name, raw)


def nested_value(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
        max_leaves=12,
    )


HOSTILE_TEXT = st.text(max_size=12) | st.sampled_from(["\x00", "\ud800", "a\udfffb", "x" * 2000, "", " "])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(MESSAGES)),
    data=st.data(),
)
def test_any_field_replaced_by_anything_parses_to_a_valid_message_or_is_a_contract_error(
    name: str, data: st.DataObject
) -> None:
    message = dict(MESSAGES[name])
    field = data.draw(st.sampled_from([*message, "extra"]))
    message[field] = data.draw(nested_value(HOSTILE_TEXT))
    raw = json.dumps(message)  # NaN/Infinity tokens and lone surrogates as a hostile producer writes them
    try:
        parsed = parse(name, raw)
    except ContractError as e:
        assert str(e)  # noqa: PT017 (any field, any value: refusing is one of the two right outcomes)
        return
    # What is accepted is a message its consumers and the database can hold, and it round-trips.
    text = json.dumps(to_json(parsed), allow_nan=False)
    assert "\\u0000" not in text
    text.encode("utf-8")  # no lone surrogate
    assert parse(name, text) == parsed


@settings(max_examples=200, deadline=None)
@given(key=HOSTILE_TEXT, value=nested_value(HOSTILE_TEXT))
def test_evidence_holds_only_what_jsonb_stores_and_json_carries(key: str, value: Any) -> None:
    raw = json.dumps({**VERDICT, "evidence": {key: value}})
    try:
        parsed = parse_health_verdict(raw)
    except ContractError:
        return
    dumped = json.dumps(to_json(parsed), allow_nan=False, ensure_ascii=False)
    assert "\x00" not in dumped
    dumped.encode("utf-8")


def check_values(column: str) -> list[tuple[str, ...]]:
    """The values each CHECK (<column> IN (...)) of the health migration allows."""
    sql = (REPO / "schema" / "0004_health.sql").read_text()
    found = re.findall(rf"CHECK \({column} IN \(([^)]*)\)\)", sql)
    return [tuple(re.findall(r"'([a-z_]+)'", values)) for values in found]


def test_the_contract_values_are_the_databases() -> None:
    assert check_values("state")[:3] == [HEALTH_STATES] * 3  # gpu_health, gpu_health_current, gpu_status
    assert check_values("state")[3:] == [ALERT_STATES]  # gpu_alerts
    assert check_values("severity") == [ALERT_SEVERITIES]
    assert HealthVerdict.model_json_schema()["properties"]["subsystem"]["enum"] == list(SUBSYSTEMS)
    assert HealthVerdict.model_json_schema()["properties"]["action"]["enum"] == list(LADDER)
