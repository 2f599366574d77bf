"""The benches' synthetic fleets: inventory, latest samples, status and rollup filled in a scratch schema.

Bench fixtures, not production reads: they live beside the benches that use them (and the tests that
reuse a bench's fleet), not in the production store. The one place outside shared/store that holds SQL
(tests/unit/shared/store/test_owns_sql.py names it).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from shared.store.errors import translated
from shared.store.results import SyncConn

# Both benches' inventory: `n` H100s, eight a node, 64 a rack, `per_dc` a datacenter, first seen `seen_for` ago.
_BENCH_INVENTORY = """
    INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, cluster, datacenter, rack, slowdown_temp_c,
                            shutdown_temp_c, power_limit_w, fb_total_mib, first_seen, last_seen)
    SELECT 'GPU-' || lpad(g::text, 8, '0') || '-0000-4000-8000-000000000000', 'NVIDIA H100 80GB HBM3', g %% 8,
           'node-' || (g / 8), 'c1', 'dc' || (g / %(per_dc)s::int), 'rack-' || (g / 64), 87, 92, 700, 81559,
           %(t)s - %(seen_for)s::interval, %(t)s
    FROM generate_series(0, %(n)s - 1) g"""
_API_BENCH_FLEET = (
    _BENCH_INVENTORY,
    """INSERT INTO gpu_latest (time, gpu_uuid, hostname, cluster, datacenter, rack, source, collector_id,
                              gpu_temp_c, power_usage_w, gpu_util_pct)
       SELECT %(t)s, gpu_uuid, hostname, cluster, datacenter, rack, 'mock', 'bench', 55 + gpu_index, 400, 80
       FROM gpu_assets""",
    """INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, as_of)
       SELECT gpu_uuid, CASE WHEN gpu_index = 7 THEN 'degraded' ELSE 'healthy' END,
              CASE WHEN gpu_index = 7 THEN 85 ELSE 100 END, 'A', 'none', %(t)s FROM gpu_assets""",
    """INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n, gpu_temp_c_max,
              power_usage_w_sum, power_usage_w_n, power_usage_w_max, gpu_util_pct_sum, gpu_util_pct_n,
              fb_used_mib_max, ecc_sbe_volatile_total_max, ecc_dbe_volatile_total_max)
       SELECT %(t)s - m * interval '1 minute', a.gpu_uuid, 6, 360, 6, 61, 2400, 6, 410, 480, 6, 40000, 0, 0
       FROM gpu_assets a, generate_series(0, %(minutes)s - 1) m""",
)
_SCORER_BENCH_FLEET = (
    _BENCH_INVENTORY,
    """INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id, gpu_temp_c, power_usage_w, gpu_util_pct,
                            fb_used_mib, fb_total_mib, ecc_dbe_volatile_total)
    SELECT %(t)s, gpu_uuid, hostname, 'mock', 'bench', 60, 500, 90, 40000, 81559,
           CASE WHEN gpu_index = 3 AND rack = 'rack-7' THEN 1 ELSE 0 END
    FROM gpu_assets""",
    """INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n, gpu_temp_c_max,
           power_usage_w_sum, power_usage_w_n, power_usage_w_max, gpu_util_pct_sum, gpu_util_pct_n,
           clocks_event_reasons_any, ecc_sbe_volatile_total_max, ecc_dbe_volatile_total_max, pcie_replay_total_max,
           fb_used_mib_max)
    SELECT %(t)s - m * interval '1 minute', a.gpu_uuid, 6, 360 + (m %% 7), 6, 61 + (m %% 5), 3000, 6, 520, 540, 6, 4,
           CASE WHEN a.gpu_index = 1 THEN 600 - m * 3 ELSE 2 END, 0, 1, 40000
    FROM gpu_assets a, generate_series(0, 59) m""",
)


def _fill(conn: SyncConn, statements: tuple[str, ...], params: dict[str, Any]) -> None:
    with translated(conn):
        for statement in statements:
            conn.execute(sql.SQL(statement), params)  # `%%`: PostgreSQL's modulo, not a placeholder
        conn.commit()
        conn.execute("ANALYZE")


def fill_api_bench_fleet(conn: SyncConn, *, as_of: datetime, gpus: int, rollup_minutes: int) -> None:
    """`gpus` GPUs' inventory, latest sample (as of `as_of`), status and `rollup_minutes` of rollup; committed."""
    _fill(
        conn, _API_BENCH_FLEET,
        {"t": as_of, "n": gpus, "per_dc": 2500, "seen_for": timedelta(days=2), "minutes": rollup_minutes},
    )  # fmt: skip


def inject_bench_dbe(conn: SyncConn, gpu_uuids: list[str]) -> None:
    """A double-bit ECC error on each GPU, in its newest rollup minute (the remediator's bench); committed."""
    with translated(conn):
        conn.execute(
            "UPDATE gpu_metrics_1min SET ecc_dbe_volatile_total_max = 1 WHERE gpu_uuid = ANY (%s)"
            " AND bucket = (SELECT max(bucket) FROM gpu_metrics_1min)",
            (gpu_uuids,),
        )
        conn.commit()


def touch_bench_fleet(conn: SyncConn, at: datetime) -> None:
    """Every GPU's latest sample moved to `at` (a bench's fleet that keeps reporting); committed."""
    with translated(conn):
        conn.execute("UPDATE gpu_latest SET time = %s", (at,))
        conn.commit()


def fill_scorer_bench_fleet(conn: SyncConn, *, as_of: datetime, gpus: int) -> None:
    """`gpus` GPUs' inventory and latest sample (as of `as_of`), one hour of rollup (GPU index 1's SBE
    counter falling, one rack-7 GPU with a DBE); committed."""
    _fill(conn, _SCORER_BENCH_FLEET, {"t": as_of, "n": gpus, "per_dc": 2000, "seen_for": timedelta(hours=2)})
