"""gpu-processes and llm-sessions messages into rows, and the one transaction that stores a batch of them.

Decoding refuses a bad record with a reason (it becomes a dead letter, see
decode.DeadLetter) and keeps the rest. A batch's rows and its next offsets are
written in one transaction; every insert is `ON CONFLICT DO NOTHING` on the
table's idempotency key, so a replayed message changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from shared.config import DatabaseSettings, TopicSettings
from shared.db import connect
from shared.errors import ContractError, DatabaseError, DatabaseUnavailableError
from shared.models_workload import (
    GpuProcesses,
    LlmServerStatus,
    LlmSession,
    parse_gpu_processes,
    parse_llm_message,
)

from .deadletters import DeadLetter
from .decode import Record

Partition = tuple[str, int]


@dataclass(slots=True)
class WorkloadBatch:
    processes: list[GpuProcesses] = field(default_factory=list)
    sessions: list[LlmSession] = field(default_factory=list)
    servers: list[LlmServerStatus] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[Partition, int] = field(default_factory=dict)


def _decode_one(
    batch: WorkloadBatch, topics: TopicSettings, topic: str, key: bytes | None, value: bytes
) -> None:
    if topic == topics.processes:
        message = parse_gpu_processes(value)
        if key is not None and key != message.gpu_uuid.encode():
            raise ContractError("message key does not match gpu_uuid")
        batch.processes.append(message)
    elif topic == topics.llm_sessions:
        parsed = parse_llm_message(value)
        (batch.sessions if isinstance(parsed, LlmSession) else batch.servers).append(parsed)  # type: ignore[arg-type]
    else:
        raise LookupError(f"the workload sink does not read topic {topic!r}")


def decode_workload(messages: Sequence[Record], topics: TopicSettings, max_bytes: int) -> WorkloadBatch:
    batch = WorkloadBatch()
    for msg in messages:
        if msg.error() is not None:
            continue
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        if offset >= batch.next_offsets.get((topic, partition), 0):
            batch.next_offsets[(topic, partition)] = offset + 1
        value, key = msg.value(), msg.key()
        refused: tuple[str, str] | None = None
        if value is None:
            refused = ("empty", "message has no value")
        elif len(value) > max_bytes:
            refused = ("oversized", f"message of {len(value)} bytes exceeds {max_bytes}")
        else:
            try:
                _decode_one(batch, topics, topic, key, value)
            except ContractError as e:
                refused = ("key" if "key does not match" in str(e) else "contract", str(e))
            except LookupError as e:
                refused = ("topic", str(e))
        if refused is not None:
            batch.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return batch


def process_rows(m: GpuProcesses) -> list[tuple[Any, ...]]:
    return [
        (
            m.time,
            m.gpu_uuid,
            p.pid,
            m.hostname,
            p.type,
            p.used_memory_mib,
            p.sm_util_pct,
            p.mem_util_pct,
            p.executable,
            p.command_line,
            p.user,
            p.start_time,
            p.container_id,
            p.pod_uid,
            p.qos_class,
            p.classification.value,
            p.rule,
        )
        for p in m.processes
    ]


_SESSION_COLS = (
    "time",
    "request_id",
    "source",
    "monitor_id",
    "server",
    "engine",
    "endpoint",
    "model",
    "streamed",
    "http_status",
    "ok",
    "error",
    "prompt_tokens",
    "completion_tokens",
    "load_ms",
    "prompt_eval_ms",
    "eval_ms",
    "total_ms",
    "ttft_ms",
    "wall_ms",
    "tokens_per_s",
    "tpot_ms",
)
_SERVER_COLS = (
    "time",
    "server",
    "engine",
    "monitor_id",
    "up",
    "version",
    "models",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage_ratio",
    "ttft_ms",
    "tpot_ms",
    "prompt_tokens",
    "completion_tokens",
)


def _insert(table: str, cols: Sequence[str]) -> str:
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})"
        " ON CONFLICT DO NOTHING"
    )


INSERT_PROCESS = _insert(
    "gpu_processes",
    (
        "time",
        "gpu_uuid",
        "pid",
        "hostname",
        "type",
        "used_memory_mib",
        "sm_util_pct",
        "mem_util_pct",
        "executable",
        "command_line",
        "username",
        "start_time",
        "container_id",
        "pod_uid",
        "qos_class",
        "classification",
        "rule",
    ),
)
INSERT_POLL = _insert(
    "gpu_process_polls",
    ("time", "gpu_uuid", "gpu_index", "hostname", "collector_id", "source", "process_count"),
)
UPSERT_LATEST = (
    "INSERT INTO gpu_process_latest (gpu_uuid, time, gpu_index, hostname, process_count)"
    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (gpu_uuid) DO UPDATE SET time = EXCLUDED.time,"
    " gpu_index = EXCLUDED.gpu_index, hostname = EXCLUDED.hostname, process_count = EXCLUDED.process_count"
    " WHERE EXCLUDED.time > gpu_process_latest.time"
)
INSERT_SESSION = _insert("llm_sessions", _SESSION_COLS)
INSERT_SERVER = _insert("llm_server_status", _SERVER_COLS)
UPSERT_OFFSET = (
    "INSERT INTO kafka_offsets (consumer_group, topic, partition, next_offset) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (consumer_group, topic, partition) DO UPDATE"
    " SET next_offset = greatest(kafka_offsets.next_offset, EXCLUDED.next_offset), updated_at = now()"
)


class WorkloadWriter:
    """One connection; a batch is one transaction, offsets included."""

    def __init__(self, settings: DatabaseSettings, *, group: str, statement_timeout_ms: int = 60_000) -> None:
        self.settings, self.group, self.statement_timeout_ms = settings, group, statement_timeout_ms
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = connect(self.settings)
            try:
                self._conn.execute(f"SET statement_timeout = {int(self.statement_timeout_ms)}")
                self._conn.commit()
            except psycopg.Error as e:
                self.close()
                raise DatabaseUnavailableError(f"preparing the workload sink's session failed: {e}") from e
        return self._conn

    def stored_offsets(self, partitions: Sequence[Partition]) -> dict[Partition, int]:
        conn = self._connection()
        try:
            rows = conn.execute(
                "SELECT topic, partition, next_offset FROM kafka_offsets WHERE consumer_group = %s"
                " AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))",
                (self.group, [t for t, _ in partitions], [p for _, p in partitions]),
            ).fetchall()
            conn.commit()
        except psycopg.Error as e:
            self.close()
            raise DatabaseError(f"reading stored offsets failed: {e}") from e
        return {(str(t), int(p)): int(o) for t, p, o in rows}

    def write(self, batch: WorkloadBatch) -> int:
        """Store the batch and its offsets atomically; returns the rows inserted."""
        conn = self._connection()
        inserted = 0
        try:
            with conn.cursor() as cur:
                for m in batch.processes:
                    cur.execute(
                        INSERT_POLL,
                        (
                            m.time,
                            m.gpu_uuid,
                            m.gpu_index,
                            m.hostname,
                            m.collector_id,
                            m.source,
                            len(m.processes),
                        ),
                    )
                    inserted += cur.rowcount
                    cur.execute(
                        UPSERT_LATEST, (m.gpu_uuid, m.time, m.gpu_index, m.hostname, len(m.processes))
                    )
                    if m.processes:
                        cur.executemany(INSERT_PROCESS, process_rows(m))
                for s in batch.sessions:
                    cur.execute(INSERT_SESSION, tuple(getattr(s, c) for c in _SESSION_COLS))
                    inserted += cur.rowcount
                for v in batch.servers:
                    values = [
                        Jsonb([x.model_dump(mode="json") for x in v.models])
                        if c == "models"
                        else getattr(v, c)
                        for c in _SERVER_COLS
                    ]
                    cur.execute(INSERT_SERVER, values)
                    inserted += cur.rowcount
                cur.executemany(
                    UPSERT_OFFSET, [(self.group, t, p, o) for (t, p), o in sorted(batch.next_offsets.items())]
                )
            conn.commit()
        except psycopg.Error as e:
            try:
                conn.rollback()
            except psycopg.Error:
                self.close()
            raise DatabaseError(f"workload batch write failed: {e}") from e
        return inserted

    def drop_old_chunks(self, keep_days: dict[str, int]) -> dict[str, int]:
        """drop_chunks on each workload hypertable (either license has it); chunks dropped per table."""
        conn = self._connection()
        dropped = {}
        try:
            for table, days in keep_days.items():
                rows = conn.execute(
                    "SELECT drop_chunks(%s::regclass, older_than => now() - make_interval(days => %s))",
                    (table, days),
                ).fetchall()
                dropped[table] = len(rows)
            conn.commit()
        except psycopg.Error as e:
            self.close()
            raise DatabaseError(f"workload retention failed: {e}") from e
        return dropped

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
