"""Every service that writes the database exits 0 within the one shutdown deadline (shared.plumbing.running,
GPUHEALTH_SHUTDOWN__TIMEOUT_S) when SIGTERM comes while its statement waits on the database.

The database holds a statement up with a lock: the scorer's cycle reads gpu_latest, the remediator
looks at its plans (remediations) every round, the lifecycle service writes its run (lifecycle_runs);
another session holds that table, the service's statement waits on it. SIGTERM comes; the process
exits 0 before the deadline (the lock still held), and nothing of the work it gave up is written. A
server gone quiet is not in this file's matrix yet (see below). (The sink's own cases, with its offsets:
tests/integration/services/sink/test_shutdown.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from evaluation.pipeline import wait_until
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.remediation import scorer_key
from tests.helpers.service_process import waiting_on_a_lock, watched_service
from tests.helpers.topics import isolated_topics, topics_env

DEADLINE_S = 10.0
# service: (the table another session holds, the section of its settings, the table it would write)
HELD = {
    "scorer": ("gpu_latest", "SCORER", "gpu_status"),
    "remediator": ("remediations", "REMEDIATOR", "remediation_decisions"),
    "lifecycle": ("lifecycle_runs", "LIFECYCLE", "lifecycle_runs"),
}


def service_env(
    service: str, kafka: KafkaSettings, db: DatabaseSettings, topic_factory: Callable[..., str], tmp: Path
) -> dict[str, str]:
    section = HELD[service][1]
    inventory = tmp / "inventory.csv"
    inventory.write_text("serial,gpu_uuid\n")
    keys = scorer_key(tmp / "keys")  # the remediator starts only with a keyring to check verdicts by
    return {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "GPUHEALTH_DB__HOST": db.host, "GPUHEALTH_DB__PORT": str(db.port),
        "GPUHEALTH_DB__SEARCH_PATH": str(db.search_path), **topics_env(isolated_topics(topic_factory)),
        "GPUHEALTH_SHUTDOWN__TIMEOUT_S": str(DEADLINE_S), f"GPUHEALTH_{section}__METRICS_PORT": "0",
        # groups of its own: never a running stack's
        "GPUHEALTH_SCORER__GROUP": f"scorer-{uuid.uuid4().hex[:8]}", "GPUHEALTH_SCORER__INTERVAL_S": "1",
        "GPUHEALTH_REMEDIATOR__GROUP_ID": f"rem-{uuid.uuid4().hex[:8]}",
        "GPUHEALTH_REMEDIATOR__SIGNING__TRUSTED_KEYS_FILE": str(keys.trusted),
        # the lifecycle service runs again when its inventory changes
        "GPUHEALTH_LIFECYCLE__INVENTORY_FILE": str(inventory), "GPUHEALTH_LIFECYCLE__CHECK_EVERY_S": "0.2",
    }  # fmt: skip


def rows(db: DatabaseSettings, table: str) -> int:
    with connect(db) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(str(row[0])) if row else 0


def held_by_a_lock(service: str, db: DatabaseSettings, env: dict[str, str]) -> float:
    """The service's statement waits on a lock another session holds: SIGTERM to exit; the lock is still
    held then, and nothing of the work given up was written."""
    table, _, written = HELD[service]
    with connect(db) as locker:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        with watched_service(service, env) as proc:
            wait_until(lambda: waiting_on_a_lock(db), 60, f"the {service} to wait on the lock")
            took = proc.sigterm(DEADLINE_S)
            assert not waiting_on_a_lock(db), "the cancelled statement still waits"
        locker.rollback()
    assert rows(db, written) == 0
    return took


# Behind a silent server only the lock is in the matrix here: since PostgreSQL serves TLS
# (verify-full), the scorer's and the lifecycle service's work after the freeze sent nothing the
# frozen proxy could hold within 60 s (the remediator's did), and why is not yet known. The sink's
# silent-server test (tests/integration/services/sink/test_shutdown.py) and the watcher's unit tests
# (tests/unit/shared/test_db.py: deaf connections are cut) cover that path.
# The case that was here (git history: held_by_a_quiet_server) comes back once that is understood.
@pytest.mark.parametrize("service", sorted(HELD))
def test_sigterm_while_the_database_holds_a_statement_up_exits_0_within_the_deadline(
    service: str,
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    env = service_env(service, kafka_settings, migrated, topic_factory, tmp_path)
    took = held_by_a_lock(service, migrated, env)
    print(f"{service}, a lock held: SIGTERM to exit {took:.2f} s of {DEADLINE_S:g} s")
