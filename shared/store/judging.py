"""Which GPUs a scorer judges: the inventory it takes its share of, and those whose verdict can have changed.

A cycle judges only the latter (services/scorer/loop.py); a GPU it leaves alone
keeps its verdict, since nothing its rules read can have moved it.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .results import tuple_rows

SyncConn = psycopg.Connection[Any]

# What can have changed a GPU's verdict since it was last judged (the cycle judges only those):
# never judged; a finding or an alert, which may age out or need its evidence refreshed; on a node the
# remediator is working on (its validation counts this GPU's scoring cycles: once a minute would hold a
# node out three minutes for three cycles); silent past missing_after_s; the latest sample asking for
# a reset or a remap; an event since the judgement (a late one too); or else its minute came round: a
# GPU with nothing of that is judged once per `every` (the rollup's minute), at its own phase within it
# (from its UUID's hash), so the fleet's share of a cycle stays even instead of every GPU falling due
# at one minute boundary.
_NEEDING_JUDGEMENT = """
SELECT a.gpu_uuid
FROM gpu_assets a LEFT JOIN gpu_status s USING (gpu_uuid) LEFT JOIN gpu_latest l USING (gpu_uuid)
     CROSS JOIN LATERAL (SELECT (hashtext(a.gpu_uuid) & 2147483647) %% %(every_s)s AS phase) h
WHERE a.first_seen <= %(t)s AND (%(gpus)s::text[] IS NULL OR a.gpu_uuid = ANY(%(gpus)s::text[]))
  AND (s.gpu_uuid IS NULL
       OR s.state <> 'healthy'
       OR l.time IS NULL OR l.time <= %(t)s - %(missing)s
       OR coalesce(l.gpu_recovery_action, 0) <> 0 OR coalesce(l.row_remap_pending, 0) <> 0
       OR floor((extract(epoch FROM %(t)s) + h.phase) / %(every_s)s)
          > floor((extract(epoch FROM s.as_of) + h.phase) / %(every_s)s)
       OR EXISTS (SELECT 1 FROM gpu_alerts g WHERE g.gpu_uuid = a.gpu_uuid AND g.state <> 'resolved')
       OR EXISTS (SELECT 1 FROM remediations r WHERE r.state = 'running'
                    AND (r.node = a.hostname OR a.gpu_uuid = ANY(r.gpu_uuids)))
       OR EXISTS (SELECT 1 FROM gpu_events e WHERE e.gpu_uuid = a.gpu_uuid
                    AND e.time > s.as_of - %(late)s AND e.time <= %(t)s))
ORDER BY a.gpu_uuid
"""


def needing_judgement(
    conn: SyncConn,
    as_of: datetime,
    gpus: Collection[str] | None,
    *,
    missing_after_s: float,
    late_s: float,
    every_s: int,
) -> list[str]:
    """Of `gpus` (None: every GPU), those whose verdict can have changed since their last judgement."""
    params = {
        "t": as_of,
        "gpus": None if gpus is None else sorted(gpus),
        "every_s": every_s,
        "missing": timedelta(seconds=missing_after_s),
        "late": timedelta(seconds=late_s),
    }
    return [str(uuid) for (uuid,) in tuple_rows(conn, _NEEDING_JUDGEMENT, params, prepare=False)]


def inventory_gpus(conn: SyncConn) -> list[str]:
    """Every GPU in the inventory, in order (a scorer takes its share of them)."""
    return [str(uuid) for (uuid,) in tuple_rows(conn, "SELECT gpu_uuid FROM gpu_assets ORDER BY gpu_uuid")]


# The time the fleet as a whole was last heard from: the median of its GPUs' latest samples up to
# as_of (interpolated: of two GPUs, the midpoint). A GPU is silent against this, not against the
# clock: when the collectors, Kafka or the sink stop (a restart of the pipeline, an outage), every GPU
# falls silent together and none of them is at fault; once half the fleet reports again, the GPUs that
# still do not are. None: nothing stored up to as_of.
_FLEET_HEARD = """
SELECT to_timestamp(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM time)))
FROM gpu_latest WHERE time <= %(t)s
"""


def fleet_heard_until(conn: SyncConn, as_of: datetime) -> datetime | None:
    """When the fleet was last heard from, as of `as_of`: the median GPU's latest sample time."""
    rows = tuple_rows(conn, _FLEET_HEARD, {"t": as_of})
    return rows[0][0] if rows else None
