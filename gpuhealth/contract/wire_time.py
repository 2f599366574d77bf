"""The topics' time format: UTC, ISO 8601, with a `Z` (``2026-11-22T18:00:00.123000Z``).

Every time a Kafka message carries goes through :func:`wire_time`: the models'
time fields (``gpuhealth.contract.base.UtcTime``) serialise with it, and so does
every time a producer writes as text (event details, verdict evidence,
dead-letter headers, the mock's answers). The format is the one the sample
contract has always written: seconds, then the microseconds when there are any
(the contract's times are cut to milliseconds, so ``.123000``), then ``Z``,
never ``+00:00``. The API's answers have a format of their own, always with six
fraction digits (services/api/paging.py, ``z_time``).
"""

from __future__ import annotations

from datetime import UTC, datetime


def wire_time(value: datetime) -> str:
    """`value` as the topics write a time; ValueError for a time without a timezone."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a message time must carry a timezone")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
