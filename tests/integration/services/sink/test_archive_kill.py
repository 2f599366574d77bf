"""Archival killed with SIGKILL at random points, then restarted: no row lost, none archived twice.

The real `python -m services.sink.retention_once` runs against the real
database; the test kills it when the archive folder has seen the k-th new
path (k drawn by hypothesis, so the kill lands while rows stream into a
temporary file, just after a rename, between a manifest and the drop, or
during the commit), checks that nothing is lost at that moment, and finally
lets a run finish and checks rows before = rows in Parquet + rows left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.plumbing.migrate import migrated_schema
from shared.settings.common import DatabaseSettings
from tests.helpers.archive import KEYS, TABLES, archived_rows, check_manifests, fill, snapshot
from tests.paths import REPO


def retention_env(db: DatabaseSettings, archive: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHEALTH_", "OTEL_"))}
    env.update(
        PYTHONPATH=str(REPO),
        GPUHEALTH_DB__HOST=db.host,
        GPUHEALTH_DB__PORT=str(db.port),
        GPUHEALTH_DB__NAME=db.name,
        GPUHEALTH_DB__USER=db.user,
        GPUHEALTH_DB__PASSWORD=db.password.get_secret_value(),
        GPUHEALTH_DB__SEARCH_PATH=str(db.search_path),
        GPUHEALTH_SINK__ARCHIVE_DIR=str(archive),
        GPUHEALTH_SINK__ARCHIVE_BLOCK_KIB="1024",
        GPUHEALTH_LOG__LEVEL="WARNING",
    )
    return env


def run_and_kill_at(env: dict[str, str], archive: Path, k: int) -> bool:
    """Start a round; SIGKILL it once the archive folder has seen k new paths. True if it was killed."""
    seen: set[Path] = set(archive.rglob("*"))
    start = len(seen)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.sink.retention_once"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    tick = threading.Event()
    while proc.poll() is None:
        assert time.monotonic() < deadline, "retention round did not finish"
        seen.update(archive.rglob("*"))
        if len(seen) - start >= k:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            return True
        tick.wait(0.002)  # polling the folder, not waiting for time to pass
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else proc.returncode
    return False


def assert_nothing_lost(db: DatabaseSettings, archive: Path, before: dict[str, dict]) -> None:  # type: ignore[type-arg]
    for table in TABLES:
        in_db = set(snapshot(db, table))
        keys = [tuple(row[k] for k in KEYS[table]) for row in archived_rows(archive, table)]
        assert len(keys) == len(set(keys)), f"{table}: a row in two archive files"
        assert set(keys) | in_db == set(before[table]), f"{table}: rows lost"


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kill_after=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=3))
def test_killed_mid_archive_and_restarted_loses_and_duplicates_nothing(
    db_settings: DatabaseSettings, kill_after: list[int]
) -> None:
    with migrated_schema(db_settings, "test_kill") as db, tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp)
        fill(db, gpus=4, step="1 minute", days=2)
        before = {table: snapshot(db, table) for table in TABLES}
        env = retention_env(db, archive)
        for k in kill_after:
            run_and_kill_at(env, archive, k)
            assert_nothing_lost(db, archive, before)
        assert not run_and_kill_at(env, archive, k=10**9), "the last round must run to its end"
        for table in TABLES:
            after = snapshot(db, table)
            archived = archived_rows(archive, table)
            assert len(before[table]) == len(archived) + len(after), table
            assert {tuple(r[k] for k in KEYS[table]) for r in archived} | set(after) == set(before[table])
            assert all(row == before[table][tuple(row[k] for k in KEYS[table])] for row in archived)
        check_manifests(archive)
