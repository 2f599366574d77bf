"""`python -m services.sink.retention_once`: one retention round now (archive, then drop), then exit.

Uses the sink's settings (GPUHEALTH_SINK__KEEP_*_DAYS, GPUHEALTH_SINK__ARCHIVE_DIR...).
Safe beside running sinks: whoever holds the retention lock does the round, the
other returns at once. Killing it at any point loses nothing (see archive.py);
running it again finishes the job. Exit code 0 when the round completed, 1 when
it failed (the reason is logged), 2 for invalid settings.
"""

from __future__ import annotations

import json
import sys

from prometheus_client import CollectorRegistry

from shared.plumbing.errors import DatabaseError
from shared.plumbing.service import start_service

from .__main__ import SinkSettings
from .archive import ArchiveError
from .metrics import SinkMetrics
from .retention import Retention


def main() -> int:
    settings = start_service(SinkSettings, "sink-retention")
    if settings is None:
        return 2
    cfg = settings.sink
    retention = Retention(
        settings.db,
        SinkMetrics(CollectorRegistry()),
        keep_raw_days=cfg.keep_raw_days,
        keep_events_days=cfg.keep_events_days,
        keep_rollup_days=cfg.keep_rollup_days,
        archive_dir=cfg.archive_dir,
        archive_block_kib=cfg.archive_block_kib,
        archive_zstd_level=cfg.archive_zstd_level,
    )
    try:
        dropped = retention.run_once()
    except (DatabaseError, ArchiveError, OSError) as e:
        print(f"retention failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"chunks_dropped": dropped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
