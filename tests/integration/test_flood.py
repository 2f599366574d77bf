"""A flood through the real broker and database: 100,000 kernel-log lines of one XID on one GPU within a
minute are counted exactly in a few rows, and the other GPUs' XIDs are stored promptly meanwhile."""

from __future__ import annotations

import math
from collections.abc import Callable

from evaluation.flood import OTHERS, run_flood
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.sink import sink_topics

LINES, OVER_S, FOLD_S, POLL_S = 100_000, 50.0, 10.0, 1.0
PROMPT_S = 10.0  # the bound on an other GPU's XID, from its line to its row, on a shared two-core machine


def test_a_flood_is_counted_exactly_in_few_rows_and_other_gpus_are_not_held_up(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    figures = run_flood(kafka_settings, migrated, sink_topics(topic_factory), lines=LINES, over_s=OVER_S,
                        poll_s=POLL_S, fold_s=FOLD_S)  # fmt: skip
    assert figures.lines_in == LINES
    assert figures.flood_counted == LINES  # not one line lost, none counted twice
    # one row a fold window (the last window may be cut in two by a poll's timing)
    assert figures.flood_rows <= math.ceil(OVER_S / FOLD_S) + 2
    assert figures.other_rows == len(OTHERS)  # each other GPU's XID once (seen by the exporter and the log)
    assert len(figures.other_latency_s) == len(OTHERS)
    assert max(figures.other_latency_s) <= PROMPT_S, figures.other_latency_s
    # the wire: a fold's first line and its count, and the others' events
    assert figures.xid_events_published <= 2 * figures.flood_rows + len(OTHERS)
