"""The sink's split between a record's fault (isolate it) and the database's (retry the batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import errors

from shared.store.errors import describe, is_data_fault, printable


@dataclass
class FakeConnection:
    closed: bool = False
    broken: bool = False


def fault(sqlstate: str) -> psycopg.Error:
    return errors.lookup(sqlstate)(f"failed with {sqlstate}")


@pytest.mark.parametrize(
    "error",
    [
        fault("22021"),  # a NUL in text
        fault("22P05"),  # \u0000 in jsonb
        fault("22003"),  # a number out of range
        fault("23514"),  # a CHECK the row breaks
        fault("23502"),  # NOT NULL
        fault("54000"),  # a value over a program limit
        psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),  # client side
        psycopg.ProgrammingError("cannot adapt type 'object'"),  # client side
        fault("21000"),  # the same key twice in one statement
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
        OverflowError("int too big to convert"),
    ],
)
def test_what_the_values_caused_is_the_records_fault(error: Exception) -> None:
    assert is_data_fault(error, FakeConnection())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        fault("08006"),  # connection failure
        fault("57P01"),  # the server shutting down
        fault("57014"),  # statement timeout
        fault("40P01"),  # deadlock
        fault("53200"),  # out of memory
        fault("42P01"),  # a missing table: the schema's problem, not the record's
        fault("XX000"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.InterfaceError("the connection is closed"),
    ],
)
def test_what_the_connection_or_server_caused_is_retried(error: Exception) -> None:
    assert not is_data_fault(error, FakeConnection())  # type: ignore[arg-type]


def test_a_broken_connection_is_never_the_records_fault() -> None:
    for conn in (FakeConnection(broken=True), FakeConnection(closed=True)):
        assert not is_data_fault(fault("22021"), conn)  # type: ignore[arg-type]
        assert not is_data_fault(ValueError("x"), conn)  # type: ignore[arg-type]


def test_the_reason_is_the_databases_own_and_safe_to_send() -> None:
    assert describe(fault("22021")).startswith("database refused it (22021)")
    reason = describe(UnicodeEncodeError("utf-8", "a\ud800", 1, 2, "surrogates not allowed"))
    reason.encode("utf-8")  # a header and a text column can hold it
    assert "UnicodeEncodeError" in reason


@pytest.mark.parametrize("text", ["a\x00b", "\ud800", "ok", "\U0001f600"])
def test_printable_text_has_no_nul_and_no_lone_surrogate(text: Any) -> None:
    out = printable(text)
    assert "\x00" not in out
    out.encode("utf-8")
