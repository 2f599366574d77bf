"""drop_schema: a deadlock PostgreSQL ends (with autovacuum, say) is tried again; other failures are not."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from shared.plumbing.errors import DatabaseError
from shared.store.server import drop_schema


class Connection:
    """What drop_schema uses of a psycopg connection; each statement raises the next of `failures`."""

    closed = broken = False

    def __init__(self, failures: list[psycopg.Error], *, autocommit: bool = True) -> None:
        self.failures, self.autocommit = failures, autocommit
        self.statements: list[str] = []
        self.rollbacks = self.commits = 0

    def execute(self, statement: Any) -> None:
        self.statements.append(statement.as_string(None))
        if self.failures:
            raise self.failures.pop(0)

    def rollback(self) -> None:
        self.rollbacks += 1

    def commit(self) -> None:
        self.commits += 1


@pytest.mark.parametrize("autocommit", [True, False])
def test_a_deadlock_is_tried_again(autocommit: bool) -> None:
    conn = Connection([psycopg.errors.DeadlockDetected("deadlock detected")] * 2, autocommit=autocommit)
    drop_schema(conn, "bench_1")  # type: ignore[arg-type]
    assert conn.statements == ['DROP SCHEMA "bench_1" CASCADE'] * 3
    assert (conn.rollbacks, conn.commits) == ((0, 0) if autocommit else (2, 1))


def test_a_deadlock_every_time_fails_after_the_attempts() -> None:
    conn = Connection([psycopg.errors.DeadlockDetected("deadlock detected")] * 3)
    with pytest.raises(DatabaseError, match="40P01"):
        drop_schema(conn, "bench_1")  # type: ignore[arg-type]
    assert len(conn.statements) == 3


def test_another_failure_is_not_tried_again() -> None:
    conn = Connection([psycopg.errors.InsufficientPrivilege("must be owner of schema bench_1")])
    with pytest.raises(DatabaseError, match="42501"):
        drop_schema(conn, "bench_1")  # type: ignore[arg-type]
    assert len(conn.statements) == 1
