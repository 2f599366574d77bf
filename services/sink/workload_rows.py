"""gpu-processes and llm-sessions messages into rows for shared.store.workload (the records loop's family).

Decoding refuses a bad record with a reason (it becomes a dead letter, see
deadletters.DeadLetter) and keeps the rest, each with where it came from, so
a record PostgreSQL refuses is dead-lettered too (records.py). Every insert is
ON CONFLICT DO NOTHING on the table's idempotency key, so a replayed message
changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from shared.contract.models_workload import (
    GpuProcesses,
    LlmServerStatus,
    LlmSession,
    parse_llm_message,
)
from shared.contract.topic_registry import KeyMismatchError
from shared.plumbing.errors import ContractError
from shared.settings.common import TopicSettings
from shared.store import workload
from shared.store.offsets import Partition
from shared.store.workload import SERVER_COLUMNS, SESSION_COLUMNS

from .deadletters import DeadLetter, unreadable
from .decode import Record
from .records import Cursor, Item

PROCESSES = TopicSettings.entry("processes")

# The tables, as the rows metric names them: a process listing counts under its poll.
POLLS, SESSIONS, SERVERS = "gpu_process_polls", "llm_sessions", "llm_server_status"


@dataclass(slots=True)
class WorkloadBatch:
    records: list[Item] = field(default_factory=list)  # (table, message, origin), in consumed order
    dead: list[DeadLetter] = field(default_factory=list)
    next_offsets: dict[Partition, int] = field(default_factory=dict)

    def items(self) -> list[Item]:
        return self.records


def _decode_one(topics: TopicSettings, topic: str, key: bytes | None, value: bytes) -> tuple[str, Any]:
    if topic == topics.processes:
        message = PROCESSES.read(GpuProcesses, value)
        PROCESSES.check_key(key, message)
        return POLLS, message
    if topic == topics.llm_sessions:
        parsed = parse_llm_message(value)
        return (SESSIONS if isinstance(parsed, LlmSession) else SERVERS), parsed
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
        refused = unreadable(value, max_bytes)
        if refused is None:
            assert value is not None  # unreadable() refuses a record without one
            try:
                table, record = _decode_one(topics, topic, key, value)
                batch.records.append((table, record, (topic, partition, offset, key, value)))
            except ContractError as e:
                refused = ("key" if isinstance(e, KeyMismatchError) else "contract", str(e))
            except LookupError as e:
                refused = ("topic", str(e))
            except Exception as e:  # whatever a record is, it is not a crash
                refused = ("contract", str(e)[:4000])
        if refused is not None:
            batch.dead.append(DeadLetter(key, value, topic, partition, offset, *refused))
    return batch


def poll_row(m: GpuProcesses) -> tuple[Any, ...]:
    """The listing's poll, in workload.POLL_COLUMNS' order."""
    return (m.time, m.gpu_uuid, m.gpu_index, m.hostname, m.collector_id, m.source, len(m.processes))


def process_rows(m: GpuProcesses) -> list[tuple[Any, ...]]:
    """The listing's processes, in workload.PROCESS_COLUMNS' order."""
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
            p.launcher,
            p.job_key,
            p.rank,
            p.local_rank,
            p.world_size,
            p.launch_note,
        )
        for p in m.processes
    ]


def session_row(s: LlmSession) -> tuple[Any, ...]:
    return tuple(getattr(s, c) for c in SESSION_COLUMNS)


def server_row(v: LlmServerStatus) -> tuple[Any, ...]:
    return tuple(
        Jsonb([x.model_dump(mode="json") for x in v.models]) if c == "models" else getattr(v, c)
        for c in SERVER_COLUMNS
    )


class WorkloadRecords:
    """The records loop's family for gpu-processes and llm-sessions."""

    name = "workload"

    def topics(self, topics: TopicSettings) -> list[str]:
        return topics.stored_by("workload")

    def batch_of(self, messages: Sequence[Record], topics: TopicSettings, max_bytes: int) -> WorkloadBatch:
        return decode_workload(messages, topics, max_bytes)

    def insert(self, cur: Cursor, table: str, record: Any) -> int:
        if table == POLLS:
            return workload.insert_process_poll(cur, poll_row(record), process_rows(record))
        if table == SESSIONS:
            return workload.insert_session(cur, session_row(record))
        return workload.insert_server_status(cur, server_row(record))
