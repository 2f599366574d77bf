"""Silence is judged against the fleet: a pipeline that stops (a restart, an outage) makes no GPU
"not reporting"; a GPU that stays silent once the fleet reports again is.

Before this, `make down; make up` with the remediator live judged every GPU of the fleet not reporting
at its first cycle (their latest samples were the previous run's) and held a reboot of every node for
approval, and the node's next real finding joined that held plan instead of being acted on.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from services.scorer.cycle import assess
from services.scorer.rules_config import load_rules
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.fakes.samples import T0, gpu_uuid, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings

GPUS = 8


def _store(db: DatabaseSettings, rounds: dict[datetime, range]) -> None:
    """One sample per GPU of `rounds[t]` at each time t."""
    rows = [sample(i, gpus=GPUS, time=t.isoformat()) for t, gpus in rounds.items() for i in gpus]
    writer = BatchWriter(db, group="itest-silence", connections=1)
    try:
        after = int((max(rounds) - T0).total_seconds()) + 1  # later rounds, later offsets: none is a repeat
        writer.write(Batch(rows=[stage_row(json.dumps(r)) for r in rows], next_offsets={("t", 0): after}))
    finally:
        writer.close()


def _silent(db: DatabaseSettings, as_of: datetime) -> set[str]:
    """The GPUs judged not reporting as of `as_of`."""
    with connect(db) as conn:
        judged = assess(conn, as_of, load_rules())
    return {uuid for uuid, j in judged.gpus.items() if j.verdicts["availability"].rule == "not_reporting"}


def test_a_fleet_silent_together_is_not_at_fault_and_a_gpu_silent_alone_is(
    migrated: DatabaseSettings,
) -> None:
    everyone = range(GPUS)
    _store(migrated, {T0 + timedelta(seconds=10 * r): everyone for r in range(3)})
    last = T0 + timedelta(seconds=20)
    assert _silent(migrated, last + timedelta(seconds=5)) == set()

    # Ten minutes with nothing from anyone: the pipeline was down, not the GPUs.
    back = last + timedelta(minutes=10)
    assert _silent(migrated, back) == set()

    # The first three GPUs report again: the fleet as a whole is not heard yet, and nobody is judged.
    _store(migrated, {back: range(3)})
    assert _silent(migrated, back + timedelta(seconds=5)) == set()

    # All but GPU 7 report: the fleet is heard, and the one that stays silent is not reporting.
    _store(
        migrated,
        {back + timedelta(seconds=10): range(GPUS - 1), back + timedelta(seconds=20): range(GPUS - 1)},
    )
    assert _silent(migrated, back + timedelta(seconds=25)) == {gpu_uuid(GPUS - 1)}
