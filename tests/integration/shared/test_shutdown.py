"""Every service that writes the database exits 0 within the one shutdown deadline (shared.lifecycle,
GPUHEALTH_SHUTDOWN__TIMEOUT_S) when SIGTERM comes while its statement waits on another session's lock.

The scorer's cycle reads gpu_latest, the remediator looks at its plans (remediations) every round, the
lifecycle service writes its run (lifecycle_runs): another session holds that table, the service's
statement waits on it, SIGTERM comes. The process exits 0 before the deadline, the lock still held, and
nothing of the work it gave up is written. (The sink's own cases: tests/integration/services/sink/
test_shutdown.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from evaluation.pipeline import wait_until
from shared.config import DatabaseSettings, KafkaSettings
from shared.db import connect
from tests.helpers.service_process import waiting_on_a_lock, watched_service
from tests.helpers.topics import isolated_topics, topics_env

DEADLINE_S = 8.0
# service: (the table another session holds, the section of its settings, the table it would write)
HELD = {
    "scorer": ("gpu_latest", "SCORER", "gpu_status"),
    "remediator": ("remediations", "REMEDIATOR", "remediation_decisions"),
    "lifecycle": ("lifecycle_runs", "LIFECYCLE", "lifecycle_runs"),
}


@pytest.mark.parametrize("service", sorted(HELD))
def test_sigterm_while_a_statement_waits_on_a_lock_exits_0_within_the_deadline(
    service: str, kafka_settings: KafkaSettings, migrated: DatabaseSettings, topic_factory: Callable[..., str]
) -> None:
    table, section, written = HELD[service]
    topics = isolated_topics(topic_factory)
    env = {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_DB__HOST": migrated.host, "GPUHEALTH_DB__PORT": str(migrated.port),
        "GPUHEALTH_DB__SEARCH_PATH": str(migrated.search_path), **topics_env(topics),
        "GPUHEALTH_SHUTDOWN__TIMEOUT_S": str(DEADLINE_S), f"GPUHEALTH_{section}__METRICS_PORT": "0",
        # groups of its own: never a running stack's
        "GPUHEALTH_SCORER__GROUP": f"scorer-{uuid.uuid4().hex[:8]}", "GPUHEALTH_SCORER__INTERVAL_S": "1",
        "GPUHEALTH_REMEDIATOR__GROUP_ID": f"rem-{uuid.uuid4().hex[:8]}",
    }  # fmt: skip
    with connect(migrated) as locker:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        with watched_service(service, env) as proc:
            wait_until(lambda: waiting_on_a_lock(migrated), 60, f"the {service} to wait on the lock")
            took = proc.sigterm(DEADLINE_S)
            print(f"{service}: SIGTERM to exit {took:.2f} s of the {DEADLINE_S:g} s deadline")
            assert not waiting_on_a_lock(migrated), "the cancelled statement still waits"
        locker.rollback()
    with connect(migrated) as conn:
        assert conn.execute(f"SELECT count(*) FROM {written}").fetchone() == (0,)
