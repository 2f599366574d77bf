"""Dead-letter leases: held while their session lives, void once it is gone (a killed sink)."""

from __future__ import annotations

from services.sink.deadletters import DeadLetter
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store import deadletters

GROUP = "lease-test"


def test_a_lease_holds_while_its_session_lives_and_is_void_once_it_is_gone(
    migrated: DatabaseSettings,
) -> None:
    with connect(migrated) as conn, conn.cursor() as cur:
        letters = [DeadLetter(b"k", b"v", "raw", 0, offset, "contract", "bad") for offset in range(3)]
        assert deadletters.record(cur, GROUP, letters) == 3
        conn.commit()
    holder = connect(migrated)
    try:
        assert len(deadletters.lease(holder, GROUP, lease_s=3600, limit=10)) == 3
        with connect(migrated) as other:  # a second relay while the holder lives: nothing for it
            assert deadletters.lease(other, GROUP, lease_s=3600, limit=10) == []
    finally:
        holder.close()  # the holder's session ends, as a killed sink's does
    with connect(migrated) as other:  # long before the hour is up, the letters are free again
        again = deadletters.lease(other, GROUP, lease_s=3600, limit=10)
        assert sorted(letter.offset for letter in again) == [0, 1, 2]
        assert {letter.attempts for letter in again} == {2}  # the relay checks the topic before resending
        deadletters.mark_delivered(other, GROUP, [(d.topic, d.partition, d.offset) for d in again])
        assert deadletters.lease(other, GROUP, lease_s=0, limit=10) == []  # delivered: never again
