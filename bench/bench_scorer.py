"""Scorer at fleet scale: a full cycle and the cheaper cycles that follow it, each next to its own SQL.

For each fleet size (`--gpus`, 10,000 by default; `--gpus 10000 --gpus 100000`
for both), a scratch schema gets that many GPUs' inventory, latest samples and
one hour of 1-minute rollup (60 rows a GPU), generated in SQL. Then, as of one
minute and the 15 s ticks after it (make up's interval):

- the first cycle, writing every verdict and prediction;
- a full steady cycle (every GPU judged, nothing new: what each cycle cost
  before cycles judged only what can have changed), beside the feature SQL
  alone over the fleet; and the same again in the service's chunks (one
  transaction each), beside the one transaction;
- the cheaper cycles over one `rejudge_every_s` period (60 s, four ticks): each
  judges the GPUs that can have changed (here the 1 in 8 with a finding, and
  the healthy ones whose minute came round), beside its own SQL: the selection
  and the feature reads of what it selected.

The ratios are what Python rules and writes add to the SQL each cycle needs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench import fleets
from bench._common import report
from services.scorer.cycle import judge, judge_in_chunks
from services.scorer.features import Conn, read_features
from services.scorer.rules_config import Rules, load_rules
from services.scorer.settings import ScorerSection
from shared.plumbing.db import connect
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import Settings
from shared.store import judging

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
TICK_S = 15
PERIOD_S = 60
T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


CHUNK = ScorerSection().cycle_chunk  # as the service judges


def due(conn: Conn, at: datetime, rules: Rules) -> list[str]:
    return judging.needing_judgement(
        conn, at, None, missing_after_s=rules.availability.missing_after_s, late_s=300, every_s=PERIOD_S
    )


def bench(gpus: int) -> None:
    settings = Settings()
    rules = load_rules()
    with migrated_schema(settings.db, "bench") as db, connect(db) as conn:
        _, fill_s = timed(lambda: fleets.fill_scorer_bench_fleet(conn, as_of=NOW, gpus=gpus))
        first, first_s = timed(lambda: judge(conn, NOW, rules))
        known = first.predictions
        tick = NOW + timedelta(seconds=TICK_S)
        _, sql_s = timed(lambda: read_features(conn, tick, rules))
        conn.rollback()
        full, full_s = timed(lambda: judge(conn, tick, rules, predictions=known))
        everyone = judging.inventory_gpus(conn)
        chunked, chunked_s = timed(lambda: judge_in_chunks(conn, tick, rules, everyone, chunk=CHUNK,
                                                           predictions=known))  # fmt: skip
        cycles: list[tuple[int, float, float]] = []  # (judged, cycle s, its SQL s)
        for k in range(2, 2 + PERIOD_S // TICK_S):
            at = NOW + timedelta(seconds=k * TICK_S)
            fleets.touch_bench_fleet(conn, at)  # the fleet keeps reporting
            # its SQL alone, then the cycle (the same selection again, and everything it writes)
            started = time.perf_counter()
            selected = due(conn, at, rules)
            read_features(conn, at, rules, selected)
            own_sql_s = time.perf_counter() - started
            conn.rollback()
            started = time.perf_counter()
            judged = judge(conn, at, rules, gpus=due(conn, at, rules), predictions=known).gpus
            cycles.append((judged, time.perf_counter() - started, own_sql_s))
    print(f"({gpus:,} GPUs: fill {fill_s:.1f} s; first cycle, every verdict and prediction written: {first_s:.2f} s,"
          f" {first.states}; full steady cycle judged {full.gpus:,})")  # fmt: skip
    report(f"full cycle over {gpus:,} GPUs (1 h of rollup)", full_s, "s", "feature SQL alone", sql_s)
    report(f"the same in chunks of {CHUNK} ({chunked.gpus:,} judged), a transaction each", chunked_s, "s",
           "one transaction", full_s)  # fmt: skip
    for i, (judged, cycle_s, own_sql_s) in enumerate(cycles):
        report(f"cheaper cycle {i + 1} of a {PERIOD_S} s period: {judged:,} of {gpus:,} judged", cycle_s, "s",
               "its SQL alone", own_sql_s)  # fmt: skip
    mean = statistics.mean(c[1] for c in cycles)
    report(f"cheaper cycles over {gpus:,} GPUs, mean of {len(cycles)}", mean, "s", "the full cycle", full_s)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpus", type=int, action="append", help="fleet size (repeat for several)")
    sizes = parser.parse_args().gpus or [10_000]
    for gpus in sizes:
        bench(gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
