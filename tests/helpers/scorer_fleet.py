"""A fleet the scorer's integration tests judge: GPUs in the inventory, reporting, and their events; and
a stop that comes mid-cycle."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from gpuhealth.contract.wire_time import wire_time
from shared.contract.models import SCHEMA_VERSION, GpuEvent, parse_event

SCORER_TABLES = ("gpu_alerts", "gpu_status", "gpu_health_current", "gpu_health", "gpu_events", "gpu_latest",
                 "gpu_assets", "gpu_failure_predictions")  # fmt: skip


def add_fleet(
    conn: psycopg.Connection[Any], gpus: Sequence[str], at: datetime, *, fresh: bool = False
) -> None:
    """`gpus` in the inventory (8 to a host, seen a day before `at`), their latest sample at `at`; committed.
    `fresh`: the scorer's tables emptied first (one hypothesis example after another)."""
    if fresh:
        for table in SCORER_TABLES:
            conn.execute(f"DELETE FROM {table}")
    for i, g in enumerate(gpus):
        conn.execute(
            "INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, first_seen, last_seen)"
            " VALUES (%s, 'NVIDIA H100 80GB HBM3', %s, %s, %s, %s)",
            (g, i % 8, f"node-{i // 8}", at - timedelta(days=1), at),
        )
        conn.execute(
            "INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id)"
            " VALUES (%s, %s, %s, 'mock', 'test')",
            (at, g, f"node-{i // 8}"),
        )
    conn.commit()


def event_message(gpu: str, kind: str, details: dict[str, Any], at: datetime) -> dict[str, Any]:
    """A gpu-events message as the collector writes it."""
    return {
        "schema_version": SCHEMA_VERSION, "time": wire_time(at), "kind": kind, "gpu_uuid": gpu,
        "hostname": "node-0", "source": "mock", "collector_id": "test", "details": details,
    }  # fmt: skip


def xid_event(gpu: str, code: int, at: datetime) -> GpuEvent:
    """An XID as the event fast path parses it off gpu-events."""
    return parse_event(json.dumps(event_message(gpu, "xid", {"xid": code}, at)))


def add_xids(conn: psycopg.Connection[Any], gpus: Sequence[str], at: datetime,
             xids: Sequence[tuple[int, int, int]]) -> None:  # fmt: skip
    """(index in `gpus`, XID, seconds before `at`) as gpu_events rows, eight GPUs a host; committed."""
    for i, code, ago in xids:
        conn.execute(
            "INSERT INTO gpu_events (time, gpu_uuid, kind, hostname, source, collector_id, details)"
            " VALUES (%s, %s, 'xid', %s, 'mock', 'test', jsonb_build_object('xid', %s::int))"
            " ON CONFLICT DO NOTHING",
            (at - timedelta(seconds=ago), gpus[i], f"node-{i // 8}", code),
        )
    conn.commit()


class StopAfter(threading.Event):
    """A stop that is set once it has been asked `n` times: a SIGTERM arriving mid-cycle."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.asked = 0
        self.n = n

    def is_set(self) -> bool:
        self.asked += 1
        if self.asked > self.n:
            self.set()
        return super().is_set()
