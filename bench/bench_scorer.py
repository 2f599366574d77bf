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


from bench._common import report
from services.scorer.cycle import run_cycle
from services.scorer.features import read_features
from services.scorer.rules_config import load_rules
from shared.config import Settings
from shared.db import connect
from shared.migrate import migrated_schema
from shared.store import fleet

GPUS = 10_000
NOW = datetime.now(UTC).replace(second=0, microsecond=0)


def main() -> int:
    settings = Settings()
    with migrated_schema(settings.db, "bench") as db, connect(db) as conn:
        fleet.fill_scorer_bench_fleet(conn, as_of=NOW, gpus=GPUS)
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
