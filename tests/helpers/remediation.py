"""The remediator's tests: a fleet in the inventory, verdicts and scoring cycles, as the scorer writes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from services.remediator.decide import decide
from services.remediator.drivers.node_exec import Command
from services.remediator.executor import Executor
from services.remediator.findings import Finding, NodeMap, from_verdict
from services.remediator.policy import Policy
from shared.contract.models_health import HealthVerdict
from shared.contract.signing import Signer, keygen
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer
from shared.settings.common import DatabaseSettings, KafkaSettings

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def gpu_uuid(node: int, index: int) -> str:
    return f"GPU-{node:08d}-{index:04d}-4000-8000-000000000000"


def node_name(node: int) -> str:
    return f"gpu-node-{node:02d}"


def add_fleet(
    db: DatabaseSettings, nodes: int, gpus: int = 2, *, names: Callable[[int], str] = node_name
) -> None:
    """`nodes` nodes of `gpus` GPUs in the inventory, each with a sample and a healthy status."""
    add_nodes(db, {names(n): [gpu_uuid(n, g) for g in range(gpus)] for n in range(nodes)})


def add_nodes(db: DatabaseSettings, nodes: dict[str, list[str]]) -> None:
    """Each host's GPUs (by index) in the inventory, each with a sample and a healthy status."""
    hosts = [h for h, uuids in nodes.items() for _ in uuids]
    uuids = [u for found in nodes.values() for u in found]
    indexes = [i for found in nodes.values() for i in range(len(found))]
    with connect(db) as conn:
        conn.execute(
            """INSERT INTO gpu_assets (gpu_uuid, model, gpu_index, hostname, first_seen, last_seen)
               SELECT u, 'NVIDIA H100 80GB HBM3', i, h, %(t)s, %(t)s
               FROM unnest(%(uuids)s::text[], %(indexes)s::int[], %(hosts)s::text[]) AS gpu(u, i, h)""",
            {"t": T0, "uuids": uuids, "indexes": indexes, "hosts": hosts},
        )
        conn.execute(
            """INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id)
               SELECT %s, gpu_uuid, hostname, 'mock', 'test' FROM gpu_assets WHERE gpu_uuid = ANY(%s)""",
            (T0, uuids),
        )
        conn.execute(
            "INSERT INTO gpu_status (gpu_uuid, state, score, grade, action, as_of)"
            " SELECT gpu_uuid, 'healthy', 100, 'A', 'none', %s FROM gpu_assets WHERE gpu_uuid = ANY(%s)",
            (T0, uuids),
        )
        conn.commit()


def sample_again(db: DatabaseSettings, hostname: str, at: datetime, uuids: list[str] | None = None) -> None:
    """The node's GPUs (or `uuids`, on it) report again at `at` (the collector, through the sink)."""
    with connect(db) as conn:
        if uuids is not None:
            for uuid in uuids:
                conn.execute(
                    "INSERT INTO gpu_latest (time, gpu_uuid, hostname, source, collector_id)"
                    " VALUES (%s, %s, %s, 'mock', 'test')"
                    " ON CONFLICT (gpu_uuid) DO UPDATE SET time = EXCLUDED.time",
                    (at, uuid, hostname),
                )
        conn.execute("UPDATE gpu_latest SET time = %s WHERE hostname = %s", (at, hostname))
        conn.commit()


def score(db: DatabaseSettings, hostname: str, at: datetime, state: str = "healthy") -> None:
    """A scoring cycle as of `at` judged the node's GPUs `state` (gpu_status, as the scorer writes it)."""
    with connect(db) as conn:
        conn.execute(
            "UPDATE gpu_status SET state = %s, as_of = %s WHERE gpu_uuid IN"
            " (SELECT gpu_uuid FROM gpu_assets WHERE hostname = %s)",
            (state, at, hostname),
        )
        conn.commit()


def verdict_finding(
    node: int,
    index: int = 0,
    *,
    action: str = "reset_gpu",
    at: datetime = T0,
    hostname: str | None = None,
    rule: str = "xid_79",
    uuid: str | None = None,
) -> Finding:
    verdict = HealthVerdict(
        time=at,
        gpu_uuid=gpu_uuid(node, index) if uuid is None else uuid,
        hostname=node_name(node) if hostname is None else hostname,
        subsystem="xid",
        state="unhealthy",
        previous="healthy",
        rule=rule,
        action=action,  # type: ignore[arg-type]
        evidence={"xid": 79},
    )
    return from_verdict(verdict, "gpu-health")


@dataclass(frozen=True)
class ScorerKey:
    """A test's scorer signing key (generated, never committed) and the keyring the remediator is given."""

    signer: Signer
    signer_file: Path  # the private key, for a service's settings
    trusted: Path

    def produce(self, producer: JsonProducer, topic: str, key: str, value: dict[str, Any]) -> None:
        """`value` on `topic` under `key`, signed as the scorer signs it."""
        producer.produce(topic, key, value, headers=self.signer.headers(topic, key, value))


