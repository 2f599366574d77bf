"""Which write failures are the data's fault (isolate the record) and which are the database's (retry).

PostgreSQL says why in the SQLSTATE's class: 22 (data exception: a NUL in
jsonb, a number out of range, bad text) and 23 (a constraint the row breaks)
belong to the record, and so do 54 (a program limit, e.g. a value too big to
index) and 21 (a batch holding the same key twice: split, it goes in). A
value psycopg cannot even send (text that is not UTF-8, an int too big for
bigint, a type it cannot adapt) fails in Python before PostgreSQL sees it:
the record's fault too. Everything else (connection lost, server shutting
down, statement timeout, deadlock, out of memory, a missing table) is
retried: the same batch can succeed later, and splitting it would only
dead-letter good records.
"""

from __future__ import annotations

import psycopg

from .deadletters import printable

_DATA_CLASSES = frozenset({"21", "22", "23", "54"})


def is_data_fault(error: BaseException, conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """True if `error` came from a record's values, not from the connection or the server."""
    if conn.closed or conn.broken or not isinstance(error, Exception):
        return False
    if isinstance(error, psycopg.Error):
        state = error.sqlstate
        if state is None:  # raised by psycopg itself, about a value unless about the connection
            return not isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
        return state[:2] in _DATA_CLASSES
    return True  # a value Python could not convert for PostgreSQL (UnicodeEncodeError, OverflowError...)


def describe(error: BaseException) -> str:
    """The database's (or the driver's) own words for why it refused a record."""
    if isinstance(error, psycopg.Error) and error.sqlstate is not None:
        detail = error.diag.message_detail
        text = f"database refused it ({error.sqlstate}): {error.diag.message_primary or error}"
        return printable(text + (f" - {detail}" if detail else ""))
    return printable(f"database cannot take it ({type(error).__name__}): {error}")
