"""Settings: env prefix, nesting, secrets masked, bad values as clear errors."""

from __future__ import annotations

import io
import json
import logging
import re

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.collector.settings import CollectorSettings
from shared.plumbing.errors import ConfigError
from shared.plumbing.logging import setup_logging
from shared.settings.common import DatabaseSettings, Settings, load_settings, log_settings


def test_nested_environment_variables_reach_their_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS", "10.0.0.5:9092,10.0.0.6:9092")
    monkeypatch.setenv("GPUHEALTH_DB__PORT", "6543")
    monkeypatch.setenv("GPUHEALTH_TOPICS__PARTITIONS", "24")
    monkeypatch.setenv("GPUHEALTH_LOG__JSON", "false")
    monkeypatch.setenv("GPUHEALTH_DB__HOST", "")  # empty means "not set"
    s = load_settings(Settings)
    assert s.kafka.bootstrap_servers == "10.0.0.5:9092,10.0.0.6:9092"
    assert (s.db.port, s.db.host, s.topics.partitions, s.log.json_format) == (
        6543,
        "127.0.0.1",
        24,
        False,
    )


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("GPUHEALTH_DB__PORT", "70000"),
        ("GPUHEALTH_DB__PORT", "fifty"),
        ("GPUHEALTH_TOPICS__PARTITIONS", "0"),
        ("GPUHEALTH_TOPICS__RETENTION_MS", "-1"),
    ],
)
def test_invalid_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=var):
        load_settings(Settings)


def test_secrets_never_reach_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEALTH_DB__PASSWORD", "hunter2-db")
    monkeypatch.setenv("GPUHEALTH_KAFKA__SASL_PASSWORD", "hunter2-kafka")
    s = load_settings(Settings)
    assert s.db.password.get_secret_value() == "hunter2-db"
    stream = io.StringIO()
    setup_logging("INFO", service="test", stream=stream)
    try:
        log_settings(s, "test")
    finally:
        logging.getLogger().handlers.clear()
    line = stream.getvalue()
    assert "hunter2" not in line
    logged = json.loads(line)
    assert logged["settings"]["db"]["password"] == "**********"
    assert logged["settings"]["kafka"]["sasl_password"] == "**********"
    assert "hunter2" not in repr(s)
    assert "hunter2" not in str(s)


@pytest.mark.parametrize("password", ["p'w", "a b", "back\\slash", "x' host='evil", "ünï"])
def test_conninfo_quotes_hostile_values(password: str) -> None:
    db = DatabaseSettings.model_validate({"password": password, "name": "db name"})
    parsed = psycopg.conninfo.conninfo_to_dict(db.conninfo())
    assert parsed["password"] == password
    assert parsed["dbname"] == "db name"
    assert parsed["host"] == "127.0.0.1"


@settings(deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=200))
def test_a_list_or_object_that_is_not_json_is_a_config_error(value: str) -> None:
    """Whatever the text, the settings load or say which variable is wrong: never a traceback."""
    env = {"GPUHEALTH_COLLECTOR__DCGM_URLS": value, "GPUHEALTH_KAFKA__EXTRA": value}
    with pytest.MonkeyPatch.context() as patch:
        for name, text in env.items():
            patch.setenv(name, text)
        try:
            loaded = load_settings(CollectorSettings)
        except ConfigError as e:
            refused = str(e)
        else:
            assert isinstance(loaded.collector.dcgm_urls, list)
            assert isinstance(loaded.kafka.extra, dict)
            return
    assert re.search(r"GPUHEALTH_(COLLECTOR|KAFKA)__", refused), refused


def test_json_that_is_not_json_names_the_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUHEALTH_COLLECTOR__DCGM_URLS", "http://10.0.0.5:9400/metrics")
    with pytest.raises(ConfigError, match=r"GPUHEALTH_COLLECTOR__\*: a list or object that is not JSON"):
        load_settings(CollectorSettings)


@given(st.from_regex(r"[a-z_][a-z0-9_]{0,62}", fullmatch=True))
def test_a_bound_schema_is_the_only_one_on_the_search_path(schema: str) -> None:
    """No `public` after it: a table missing from the schema is an error, never another schema's table."""
    options = psycopg.conninfo.conninfo_to_dict(DatabaseSettings(search_path=schema).conninfo())["options"]
    assert options == f"-c search_path={schema}"


def test_an_unbound_service_keeps_the_roles_search_path() -> None:
    assert "options" not in psycopg.conninfo.conninfo_to_dict(DatabaseSettings().conninfo())


def test_a_ca_means_verify_full_and_nothing_weaker() -> None:
    db = DatabaseSettings(sslrootcert="/etc/ca.pem")
    assert db.sslmode == "verify-full"
    assert "sslrootcert='/etc/ca.pem'" in db.conninfo()
    assert "sslmode='verify-full'" in db.conninfo()
    assert DatabaseSettings(sslrootcert="/etc/ca.pem", sslmode="verify-ca").sslmode == "verify-ca"
    for weaker in ("disable", "allow", "prefer", "require"):
        with pytest.raises(ValueError, match="would not be checked"):
            DatabaseSettings(sslrootcert="/etc/ca.pem", sslmode=weaker)
    with pytest.raises(ValueError, match="sslmode"):
        DatabaseSettings(sslmode="verify-everything")
    assert DatabaseSettings().sslmode == "prefer"
