"""Scorer at fleet scale: one cycle over 10,000 GPUs, next to the bare SQL aggregation it runs.

A scratch schema gets 10,000 GPUs' inventory, latest samples and one hour of
1-minute rollup (600,000 rows), generated in SQL. The figure is one full
scoring cycle (features, predictions, verdicts, status, alerts, all written);
the baseline is the feature query alone, i.e. what PostgreSQL spends
aggregating. The ratio is what Python rules and writes add on top.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from psycopg import sql

from bench._common import report
from services.scorer.cycle import run_cycle
from services.scorer.features import read_features
from services.scorer.rules_config import load_rules
from shared.config import Settings
from shared.db import connect
from shared.migrate import migrated_schema

GPUS = 10_000
NOW = datetime.now(UTC).replace(second=0, microsecond=0)

FILL = """
INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, cluster, datacenter, rack, slowdown_temp_c,
                        shutdown_temp_c, power_limit_w, fb_total_mib, first_seen, last_seen)
SELECT 'GPU-' || lpad(g::text, 8, '0') || '-0000-4000-8000-000000000000', 'NVIDIA H100 80GB HBM3', g %% 8,
       'node-' || (g / 8), 'c1', 'dc' || (g / 2000), 'rack-' || (g / 64), 87, 92, 700, 81559, %(t)s - interval '2 hours', %(t)s
FROM generate_series(0, %(n)s - 1) g;
INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id, gpu_temp_c, power_usage_w, gpu_util_pct,
                        fb_used_mib, fb_total_mib, ecc_dbe_volatile_total)
SELECT %(t)s, gpu_uuid, hostname, 'mock', 'bench', 60, 500, 90, 40000, 81559, CASE WHEN gpu_index = 3 AND rack = 'rack-7' THEN 1 ELSE 0 END
FROM gpu_assets;
INSERT INTO gpu_metrics_1min (bucket, gpu_uuid, samples, gpu_temp_c_sum, gpu_temp_c_n, gpu_temp_c_max, power_usage_w_sum,
       power_usage_w_n, power_usage_w_max, gpu_util_pct_sum, gpu_util_pct_n, clocks_event_reasons_any,
       ecc_sbe_volatile_total_max, ecc_dbe_volatile_total_max, pcie_replay_total_max, fb_used_mib_max)
SELECT %(t)s - m * interval '1 minute', a.gpu_uuid, 6, 360 + (m %% 7), 6, 61 + (m %% 5), 3000, 6, 520, 540, 6, 4,
       CASE WHEN a.gpu_index = 1 THEN 600 - m * 3 ELSE 2 END, 0, 1, 40000
FROM gpu_assets a, generate_series(0, 59) m;
"""


def main() -> int:
    settings = Settings()
    with migrated_schema(settings.db, "bench") as db, connect(db) as conn:
        for statement in FILL.split(";"):
            if statement.strip():
                conn.execute(sql.SQL(statement), {"t": NOW, "n": GPUS})
        conn.commit()
        conn.execute("ANALYZE")
        rules = load_rules()
        start = time.perf_counter()
        read_features(conn, NOW, rules)
        sql_s = time.perf_counter() - start
        start = time.perf_counter()
        result = run_cycle(conn, NOW, rules, None)
        first_s = time.perf_counter() - start
        # Steady state: the verdicts exist, predictions are reused between their own runs.
        start = time.perf_counter()
        run_cycle(conn, NOW + timedelta(seconds=30), rules, result.predictions)
        cycle_s = time.perf_counter() - start
    print(f"(cycle judged {result.gpus} GPUs: {result.states}; the first cycle, writing every verdict"
          f" and prediction, took {first_s:.2f} s)")  # fmt: skip
    report(
        f"steady-state scoring cycle over {GPUS:,} GPUs (1 h of rollup)",
        cycle_s,
        "s",
        "feature SQL alone",
        sql_s,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
