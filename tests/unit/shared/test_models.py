"""The sample and event contract: every DCGM field has a place; hostile messages are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.contract.models import METRIC_FIELDS, parse_event, parse_sample
from shared.gpu.dcgm import FIELDS
from shared.plumbing.errors import ContractError

GOOD: dict[str, Any] = {
    "schema_version": 1, "time": "2026-11-21T11:00:00.123Z", "source": "dcgm", "collector_id": "c1",
    "collection_latency_ms": 3.5, "gpu_uuid": "GPU-91310d89-c3e8-4b50-81d8-a29050bc85cc",
    "gpu_index": 0, "model": "NVIDIA H100 80GB HBM3", "hostname": "node-1", "gpu_temp_c": 61,
    "power_usage_w": 412.5, "ecc_dbe_volatile_total": 0,
}  # fmt: skip


def test_every_dcgm_field_has_a_place_in_the_sample() -> None:
    assert {f.sample_field for f in FIELDS} == set(METRIC_FIELDS)


def test_a_good_sample_parses_and_time_is_utc_ms() -> None:
    sample = parse_sample(json.dumps({**GOOD, "time": "2026-11-21T12:00:00.123456+01:00"}))
    assert sample.time.isoformat() == "2026-11-21T11:00:00.123000+00:00"
    assert sample.memory_temp_c is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"schema_version": 2}, "unknown schema_version 2"),
        ({"schema_version": "1"}, "unknown schema_version '1'"),
        ({"gpu_temp_c": "61"}, "gpu_temp_c"),
        ({"gpu_temp_c": 1e6}, "gpu_temp_c"),
        ({"power_usage_w": -1}, "power_usage_w"),
        ({"ecc_dbe_volatile_total": 1.5}, "ecc_dbe_volatile_total"),
        ({"ecc_dbe_volatile_total": 2**64}, "ecc_dbe_volatile_total"),
        ({"retired_pages_sbe": 9223372036854775794}, "retired_pages_sbe"),  # DCGM's not-supported
        ({"total_energy_mj": 9223372036854775792}, "total_energy_mj"),  # DCGM's blank
        ({"gpu_util_pct": True}, "gpu_util_pct"),
        ({"gpu_uuid": "'; DROP TABLE gpu_metrics; --"}, "gpu_uuid"),
        ({"hostname": "a\x00b"}, "hostname"),
        ({"hostname": "x" * 300}, "hostname"),
        ({"time": "yesterday"}, "time"),
        ({"time": "2026-11-21T11:00:00"}, "time"),
        ({"time": "1970-01-01T00:00:00Z"}, "time"),
        ({"time": "2999-01-01T00:00:00Z"}, "time"),
        ({"source": "psychic"}, "source"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_hostile_samples_are_refused_with_the_field_named(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(ContractError, match=reason):
        parse_sample(json.dumps({**GOOD, **change}))


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"null", b"[]", b'"text"', b"\xff\xfe", b'{"schema_version":1,"time":NaN}'],
)
def test_malformed_messages_are_refused(raw: bytes) -> None:
    with pytest.raises(ContractError):
        parse_sample(raw)
    with pytest.raises(ContractError):
        parse_event(raw)


def test_nan_and_infinity_tokens_are_refused() -> None:
    text = json.dumps(GOOD).replace('"power_usage_w": 412.5', '"power_usage_w": NaN')
    with pytest.raises(ContractError, match="power_usage_w"):
        parse_sample(text)
    with pytest.raises(ContractError, match="power_usage_w"):
        parse_sample(text.replace("NaN", "Infinity"))
