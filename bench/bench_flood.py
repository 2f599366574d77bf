"""A flood: 100,000 kernel-log lines of one XID on one GPU in 50 s, through the real broker and database.

The mock fleet's kernel log, the collector (polling every second, folding repeats
within 10 s), Kafka, the sink and TimescaleDB, as evaluation/flood.py runs them:
lines in, XID events the collector published, rows stored and the lines they count;
and, for six ordinary XIDs on other GPUs during the flood, the time from each line
to its row in gpu_events, against the same run without the flood (the baseline).
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import report
from evaluation.flood import flood_topics, run_flood
from shared.plumbing.migrate import migrated_schema
from shared.settings.common import Settings

LINES, OVER_S = 100_000, 50.0


def main() -> None:
    settings = Settings()
    runs = {}
    for name, lines in (("baseline", 0), ("flood", LINES)):
        with migrated_schema(settings.db, "bench") as db, flood_topics(settings.kafka) as topics:
            runs[name] = run_flood(
                settings.kafka, db, topics, lines=lines, over_s=OVER_S, group=f"bench-{name}"
            )
    base, flood = runs["baseline"], runs["flood"]
    print(
        f"flood: {flood.lines_in:,} lines in, {flood.xid_events_published:,} XID events published,"
        f" {flood.flood_rows:,} rows stored counting {flood.flood_counted:,} lines"
        f" (baseline: {base.xid_events_published:,} XID events, no flood)"
    )
    print(f"other GPUs' XIDs stored: {flood.other_rows} of {len(flood.other_latency_s)} during the flood")
    report("other GPUs' XID, line to row, p50, during the flood", median(flood.other_latency_s), "s",
           "without the flood", median(base.other_latency_s))  # fmt: skip
    report("other GPUs' XID, line to row, max, during the flood", max(flood.other_latency_s), "s",
           "without the flood", max(base.other_latency_s))  # fmt: skip


if __name__ == "__main__":
    main()
