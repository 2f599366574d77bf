"""Every SQL statement of the operating guide's psql examples runs, as written, on a sink-filled database."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from evaluation.pipeline import make_loop, stored_offsets_total, wait_until
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings, KafkaSettings
from shared.store.server import set_search_path
from tests.helpers.sink import produce_samples, running
from tests.helpers.topics import isolated_topics
from tests.paths import REPO

GUIDE = REPO / "docs" / "operating.md"


def documented_statements() -> list[str]:
    text = GUIDE.read_text()
    block = re.search(r"<!-- psql-examples -->\s*```sql\n(.*?)```", text, re.S)
    assert block, "docs/operating.md lost its psql examples block"
    body = "\n".join(line for line in block[1].splitlines() if not line.strip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def test_the_psql_examples_run_on_real_data(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    topics = isolated_topics(topic_factory)
    produce_samples(kafka_settings, topics.metrics_raw, 0, 400, gpus=16)
    group = f"docs-{uuid.uuid4().hex[:8]}"
    with running(make_loop(kafka_settings, migrated, topics, group)):
        wait_until(lambda: stored_offsets_total(migrated, group) == 400, 60, "the sink")
    statements = documented_statements()
    assert len(statements) >= 10
    with connect(migrated) as conn:
        # as a user's psql sees them: the tables first, then `public`, where TimescaleDB's functions are
        set_search_path(conn, str(migrated.search_path), then_extensions=True)
        results = [conn.execute(s).fetchall() for s in statements]
    latest, summary = results[0], results[1]
    assert len(latest) == 16
    assert summary[0][2] == 16  # gpus, in the single cluster/datacenter of the test data
