"""shared.store.errors.translate: whose fault a driver failure is, told from its SQLSTATE's class."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import errors

from shared.plumbing.errors import DatabaseError, DatabaseUnavailableError, DataRefusedError
from shared.store.errors import describe, is_data_fault, printable, translate, translated

DATA_CLASSES = {"21", "22", "23", "54"}  # the values' fault
CONNECTION_CLASSES = {"08", "57"}  # the connection's, or the server going away
SQLSTATE = st.text("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=5, max_size=5)


@dataclass
class FakeConnection:
    closed: bool = False
    broken: bool = False


def failure(sqlstate: str) -> psycopg.Error:
    """The exception psycopg raises for `sqlstate`: its own class if it knows the code, else a generic one."""
    try:
        cls = errors.lookup(sqlstate)
    except KeyError:
        cls = type(f"Unknown{sqlstate}", (psycopg.DatabaseError,), {"sqlstate": sqlstate})
    return cls(f"failed with {sqlstate}")


def expected(sqlstate: str) -> type[DatabaseError]:
    if sqlstate[:2] in DATA_CLASSES:
        return DataRefusedError
    if sqlstate[:2] in CONNECTION_CLASSES:
        return DatabaseUnavailableError
    return DatabaseError


KNOWN = sorted(code for code in errors._sqlcodes if len(code) == 5)  # every code psycopg knows


@given(sqlstate=SQLSTATE | st.sampled_from(KNOWN))
def test_the_sqlstate_class_says_whose_fault_it_is(sqlstate: str) -> None:
    translated_error = translate(failure(sqlstate), FakeConnection())  # type: ignore[arg-type]
    assert type(translated_error) is expected(sqlstate)
    assert str(translated_error)  # always says something
    assert "\x00" not in str(translated_error)


@given(sqlstate=SQLSTATE, closed=st.booleans())
def test_on_a_lost_connection_nothing_is_the_values_fault(sqlstate: str, closed: bool) -> None:
    conn = FakeConnection(closed=closed, broken=not closed)
    assert type(translate(failure(sqlstate), conn)) is DatabaseUnavailableError  # type: ignore[arg-type]


@given(text=st.text(st.characters(codec=None), max_size=40))
def test_a_value_python_cannot_send_is_refused_data_and_the_message_is_printable(text: str) -> None:
    error = UnicodeEncodeError("utf-8", text or "\ud800", 0, 1, f"surrogates not allowed: {text}")
    refused = translate(error, FakeConnection())  # type: ignore[arg-type]
    assert type(refused) is DataRefusedError
    str(refused).encode("utf-8")  # no lone surrogate left to break a header or a text column
    assert "\x00" not in str(refused)


@pytest.mark.parametrize(
    ("raised", "kind"),
    [
        (psycopg.OperationalError("server closed the connection unexpectedly"), DatabaseUnavailableError),
        (psycopg.InterfaceError("the connection is closed"), DatabaseUnavailableError),
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"), DataRefusedError),
        (OverflowError("int too big to convert"), DataRefusedError),
    ],
)
def test_translated_raises_the_projects_own_from_the_drivers(
    raised: Exception, kind: type[Exception]
) -> None:
    with pytest.raises(kind) as caught, translated(FakeConnection()):  # type: ignore[arg-type]
        raise raised
    assert caught.value.__cause__ is raised


def test_translated_lets_the_projects_own_through_unchanged() -> None:
    already = DataRefusedError("refused before")
    with pytest.raises(DataRefusedError) as caught, translated(FakeConnection()):  # type: ignore[arg-type]
        raise already
    assert caught.value is already


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
def test_printable_text_has_no_nul_and_no_lone_surrogate(text: str) -> None:
    out = printable(text)
    assert "\x00" not in out
    out.encode("utf-8")
