"""Migration discovery and the topic list, without a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.plumbing.errors import MigrationError
from shared.plumbing.migrate import SCHEMA_DIR, discover
from shared.plumbing.topic_admin import project_topics
from shared.settings.common import TopicSettings


def test_project_migrations_are_well_formed_and_ordered() -> None:
    migrations = discover(SCHEMA_DIR)
    versions = [m.version for m in migrations]
    assert versions == sorted(versions)
    assert versions[0] == 1
    assert "timescaledb" in migrations[0].sql


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"1_short.sql": "SELECT 1;"}, "NNNN_lower_snake"),
        ({"0001_Upper.sql": "SELECT 1;"}, "NNNN_lower_snake"),
        ({"0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 2;"}, "used twice"),
        ({"0001_empty.sql": "  \n"}, "empty"),
    ],
)
def test_malformed_migration_folders_are_refused(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(MigrationError, match=message):
        discover(tmp_path)


def test_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MigrationError, match="does not exist"):
        discover(tmp_path / "nope")


def test_order_is_numeric_and_checksums_track_content(tmp_path: Path) -> None:
    (tmp_path / "0010_later.sql").write_text("SELECT 10;")
    (tmp_path / "0002_early.sql").write_text("SELECT 2;")
    (tmp_path / "README.md").write_text("not a migration")
    first = discover(tmp_path)
    assert [(m.version, m.name) for m in first] == [(2, "early"), (10, "later")]
    (tmp_path / "0002_early.sql").write_text("SELECT 3;")
    assert discover(tmp_path)[0].checksum != first[0].checksum


def test_project_topics_follow_configuration() -> None:
    topics = TopicSettings(metrics_raw="raw", partitions=12, retention_ms=86_400_000)
    specs = {s.name: s for s in project_topics(topics)}
    assert set(specs) == {
        "raw", "gpu-events", "gpu-health", "gpu-alerts", "gpu-dead-letters", "gpu-verifications",
        "gpu-systems", "gpu-processes", "llm-sessions", "gpu-remediations", "gpu-lifecycle",
    }  # fmt: skip
    assert all(s.partitions == 12 for s in specs.values())
    assert specs["raw"].config["retention.ms"] == "86400000"
    assert specs["gpu-alerts"].config["retention.ms"] == str(topics.audit_retention_ms)
    # the audit log is never deleted by time or size, and never compacted
    assert specs["gpu-verifications"].config == {
        "retention.ms": "-1", "retention.bytes": "-1", "cleanup.policy": "delete"
    }  # fmt: skip
