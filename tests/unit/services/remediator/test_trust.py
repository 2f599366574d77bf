"""The remediator's trust, without a broker: time bounds, a keyring it must have, and the refusal record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from services.remediator.trust import REASONS, Refusal, Trust, refusal_record
from shared.contract.signing import Keyring, SigningSettings, keygen
from shared.plumbing.errors import ConfigError

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
TRUST = Trust(Keyring.of(Ed25519PrivateKey.generate().public_key()), max_age_s=900, max_future_s=60)


@given(offset=st.floats(-10_000, 10_000, allow_nan=False))
def test_a_message_is_timely_within_its_age_and_the_clocks_slack(offset: float) -> None:
    at = NOW + timedelta(seconds=offset)
    refusal = TRUST.timely(at, NOW)
    if -900 <= offset <= 60:
        assert refusal is None
    elif offset < -900:
        assert refusal is not None
        assert refusal.reason == "stale"
    else:
        assert refusal is not None
        assert refusal.reason == "future"


def test_the_remediator_will_not_start_without_a_keyring(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TRUSTED_KEYS_FILE is needed"):
        Trust.from_settings(SigningSettings())
    with pytest.raises(ConfigError, match="no public key"):
        Trust.from_settings(SigningSettings(trusted_keys_file=tmp_path))
    keygen(tmp_path)
    trust = Trust.from_settings(SigningSettings(trusted_keys_file=tmp_path / "trusted", max_age_s=60))
    assert len(trust.keyring.keys) == 1
    assert trust.max_age == timedelta(seconds=60)


class Message:
    """What the loop reads from confluent-kafka, as far as a refusal record needs it."""

    def __init__(self, headers: Any = None) -> None:
        self._headers = headers

    def topic(self) -> str:
        return "gpu-health"

    def partition(self) -> int:
        return 3

    def offset(self) -> int:
        return 1234

    def headers(self) -> Any:
        return self._headers


@pytest.mark.parametrize("reason", REASONS)
def test_a_refusal_record_names_where_and_why_and_no_node(reason: str) -> None:
    refusal = Refusal(reason, "detail", "GPU-00000001-0000-4000-8000-000000000000")  # type: ignore[arg-type]
    row = refusal_record(refusal, Message(), kid="0123456789abcdef", at=NOW, dry_run=False)  # type: ignore[arg-type]
    assert (row["kind"], row["status"], row["node"], row["remediation_id"]) == (
        "refusal",
        "refused",
        "",
        None,
    )
    assert row["response"] == {
        "topic": "gpu-health", "partition": 3, "offset": 1234, "reason": reason, "kid": "0123456789abcdef"
    }  # fmt: skip
    assert row["reason"] == f"{reason}: detail"  # the record was checked by the topic's contract: it is one


@given(detail=st.text(st.characters(codec=None), max_size=50))
def test_any_detail_a_hostile_message_brings_makes_a_record_a_row_can_hold(detail: str) -> None:
    row = refusal_record(Refusal("invalid", detail), Message(), kid=None, at=NOW, dry_run=True)  # type: ignore[arg-type]
    assert "\x00" not in row["reason"]
    row["reason"].encode("utf-8")  # no lone surrogate: PostgreSQL takes it
    assert "kid" not in row["response"]
