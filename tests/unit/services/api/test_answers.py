"""The answer models: times in the one format, nulls kept, the fields of the rows they are built from."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from services.api.answers.gpus import LatestSample, Verdict
from services.api.answers.history import SeriesPoint
from services.api.paging import z_time
from shared.contract.models import GpuSample
from shared.store.history import COUNTERS

ZONES = st.builds(lambda minutes: timezone(timedelta(minutes=minutes)), st.integers(-14 * 60, 14 * 60))
TIMES = st.datetimes(min_value=datetime(2000, 1, 2), max_value=datetime(9999, 12, 30), timezones=ZONES)


@given(when=TIMES)
def test_times_go_out_in_utc_with_microseconds_and_a_z(when: datetime) -> None:
    verdict = Verdict.model_validate(
        {"subsystem": "memory", "state": "healthy", "rule": None, "evidence": {}, "since": when}
    )
    written = json.loads(verdict.model_dump_json())["since"]
    assert written == z_time(when)
    assert written.endswith("Z")
    assert len(written) == len("2026-05-01T12:00:00.000000Z")
    assert datetime.fromisoformat(written) == when.astimezone(UTC)


def test_nulls_are_kept_and_no_mig_is_an_empty_list() -> None:
    row = dict.fromkeys(LatestSample.model_fields)
    row |= {"time": datetime(2026, 5, 1, tzinfo=UTC), "gpu_uuid": "GPU-x", "hostname": "h", "source": "mock",
            "collector_id": "c"}  # fmt: skip
    written = json.loads(LatestSample.model_validate(row).model_dump_json())
    assert written["mig"] == []
    assert written["gpu_temp_c"] is None
    assert list(written) == list(LatestSample.model_fields)


def test_the_latest_sample_holds_every_field_of_the_contract_but_the_identity() -> None:
    identity = {"schema_version", "gpu_index", "model", "pci_bus_id", "driver_version"}  # the asset's
    assert set(LatestSample.model_fields) == set(GpuSample.model_fields) - identity


def test_a_series_point_holds_every_counter_the_store_reads() -> None:
    assert list(SeriesPoint.model_fields) == ["t", "temp_c", "temp_max_c", "power_w", "util_pct", *COUNTERS]
