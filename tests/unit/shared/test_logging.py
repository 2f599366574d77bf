"""JSON log lines: one object per line, extras kept, never failing on odd values."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import datetime

import pytest

from shared.plumbing.logging import setup_logging


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    buffer = io.StringIO()
    setup_logging("DEBUG", service="unit", stream=buffer)
    yield buffer
    logging.getLogger().handlers.clear()


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_fields_and_extras(stream: io.StringIO) -> None:
    logging.getLogger("gpu.test").info("scraped %d GPUs", 8, extra={"node": "n1", "took_ms": 3.5})
    (entry,) = lines(stream)
    assert entry["msg"] == "scraped 8 GPUs"
    assert (entry["level"], entry["logger"], entry["service"]) == ("info", "gpu.test", "unit")
    assert (entry["node"], entry["took_ms"]) == ("n1", 3.5)
    datetime.fromisoformat(str(entry["ts"]))


def test_exceptions_and_unserialisable_values_stay_one_line(stream: io.StringIO) -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("x").exception("failed", extra={"obj": object(), "raw": b"\xff"})
    assert len(stream.getvalue().splitlines()) == 1
    (entry,) = lines(stream)
    assert "ValueError: boom" in str(entry["exc"])
    assert str(entry["obj"]).startswith("<object object")
