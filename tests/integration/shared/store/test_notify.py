"""shared.store.notify against a real server: a committed cycle is heard, with its schema as the payload."""

from __future__ import annotations

import asyncio

import psycopg

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.notify import CHANNEL, announce_scored, listen_scored


def test_a_committed_announcement_is_heard_with_its_schema(migrated: DatabaseSettings) -> None:
    async def listen_then_hear() -> psycopg.Notify:
        async with await psycopg.AsyncConnection.connect(migrated.conninfo(), autocommit=True) as listener:
            schema = await listen_scored(listener)
            assert schema == migrated.search_path
            with connect(migrated) as scorer:
                announce_scored(scorer)
                scorer.commit()
            # The server is shared: other schemas' cycles may be heard too; ours names its schema.
            async for note in listener.notifies(timeout=10):
                if note.payload == schema:
                    return note
            raise AssertionError("the announcement was not heard within 10 s")

    assert asyncio.run(listen_then_hear()).channel == CHANNEL
