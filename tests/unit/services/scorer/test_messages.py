"""Every verdict change and alert the scorer can decide is a valid message of its topic, and round-trips."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.scorer.cycle import desired_alerts
from services.scorer.features import GpuFeatures, XidCounts
from services.scorer.messages import alert_opened, alert_resolved, named, verdict_changed
from services.scorer.rules import evaluate
from services.scorer.rules_config import load_rules
from shared.contract.models import to_json
from shared.contract.models_health import HEALTH_STATES, SUBSYSTEMS, parse_alert, parse_health_verdict

RULES = load_rules()
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
UUID = "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc"
STAMP = st.datetimes(datetime(2026, 10, 1), datetime(2026, 11, 21), timezones=st.just(UTC)).map(
    lambda t: t.isoformat()  # lost/XID times as an older scorer wrote them: the contract takes either form
)
COUNT = st.integers(0, 10**6)

FEATURES = st.builds(
    GpuFeatures,
    gpu_uuid=st.just(UUID),
    hostname=st.sampled_from(["node-7", ""]),
    model=st.just("NVIDIA H100 80GB HBM3"),
    last_time=st.none() | st.integers(0, 7200).map(lambda s: NOW - timedelta(seconds=s)),
    slowdown_c=st.floats(60, 100),
    power_limit_w=st.none() | st.floats(100, 1000),
    fb_total_mib=st.none() | st.integers(0, 200_000),
    pod=st.none() | st.sampled_from(["train-0", "llama-ft-worker-3"]),
    fb_used_mib=st.none() | st.integers(0, 200_000),
    recovery_action=st.none() | st.integers(0, 255),
    dbe_volatile=COUNT, retired_pages=COUNT, retired_pending=COUNT, remap_failure=st.integers(0, 1),
    remap_pending=st.integers(0, 1), remapped_uncorrectable=COUNT,
    temp_max=st.none() | st.floats(-20, 130), power_avg=st.none() | st.floats(0, 2000),
    reasons_any=st.integers(0, 2**32 - 1), util_max_idle_window=st.none() | st.floats(0, 100),
    idle_minutes=st.integers(0, 600), sbe_new=COUNT, pcie_new=COUNT, nvlink_crc_new=COUNT,
    nvlink_replay_recovery_new=COUNT, dbe_new=COUNT, minutes_long=st.integers(0, 1440),
    span_long_s=st.none() | st.floats(0, 86400),
    xids=st.dictionaries(
        st.integers(1, 200),
        st.builds(XidCounts, st.integers(0, 50), st.integers(1, 500), st.none() | st.integers(0, 50),
                  st.lists(STAMP, max_size=10).map(tuple)),
        max_size=4,
    ),
    lost_times=st.lists(STAMP, max_size=5).map(tuple),
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=FEATURES, previous=st.sampled_from([None, *HEALTH_STATES]), alert_id=st.integers(1, 2**62))
def test_every_verdict_and_alert_the_scorer_decides_is_a_valid_message_that_round_trips(
    g: GpuFeatures, previous: str | None, alert_id: int
) -> None:
    verdicts = evaluate(g, RULES, NOW)
    assert set(verdicts) == set(SUBSYSTEMS)
    for v in verdicts.values():
        built = verdict_changed(
            as_of=NOW, gpu_uuid=UUID, hostname=g.hostname, subsystem=v.subsystem, state=v.state,
            previous=previous, rule=v.rule, action=v.action, evidence=v.evidence,
        )  # fmt: skip
        assert built is not None, (v.subsystem, v.rule, v.evidence)
        kind, key, message = built
        assert (kind, key) == ("health", UUID)
        wire = json.dumps(to_json(message), allow_nan=False)
        assert parse_health_verdict(wire) == message
        assert json.loads(wire)["evidence"] == json.loads(json.dumps(v.evidence))  # the evidence, as stored
    for alert in desired_alerts(g, verdicts, RULES):
        opened = alert_opened(
            as_of=NOW, alert_id=alert_id, gpu_uuid=UUID, kind=alert.kind, severity=alert.severity,
            summary=alert.summary, evidence=alert.evidence,
        )  # fmt: skip
        assert opened is not None, alert
        assert parse_alert(json.dumps(to_json(opened[2]))) == opened[2]
        resolved = alert_resolved(as_of=NOW, alert_id=alert_id, gpu_uuid=UUID, kind=alert.kind)
        assert resolved is not None
        assert parse_alert(json.dumps(to_json(resolved[2]))) == resolved[2]


def test_the_message_time_is_the_cycles_in_utc_with_a_z() -> None:
    as_of = datetime(2026, 11, 21, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    built = alert_resolved(as_of=as_of, alert_id=7, gpu_uuid=UUID, kind="thermal")
    assert built is not None
    assert to_json(built[2])["time"] == "2026-11-21T12:00:00.123000Z"


def test_alerts_get_their_gpus_hostname_and_a_gpu_the_inventory_forgot_gets_an_empty_one() -> None:
    other = "GPU-00000000-0000-4000-8000-000000000001"
    messages = [
        m
        for m in (
            alert_resolved(as_of=NOW, alert_id=1, gpu_uuid=UUID, kind="thermal"),
            alert_resolved(as_of=NOW, alert_id=2, gpu_uuid=other, kind="thermal"),
            verdict_changed(as_of=NOW, gpu_uuid=UUID, hostname="node-9", subsystem="xid", state="healthy",
                            previous="degraded", rule=None, action="none", evidence={}),
        )
        if m is not None
    ]  # fmt: skip
    hosts = [m.hostname for _, _, m in named(messages, {UUID: "node-7"})]
    assert hosts == ["node-7", "", "node-9"]


def test_a_message_its_contract_refuses_is_logged_and_left_out_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="services.scorer.messages"):
        assert alert_resolved(as_of=NOW, alert_id=1, gpu_uuid="GPU-x", kind="thermal") is None
        kept = alert_resolved(as_of=NOW, alert_id=2, gpu_uuid=UUID, kind="thermal")
        assert kept is not None
        assert named([kept], {UUID: "node\x00"}) == []  # a hostname the topic cannot carry
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "alerts message refused by its contract, not published",
    ] * 2
