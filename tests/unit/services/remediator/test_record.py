"""The record: each row is what the gpu-remediations contract carries; drivers' answers are bounded to fit."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.remediator.record import as_record, event
from shared.contract.models import to_json
from shared.contract.models_remediation import parse_remediation
from shared.contract.topic_registry import TopicSettings
from shared.plumbing.errors import ContractError

T = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
GPU = "GPU-00000001-0000-4000-8000-000000000000"
PLAN = {
    "id": 3,
    "node": "gpu-node-01",
    "action": "reset_gpu",
    "gpu_uuids": [GPU],
    "detail": {"answers": {"decision_key": "k", "topic": "gpu-health", "message": {"rule": "xid_79"}}},
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=3000)
    | st.integers(2**63, 2**70)
    | st.just(float("nan"))
    | st.builds(object),
    lambda inner: st.lists(inner, max_size=150) | st.dictionaries(st.text(max_size=200), inner, max_size=80),
    max_leaves=400,
)


def test_an_event_of_a_plan_names_its_node_action_gpu_and_what_it_answers() -> None:
    row = event(
        "action",
        at=T,
        status="ok",
        dry_run=False,
        plan=PLAN,
        step="cordon",
        driver="kubernetes",
        response={"cordoned": True},
        seconds=0.25,
    )
    record = as_record(row)
    assert (record.node, record.action, record.gpu_uuid, record.remediation_id) == (
        "gpu-node-01",
        "reset_gpu",
        GPU,
        3,
    )
    assert record.answers is not None
    assert record.answers.decision_key == "k"
    assert TopicSettings.entry("remediations").key_of(record) == GPU
    assert parse_remediation(json.dumps(to_json(record))) == record


def test_a_fleet_record_is_keyed_fleet() -> None:
    record = as_record(event("breaker", at=T, status="tripped", dry_run=True, reason="11 nodes"))
    assert TopicSettings.entry("remediations").key_of(record) == "fleet"


@given(json_values)
def test_any_driver_answer_is_bounded_to_what_the_contract_carries(response: Any) -> None:
    row = event("action", at=T, status="failed", dry_run=False, plan=PLAN, response={"answer": response})
    assert "answer" in as_record(row).response


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"status": "exploded"}, "status"),
        ({"kind": "rumour"}, "kind"),
        ({"step": "format"}, "step"),
        ({"seconds": -1.0}, "seconds"),
        ({"node": "a\nb"}, "node"),
    ],
)
def test_a_record_the_topic_cannot_carry_is_refused_before_it_is_written(
    changes: dict[str, Any], field: str
) -> None:
    fields: dict[str, Any] = {"at": T, "status": "ok", "dry_run": False, "node": "n"} | changes
    kind = fields.pop("kind", "action")
    with pytest.raises(ContractError, match=field):
        event(kind, **fields)


@pytest.mark.parametrize(
    "raw",
    [b"{}", b'{"schema_version": 2}', b"[1]", b"\xff", b'{"schema_version": 1, "surprise": 1}'],
)
def test_hostile_messages_are_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(ContractError):
        parse_remediation(raw)
