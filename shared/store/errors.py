"""Driver errors translated into the project's own, so callers never catch psycopg's.

PostgreSQL says whose fault a failure is in the SQLSTATE's class: 22 (data
exception: a NUL in jsonb, a number out of range, bad text), 23 (a constraint
the row breaks), 54 (a program limit, e.g. a value too big to index) and 21 (a
batch holding the same key twice) belong to the values sent; so does a value
psycopg cannot even send (text that is not UTF-8, an int too big for bigint, a
type it cannot adapt), which fails in Python before PostgreSQL sees it. A lost
or refused connection is `DatabaseUnavailableError`. Everything else (statement
timeout, deadlock, out of memory, a missing table) is a plain `DatabaseError`:
the same work can succeed later.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from shared.plumbing.errors import DatabaseError, DatabaseUnavailableError, DataRefusedError

_DATA_CLASSES = frozenset({"21", "22", "23", "54"})
_CONNECTION_CLASSES = frozenset({"08", "57"})  # connection exception; operator intervention (shutdown)


def printable(text: str, limit: int = 4000) -> str:
    """Text a header and a PostgreSQL text column can both hold: no NUL, no lone surrogates."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")[:limit]


def describe(error: BaseException) -> str:
    """The database's (or the driver's) own words for why it refused something."""
    if isinstance(error, psycopg.Error) and error.sqlstate is not None:
        detail = error.diag.message_detail
        text = f"database refused it ({error.sqlstate}): {error.diag.message_primary or error}"
        return printable(text + (f" - {detail}" if detail else ""))
    return printable(f"database cannot take it ({type(error).__name__}): {error}")


def is_data_fault(
    error: BaseException, conn: psycopg.Connection[object] | psycopg.AsyncConnection[object]
) -> bool:
    """True if `error` came from the values sent, not from the connection or the server."""
    if conn.closed or conn.broken or not isinstance(error, Exception):
        return False
    if isinstance(error, psycopg.Error):
        state = error.sqlstate
        if state is None:  # raised by psycopg itself, about a value unless about the connection
            return not isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
        return state[:2] in _DATA_CLASSES
    return True  # a value Python could not convert for PostgreSQL (UnicodeEncodeError, OverflowError...)


def translate(
    error: BaseException, conn: psycopg.Connection[object] | psycopg.AsyncConnection[object]
) -> DatabaseError:
    """The project's exception for a driver (or value-conversion) failure on `conn`."""
    if is_data_fault(error, conn):
        return DataRefusedError(describe(error))
    state = getattr(error, "sqlstate", None)
    if (
        conn.closed
        or conn.broken
        or (isinstance(error, psycopg.OperationalError | psycopg.InterfaceError) and state is None)
        or (state or "")[:2] in _CONNECTION_CLASSES
    ):
        return DatabaseUnavailableError(printable(f"database connection lost: {error}"))
    return DatabaseError(printable(f"database failed ({state or type(error).__name__}): {error}"))


@contextmanager
def translated(conn: psycopg.Connection[object] | psycopg.AsyncConnection[object]) -> Iterator[None]:
    """Run a block of statements on `conn`; a driver failure leaves as the project's own exception."""
    try:
        yield
    except DatabaseError:
        raise
    except (psycopg.Error, UnicodeError, OverflowError, TypeError, ValueError) as e:
        raise translate(e, conn) from e
