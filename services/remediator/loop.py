"""The remediator's loop: take verdicts and alerts, decide, step the plans, publish the record; until stopped.

It consumes gpu-health and gpu-alerts as one consumer group (GPU-keyed, so a
GPU's messages come in order to one member). Each finding is decided in its
own transaction; the group's offsets are committed after the batch's
decisions are, so a crash re-reads at most one batch, and the decisions' keys
make the second reading change nothing. A batch the database could not take
is read again from where it failed (its partitions are sought back) after a
pause. Between batches the executor looks at the due plans and the outbox
sends the new records to gpu-remediations. Nothing is decided on a message
the remediator cannot believe (trust.py: its signature, its time, its GPU and
host): it is refused, counted, logged and recorded instead.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import confluent_kafka
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuhealth.contract.training import TrainingAlert
from shared.contract.models_health import GpuAlert, HealthVerdict, parse_alert
from shared.contract.signing import KID_HEADER, UntrustedError
from shared.plumbing.errors import ContractError, DataRefusedError, GpuHealthError
from shared.plumbing.kafka import JsonProducer, close_consumer, take
from shared.settings.common import DatabaseSettings, TopicSettings
from shared.store import remediation_ledger as ledger
from shared.store.errors import translated
from shared.store.remediation import SyncConn

from . import moot
from .decide import Decided, decide
from .executor import Executor
from .findings import Finding, NodeMap, from_alert, from_verdict
from .held import HeldConnection
from .policy import Policy
from .record import Outbox
from .trust import REASONS, Refusal, Trust, placed, refusal_record

log = logging.getLogger("services.remediator")
HEALTH = TopicSettings.entry(
    "health"
)  # the verdicts it reads (the alerts: parse_alert, their entry's decoder)

BACKOFF_S = (0.5, 1, 2, 5, 10)


class RemediatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpuhealth_remediator_"
        self.messages = Counter(
            p + "messages", "Verdicts and alerts read", ["topic", "result"], registry=registry
        )
        self.decisions = Counter(p + "decisions", "Decisions taken", ["outcome"], registry=registry)
        self.refused = Counter(
            p + "refused",
            "Verdicts and alerts not believed, by why (no decision)",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.refused.labels(reason)
        self.steps = Counter(p + "steps", "Looks at a plan's step", ["step", "next"], registry=registry)
        self.published = Counter(
            p + "records_published", "Records sent to gpu-remediations", registry=registry
        )
        self.failures = Counter(
            p + "failures", "Rounds that failed (database, broker)", ["where"], registry=registry
        )
        self.breaker_open = Gauge(p + "breaker_open", "1 while the breaker is open", registry=registry)
        self.paused = Gauge(p + "paused", "1 while an operator has paused the remediator", registry=registry)
        self.dry_run = Gauge(
            p + "dry_run", "1 when the remediator only records what it would do", registry=registry
        )
        self.round_seconds = Histogram(
            p + "round_seconds",
            "Time of one round (batch, plans, outbox)",
            registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
        )


class RemediatorLoop:
    def __init__(
        self,
        *,
        db: DatabaseSettings,
        topics: TopicSettings,
        policy: Policy,
        nodes: NodeMap,
        dry_run: bool,
        consumer: confluent_kafka.Consumer,
        producer: JsonProducer,
        executor: Executor,
        registry: CollectorRegistry,
        trust: Trust,
        batch_size: int = 200,
        poll_timeout_s: float = 0.5,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self.db, self.topics, self.policy, self.nodes, self.dry_run = db, topics, policy, nodes, dry_run
        self.consumer, self.producer, self.executor, self.trust = consumer, producer, executor, trust
        self.outbox = Outbox(db=db, producer=producer, topic=topics.remediations)
        self.held = HeldConnection(db)
        self.metrics = RemediatorMetrics(registry)
        self.metrics.dry_run.set(1 if dry_run else 0)
        self.batch_size, self.poll_timeout_s, self.on_close = batch_size, poll_timeout_s, on_close
        self.failures_in_a_row = 0

    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set; the producer is flushed and the consumer closed however it ends."""
        self.consumer.subscribe([self.topics.health, self.topics.alerts])
        try:
            while not stop.is_set():
                if not self.round():
                    pause = BACKOFF_S[min(self.failures_in_a_row, len(BACKOFF_S)) - 1]
                    stop.wait(pause)
        finally:
            try:
                self.outbox.publish()
            except GpuHealthError as e:
                log.warning("records left unpublished at stop (sent at the next start): %s", e)
            self.producer.close()
            close_consumer(self.consumer)
            self.held.close()
            self.outbox.held.close()
            self.executor.close()
            self.on_close()

    def close_unstarted(self) -> None:
        """Release what was built for a loop that will not run (the service could not start)."""
        self.producer.close()
        close_consumer(self.consumer)
        self.on_close()

    def round(self) -> bool:
        """One batch, one look at the due plans, one outbox flush; False when a part failed."""
        started = time.perf_counter()
        ok = True
        for where, part in (
            ("decide", self.take_batch),
            ("plans", self.step_plans),
            ("publish", self.publish),
        ):
            try:
                part()
            except GpuHealthError as e:
                ok = False
                self.metrics.failures.labels(where).inc()
                log.error("%s failed: %s", where, e)
        self.failures_in_a_row = 0 if ok else self.failures_in_a_row + 1
        self.metrics.round_seconds.observe(time.perf_counter() - started)
        return ok

    def findings(self, message: confluent_kafka.Message) -> Finding | Refusal | None:
        """The message as a finding, once its signature and time hold; a Refusal says why not; None for
        a training job's alert, which is unsigned and never acted on."""
        topic, value = str(message.topic()), message.value() or b""
        try:
            self.trust.verify(message)
        except UntrustedError as e:
            parsed = _parsed(topic == self.topics.health, value)
            if e.reason == "unsigned" and isinstance(parsed, TrainingAlert):
                return None
            return Refusal(e.reason, e.detail, parsed.gpu_uuid if parsed is not None else None)
        try:
            if topic == self.topics.health:
                verdict = HEALTH.read(HealthVerdict, value)
                found, at = from_verdict(verdict, topic), verdict.time
            else:
                alert = parse_alert(value)
                found, at = from_alert(alert, topic, self.policy), alert.time
        except ContractError as e:
            return Refusal("invalid", str(e)[:300])
        late = self.trust.timely(at, datetime.now(UTC))
        return found if late is None else replace(late, gpu_uuid=found.gpu_uuid)

    def take_batch(self) -> None:
        messages = take(self.consumer, self.batch_size, self.poll_timeout_s)
        positions: dict[tuple[str, int], int] = {}  # the next offset to commit, per partition
        done = 0
        try:
            for message in messages:
                error = message.error()
                if error is None:
                    self._decide_one(message)
                    positions[_where(message)] = int(message.offset() or 0) + 1
                elif error.code() != confluent_kafka.KafkaError._PARTITION_EOF:
                    log.warning("kafka: %s", error.str())
                done += 1
        finally:
            self._commit(positions)
            rewind: dict[tuple[str, int], int] = {}  # what was fetched but not decided: read again, in order
            for message in messages[done:]:
                if message.error() is None:
                    rewind.setdefault(_where(message), int(message.offset() or 0))
            for (topic, partition), offset in rewind.items():
                self.consumer.seek(confluent_kafka.TopicPartition(topic, partition, offset))

    def _decide_one(self, message: confluent_kafka.Message) -> None:
        topic = str(message.topic())
        finding = self.findings(message)
        if finding is None:
            self.metrics.messages.labels(topic, "unauthenticated").inc()
            return
        if isinstance(finding, Refusal):
            with self.held.session() as conn:
                self._refuse(conn, message, finding)
            return
        if finding.action == "none":  # most verdicts: healthy again, or nothing to do
            if finding.message.get("state") == "healthy" and topic == self.topics.health:
                self._withdraw_if_moot(finding)
            self._count(topic, Decided(""))
            return
        for attempt in (1, 2):
            try:
                with self.held.session() as conn:
                    now = datetime.now(UTC)
                    where = placed(conn, finding, self.nodes)
                    if isinstance(where, Refusal):
                        self._refuse(conn, message, where)
                        return
                    decided = decide(
                        conn, where, policy=self.policy, nodes=self.nodes, dry_run=self.dry_run, now=now
                    )
                    with translated(conn):
                        conn.commit()
                break
            except DataRefusedError:
                # another remediator opened the node's plan meanwhile: decide again, joining it
                if attempt == 2:
                    raise
        self._count(topic, decided)

    def _withdraw_if_moot(self, finding: Finding) -> None:
        """A healthy verdict: the node's held plan goes if it never acted and all its GPUs are healthy."""
        with self.held.session() as conn:
            where = placed(conn, finding, self.nodes)
            if isinstance(where, Refusal):
                return  # nothing is decided on a GPU the inventory does not place
            if moot.withdraw_if_moot(conn, where, dry_run=self.dry_run, now=datetime.now(UTC)):
                with translated(conn):
                    conn.commit()

    def _refuse(self, conn: SyncConn, message: confluent_kafka.Message, refusal: Refusal) -> None:
        """No decision: the refusal counted, logged (never the signature) and recorded, committed."""
        kid = _kid(message)
        record = refusal_record(refusal, message, kid=kid, at=datetime.now(UTC), dry_run=self.dry_run)
        ledger.insert_events(conn, [record])
        with translated(conn):
            conn.commit()
        self.metrics.refused.labels(refusal.reason).inc()
        self.metrics.messages.labels(str(message.topic()), "refused").inc()
        log.warning(
            "%s message refused, nothing decided: %s: %s",
            message.topic(),
            refusal.reason,
            refusal.detail,
            extra={"partition": message.partition(), "offset": message.offset(), "kid": kid},
        )

    def _count(self, topic: str, decided: Decided) -> None:
        self.metrics.messages.labels(topic, "decided" if decided.outcome else "no_decision").inc()
        if decided.outcome:
            self.metrics.decisions.labels(decided.outcome).inc()

    def _commit(self, positions: dict[tuple[str, int], int]) -> None:
        if not positions:
            return
        offsets = [confluent_kafka.TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except confluent_kafka.KafkaException as e:  # read again after a rebalance: decided already, no harm
            log.warning("offsets not committed: %s", e)

    def step_plans(self) -> None:
        for advanced in self.executor.run_due():
            self.metrics.steps.labels(advanced.step or "end", advanced.next).inc()
        with self.held.session() as conn:
            control = ledger.control(conn, self.dry_run)
        self.metrics.breaker_open.set(1 if control["breaker"] == "open" else 0)
        self.metrics.paused.set(1 if control["paused"] else 0)

    def publish(self) -> None:
        while (sent := self.outbox.publish()) > 0:
            self.metrics.published.inc(sent)
            if sent < self.outbox.batch:
                return


def _parsed(health: bool, value: bytes) -> HealthVerdict | GpuAlert | None:
    """The message as its topic's model, for naming its GPU in a refusal; None when it is not one."""
    try:
        return HEALTH.read(HealthVerdict, value) if health else parse_alert(value)
    except ContractError:
        return None


def _kid(message: confluent_kafka.Message) -> str | None:
    """The message's key id when it is one (16 hex digits), for the log and the record; else None."""
    headers = message.headers()
    for header, value in headers.items() if isinstance(headers, dict) else headers or ():
        if header == KID_HEADER and isinstance(value, bytes) and re.fullmatch(rb"[0-9a-f]{16}", value):
            return value.decode()
    return None


def _where(message: confluent_kafka.Message) -> tuple[str, int]:
    return str(message.topic()), int(message.partition() or 0)
