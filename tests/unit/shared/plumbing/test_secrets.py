"""Secrets in settings: masked in the start-up log whatever their shape, and defaults refused off loopback."""

from __future__ import annotations

import io
import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.api.settings import ApiSettings
from shared.plumbing.logging import setup_logging
from shared.plumbing.secrets import MASK, default_secrets_off_loopback, is_loopback, mask_value, masked
from shared.plumbing.service import start_service
from shared.settings.common import Settings, load_settings, log_settings


def logged_settings(settings: Settings) -> str:
    stream = io.StringIO()
    setup_logging("INFO", service="test", stream=stream)
    try:
        log_settings(settings, "test")
    finally:
        logging.getLogger().handlers.clear()
    return stream.getvalue()


def test_a_password_in_kafka_s_extra_properties_is_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "GPUHEALTH_KAFKA__EXTRA",
        json.dumps({"sasl.password": "hunter2-extra", "sasl.jaas.config": "x password=hunter2-jaas",
                    "ssl.key.pem": "hunter2-pem", "ssl.key.location": "/etc/key.pem"}),
    )  # fmt: skip
    line = logged_settings(load_settings(Settings))
    assert "hunter2" not in line
    extra = json.loads(line)["settings"]["kafka"]["extra"]
    assert extra == {"sasl.password": MASK, "sasl.jaas.config": MASK, "ssl.key.pem": MASK,
                     "ssl.key.location": "/etc/key.pem"}  # fmt: skip


def test_user_info_in_a_url_is_masked() -> None:
    assert (
        mask_value("webhook", "https://bot:hunter2@hooks.example/x?y=1") == "https://***@hooks.example/x?y=1"
    )
    assert mask_value("urls", ["http://a:b@h/", "http://h/"]) == ["http://***@h/", "http://h/"]
    assert mask_value("headers", {"Authorization": "Bearer hunter2", "Accept": "json"}) == {
        "Authorization": MASK, "Accept": "json"}  # fmt: skip


@given(secret=st.text(min_size=1, max_size=40).filter(lambda s: s.strip()))
def test_no_secret_of_any_shape_survives_masking(secret: str) -> None:
    settings = Settings.model_validate(
        {
            "kafka": {
                "sasl_password": secret,
                "extra": {"sasl.password": secret, "ssl.keystore.password": secret},
            },
            "db": {"password": secret},
        }
    )
    dumped = masked(settings)
    assert dumped["kafka"]["extra"] == {"sasl.password": MASK, "ssl.keystore.password": MASK}
    assert dumped["kafka"]["sasl_password"] == dumped["db"]["password"] == MASK


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.0.0.1:9092,localhost:9093", True), ("[::1]:5432", True), ("::1", True),
     ("/var/run/postgresql", True), ("http://127.0.0.1:8000/x", True), ("10.0.0.5", False),
     ("127.0.0.1:9092,kafka:9092", False), ("0.0.0.0", False), ("db.example", False),
     ("http://hooks.example/", False)],
)  # fmt: skip
def test_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_default_passwords_are_refused_off_loopback_only() -> None:
    assert default_secrets_off_loopback(Settings()) == []  # the local stack's defaults, on loopback
    remote = Settings.model_validate({"db": {"host": "db.example"}})
    assert default_secrets_off_loopback(remote) == [
        "GPUHEALTH_DB__PASSWORD is a well-known default, and db.example is not loopback"
    ]
    assert (
        default_secrets_off_loopback(
            Settings.model_validate({"db": {"host": "db.example", "password": "s3c"}})
        )
        == []
    )
    same_as_user = Settings.model_validate({"db": {"host": "10.1.1.1", "user": "ops", "password": "ops"}})
    assert len(default_secrets_off_loopback(same_as_user)) == 1
    api_section = {
        "bind": "0.0.0.0",
        "reader_password": "r-1x",
        "acknowledger_password": "change-me",
    }
    api = ApiSettings.model_validate({"api": api_section})
    assert [p.split(" ")[0] for p in default_secrets_off_loopback(api)] == [
        "GPUHEALTH_API__ACKNOWLEDGER_PASSWORD"
    ]


def test_a_service_with_a_default_password_off_loopback_does_not_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUHEALTH_DB__HOST", "db.example")
    monkeypatch.setenv("GPUHEALTH_LOG__JSON", "false")
    try:
        assert start_service(Settings, "demo", []) is None
    finally:
        logging.getLogger().handlers.clear()
    assert "GPUHEALTH_DB__PASSWORD is a well-known default" in capsys.readouterr().err
    monkeypatch.setenv("GPUHEALTH_DB__PASSWORD", "a-real-one")
    try:
        assert start_service(Settings, "demo", []) is not None
    finally:
        logging.getLogger().handlers.clear()
