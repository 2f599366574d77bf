"""One database connection kept across the remediator's rounds, opened again when it breaks.

A round every poll (half a second by default) that opened a connection each time
would spend more on connecting than on deciding. A session yields the held
connection; what the block leaves uncommitted is rolled back at its end (blocks
commit what they mean to keep), and a connection that broke is dropped, so the
next session connects again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.remediation import SyncConn


class HeldConnection:
    def __init__(self, db: DatabaseSettings) -> None:
        self.db = db
        self._conn: SyncConn | None = None

    @contextmanager
    def session(self) -> Iterator[SyncConn]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = connect(self.db)
        conn = self._conn
        try:
            yield conn
        finally:
            if conn.closed or conn.broken:
                self.close()
            else:
                conn.rollback()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
