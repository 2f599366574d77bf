"""shared.store.alerts against a migrated schema: the scorer's writes, the API's list and acknowledgement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.plumbing.errors import DataRefusedError
from shared.settings.common import DatabaseSettings
from shared.store import alerts
from shared.store.alerts import AlertFilters
from tests.helpers.store_rows import T0, add_alert, add_gpu, add_status, gpu, on_async


def test_open_refresh_resolve_and_count(conn: psycopg.Connection[Any]) -> None:
    add_gpu(conn, 0, host="node-a")
    add_status(conn, 0, state="unhealthy", score=10)
    opened = alerts.open_alert(
        conn, gpu(0), "thermal", severity="warning", summary="hot", evidence={"c": 90}, as_of=T0
    )
    other = alerts.open_alert(
        conn, gpu(0), "unhealthy_memory", severity="critical", summary="dbe", evidence={}, as_of=T0
    )
    assert opened is not None
    assert other is not None
    assert alerts.unresolved(conn) == {(gpu(0), "thermal"): opened, (gpu(0), "unhealthy_memory"): other}
    assert alerts.unresolved(conn, [gpu(1)]) == {}
    later = T0 + timedelta(seconds=1)
    again = alerts.open_alert(
        conn, gpu(0), "thermal", severity="warning", summary="hot", evidence={}, as_of=later
    )
    assert again is None  # one unresolved alert per GPU and kind: the second writer opens nothing
    alerts.refresh_alerts(conn, [], T0)  # nothing to refresh: no statement
    alerts.refresh_alerts(conn, [alerts.Refresh(opened, "critical", "hotter", {"c": 95})], T0)
    assert sorted(alerts.open_counts(conn, [gpu(0), gpu(1)])) == [(gpu(0), "critical", 2)]
    assert alerts.resolve_alert(conn, other, T0 + timedelta(minutes=1))
    assert not alerts.resolve_alert(conn, other, T0 + timedelta(minutes=2))  # resolved once
    conn.commit()
    assert alerts.unresolved(conn) == {(gpu(0), "thermal"): opened}
    row = conn.execute("SELECT summary, evidence, state FROM gpu_alerts WHERE id = %s", (opened,)).fetchone()
    assert row == ("hotter", {"c": 95}, "open")


def test_acknowledging_an_open_alert_once(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> None:
    add_gpu(conn, 0, host="node-a")
    alert_id = add_alert(conn, 0, kind="thermal", severity="warning")
    conn.commit()
    done = on_async(migrated, lambda c: alerts.acknowledge(c, alert_id, "ops"))
    assert done is not None
    assert (done["state"], done["acknowledged_by"]) == ("acknowledged", "ops")
    assert on_async(migrated, lambda c: alerts.acknowledge(c, alert_id, "ops")) is None
    assert on_async(migrated, lambda c: alerts.alert_state(c, alert_id)) == "acknowledged"
    assert on_async(migrated, lambda c: alerts.alert_state(c, alert_id + 1)) is None


@pytest.fixture
def listed_alerts(migrated: DatabaseSettings, conn: psycopg.Connection[Any]) -> DatabaseSettings:
    for i in range(4):
        add_gpu(conn, i, host=f"node-{i % 2}", rack="r1")
    for n, (severity, state) in enumerate(
        [
            ("critical", "open"),
            ("warning", "open"),
            ("info", "acknowledged"),
            ("critical", "resolved"),
            ("warning", "open"),
        ]
    ):
        add_alert(
            conn, n % 4, kind=f"k{n}", severity=severity, state=state, opened_at=T0 + timedelta(minutes=n)
        )
    conn.commit()
    return migrated


def test_the_list_orders_by_severity_then_newest(listed_alerts: DatabaseSettings) -> None:
    found, total = on_async(listed_alerts, lambda c: alerts.listed(c, AlertFilters(), limit=10, after=None))
    assert total == 4  # unresolved: open and acknowledged
    assert [(a["severity"], a["kind"]) for a in found] == [
        ("critical", "k0"),
        ("warning", "k4"),
        ("warning", "k1"),
        ("info", "k2"),
    ]
    assert [a["severity_rank"] for a in found] == [0, 1, 1, 2]
    assert found[0]["hostname"] == "node-0"
    rest, _ = on_async(
        listed_alerts,
        lambda c: alerts.listed(
            c, AlertFilters(), limit=10, after=(1, found[1]["opened_at"], found[1]["id"])
        ),
    )
    assert [a["kind"] for a in rest] == ["k1", "k2"]
    only, n = on_async(
        listed_alerts, lambda c: alerts.listed(c, AlertFilters(state="resolved"), limit=10, after=None)
    )
    assert (n, [a["kind"] for a in only]) == (1, ["k3"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    severity=st.none() | st.text(max_size=12),
    gpu_text=st.none() | st.text(max_size=40) | st.just(gpu(0)),
    host=st.none() | st.text(max_size=20) | st.just("node-1"),
    after=st.none()
    | st.tuples(
        st.integers(-(2**31), 2**31 - 1), st.datetimes(timezones=st.just(UTC)), st.integers(-(2**62), 2**62)
    ),
)
def test_hostile_filters_and_cursors_page_or_refuse(
    listed_alerts: DatabaseSettings,
    severity: str | None,
    gpu_text: str | None,
    host: str | None,
    after: tuple[int, datetime, int] | None,
) -> None:
    filters = AlertFilters(severity=severity, gpu=gpu_text, host=host)
    try:
        found, total = on_async(listed_alerts, lambda c: alerts.listed(c, filters, limit=3, after=after))
    except DataRefusedError:
        assert "\x00" in (severity or "") + (gpu_text or "") + (host or "")
        return
    assert len(found) <= min(3, total) or after is not None
    for a in found:
        assert a["state"] != "resolved"
        assert severity is None or a["severity"] == severity
        assert gpu_text is None or a["gpu_uuid"] == gpu_text
        assert host is None or a["hostname"] == host
