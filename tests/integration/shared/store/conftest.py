"""Fixtures of the data-access package's integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings


@pytest.fixture
def conn(migrated: DatabaseSettings) -> Iterator[psycopg.Connection[Any]]:
    """A connection (not autocommit) to the test's migrated schema."""
    with connect(migrated) as c:
        yield c