def service_env(
    kafka: KafkaSettings, db: DatabaseSettings, topics: dict[str, str], *, port: int, trusted: Path
) -> dict[str, str]:
    """`python -m services.remediator`'s environment in a test: the test's broker, schema and topics
    (`health`, `alerts`, `remediations`), its /metrics port, a group of its own, the keyring."""
    return {
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        **{f"GPUHEALTH_TOPICS__{kind.upper()}": topic for kind, topic in topics.items()},
        "GPUHEALTH_DB__SEARCH_PATH": str(db.search_path),
        "GPUHEALTH_REMEDIATOR__METRICS_PORT": str(port),
        "GPUHEALTH_REMEDIATOR__GROUP_ID": f"rem-{uuid.uuid4().hex[:8]}",
        "GPUHEALTH_REMEDIATOR__SIGNING__TRUSTED_KEYS_FILE": str(trusted),
    }


def scorer_key(directory: Path) -> ScorerKey:
    """A new key pair under `directory`, as `python -m shared.contract.signing keygen` makes it."""
    _, private, _ = keygen(directory)
    return ScorerKey(Signer.load(private), private, directory / "trusted")


def rows(db: DatabaseSettings, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with connect(db) as conn:
        return conn.execute(query, params).fetchall()


class PlanClock:
    """The plans' clock in a test: the wall clock, moved on by `advance` where a test waits for a deadline
    (a drain's, a validation's, the breaker's window) rather than sleeping through it."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.ahead

    def advance(self, seconds: float) -> None:
        self.ahead += timedelta(seconds=seconds)


@dataclass
class Remediator:
    """The executor and what it acts by, as the service builds them; `clock` is the executor's."""

    db: DatabaseSettings
    policy: Policy
    executor: Executor
    nodes: NodeMap
    clock: PlanClock

    def run_until_settled(self, *, rounds: int = 100, pause_s: float = 0.06) -> None:
        """Step the plans until a look after a pause (longer than the test executors' waits) moves none of
        them on: what is left waits on the world (a budget, a job, the scoring cycles), not on time."""
        seen: object = None
        for _ in range(rounds):
            self.executor.run_due()
            time.sleep(pause_s)
            self.executor.run_due()
            now = rows(self.db, "SELECT id, step, state FROM remediations ORDER BY id")
            if now == seen:
                return
            seen = now


TRUE = Command(argv=["true"], per_gpu=False)
FALSE = Command(argv=["sh", "-c", "echo 'GPU 1: FAIL (max rel err 3.1e-01)'; exit 1"], per_gpu=False)
REPO_ROOT = Path(__file__).resolve().parents[4]


def decide_all(r: Remediator, findings: list[Finding], *, dry_run: bool, at: datetime | None = None) -> None:
    """Each finding decided (and committed) as the service's consumer decides it (at r's now, or `at`)."""
    with connect(r.db) as conn:
        for finding in findings:
            now = r.clock() if at is None else at
            decide(conn, finding, policy=r.policy, nodes=NodeMap(), dry_run=dry_run, now=now)
            conn.commit()


def returned(r: Remediator, node: str, *, deadline_s: float = 60.0) -> None:
    """The node's GPUs come back and healthy cycles follow (three at least) until the plans that ran on
    it have ended, their validation passed or failed; on a busy machine a look can come after several
    cycles, so it is the plans' state that ends the wait, within `deadline_s`, not a count of pauses."""
    now = datetime.now(UTC)
    query = "SELECT id FROM remediations WHERE node = %s AND state = 'running'"
    running = [plan for (plan,) in rows(r.db, query, (node,))]
    sample_again(r.db, node, now)
    r.run_until_settled()
    until, cycle = time.monotonic() + deadline_s, 0
    while True:
        cycle += 1
        time.sleep(0.06)
        score(r.db, node, now + timedelta(seconds=cycle))
        r.run_until_settled(pause_s=0.06)
        still = {plan for (plan,) in rows(r.db, query, (node,))} & set(running)
        if (cycle >= 3 and not still) or time.monotonic() > until:
            return


def plans_in_every_state(db: DatabaseSettings, policy: Policy) -> None:
    """Live plans an operator must see, and the live breaker open: #1 a GPU reset that runs, #2 a reboot
    pending approval, #3 a GPU reset failed (as a drain past its deadline leaves it: the node stays out)."""
    add_fleet(db, 40)
    with connect(db) as conn:
        for finding in (verdict_finding(0), verdict_finding(1, action="reboot_node"), verdict_finding(2)):
            decide(conn, finding, policy=policy, nodes=NodeMap(), dry_run=False, now=datetime.now(UTC))
            conn.commit()
        conn.execute("UPDATE remediations SET state = 'failed', step = 1 WHERE id = 3")
        conn.execute(
            "UPDATE remediation_control SET breaker = 'open', tripped_at = now(),"
            " trip_reason = '4 nodes taken out within 900 s (at most 4)' WHERE NOT dry_run"
        )
        conn.commit()
