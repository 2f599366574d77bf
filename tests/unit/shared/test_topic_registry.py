"""The topics' one table: creation, schemas and settings follow it, and adding a topic is one entry."""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import Annotated, get_args

import pytest
from confluent_kafka.admin import AclOperation, ResourceType
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from shared.contract.topic_registry import (
    CONSUMER_GROUPS,
    GPU_KEY,
    ORIGINAL_KEY,
    PRINCIPALS,
    SCHEMA_DIR,
    Keep,
    Message,
    SinkLoopName,
    Topic,
    TopicName,
    TopicSettings,
    json_schemas,
    schema_text,
    write_json_schemas,
)
from shared.plumbing.errors import ConfigError
from shared.plumbing.topic_admin import project_acls, project_topics
from shared.settings.common import Settings, load_settings
from tests.paths import REPO


class GpuFlight(BaseModel):
    """A topic's model, as strict as the project's: here only to be registered."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    schema_version: int = 1
    gpu_uuid: str
    hops: int = Field(ge=0)


# Adding a topic: this one entry (and its model). Nothing else below is told about it.
class WithFlights(TopicSettings):
    flights: Annotated[
        TopicName,
        Topic(
            Message(GpuFlight, "gpu-flight.v1.schema.json"),
            key=GPU_KEY,
            keep=Keep.RAW,
            partitions=2,
            writers=("collector",),
            readers=("scorer",),
        ),
    ] = "gpu-flights"
    """Where each GPU flew, one message per hop."""


class FlightSettings(Settings):
    topics: WithFlights = Field(default_factory=WithFlights)


def test_the_contributors_doc_shows_this_entry_as_the_whole_diff_of_a_topic() -> None:
    doc = (REPO / "docs" / "contributing.md").read_text()
    shown = doc.split("<!-- the topic entry of tests/unit/shared/test_topic_registry.py -->")[1]
    diff = shown.split("```diff\n", 1)[1].split("```", 1)[0]
    added = [line.strip().removeprefix("+").strip() for line in diff.splitlines()]
    entry = [line.strip() for line in inspect.getsource(WithFlights).splitlines()[1:]]  # no class line
    assert [line for line in added if line] == [line for line in entry if line]


def test_an_added_topic_is_created_with_its_partitions_and_retention() -> None:
    topics = WithFlights(partitions=12, retention_ms=3_600_000)
    specs = {s.name: s for s in project_topics(topics)}
    assert set(specs) == {*(s.name for s in project_topics(TopicSettings())), "gpu-flights"}
    flights = specs["gpu-flights"]
    assert (flights.partitions, flights.replication_factor) == (2, 1)  # its entry's own partitions
    assert flights.config == {"retention.ms": "3600000", "cleanup.policy": "delete"}
    assert specs["gpu-metrics-raw"].partitions == 12


def test_an_added_topic_has_its_schema_written_and_a_gone_one_is_removed(tmp_path: Path) -> None:
    schemas = json_schemas(WithFlights)
    assert set(schemas) == {*json_schemas(), "gpu-flight.v1.schema.json"}
    assert schemas["gpu-flight.v1.schema.json"] == GpuFlight.model_json_schema()
    (tmp_path / "gpu-gone.v1.schema.json").write_text("{}\n")
    changed = write_json_schemas(schemas, tmp_path)
    assert "wrote gpu-flight.v1.schema.json" in changed
    assert "removed gpu-gone.v1.schema.json" in changed
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(schemas)
    written = json.loads((tmp_path / "gpu-flight.v1.schema.json").read_text())
    assert written == GpuFlight.model_json_schema()
    assert write_json_schemas(schemas, tmp_path) == []  # a second run changes nothing


def test_an_added_topic_is_configurable_like_every_other(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(FlightSettings).topics.flights == "gpu-flights"
    monkeypatch.setenv("GPUHEALTH_TOPICS__FLIGHTS", "flights-eu")
    loaded = load_settings(FlightSettings)
    assert loaded.topics.flights == "flights-eu"
    assert loaded.topics.metrics_raw == "gpu-metrics-raw"
    last = WithFlights.registry()[-1]
    assert (last.setting, last.default, last.carries) == (
        "flights", "gpu-flights", "Where each GPU flew, one message per hop."
    )  # fmt: skip
    assert "flights-eu" in {s.name for s in project_topics(loaded.topics)}


def test_every_topic_has_a_model_and_a_committed_schema_that_is_not_stale() -> None:
    named = sorted(m.schema for r in TopicSettings.registry() for m in r.topic.messages)
    committed = sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json"))
    generated = json_schemas()
    hint = "run `python -m shared.contract.topic_registry` and commit schema/json/"
    assert named == committed == sorted(generated), f"a schema no topic has, or a topic without one: {hint}"
    for name in committed:
        assert (SCHEMA_DIR / name).read_text() == schema_text(generated[name]), f"{name} is stale: {hint}"


def test_every_entry_is_whole_and_its_key_is_a_field_of_each_message() -> None:
    registered = TopicSettings.registry()
    assert len({r.default for r in registered}) == len(registered), "two topics of one name"
    for r in registered:
        assert r.carries.endswith("."), r.setting
        assert all(m.schema.endswith(".v1.schema.json") for m in r.topic.messages), r.setting
        for m in r.topic.messages:
            missing = set(r.topic.key.fields) - set(m.model.model_fields)
            assert not missing, f"{r.setting}: {m.model.__name__} has no {missing}"
        assert r.topic.key.fields or r.topic.key is ORIGINAL_KEY, r.setting
    loops = {r.topic.stored_by for r in registered} - {None}
    assert loops == set(get_args(SinkLoopName)), "a sink loop that stores nothing"


def test_the_dead_letters_topic_is_named_for_what_it_carries() -> None:
    topics = TopicSettings()
    assert topics.dead_letters == "gpu-dead-letters"
    assert "dlq" not in {r.setting for r in TopicSettings.registry()}


def test_the_old_dead_letters_setting_still_works_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("GPUHEALTH_TOPICS__DLQ", "gpu-metrics-dlq")
    with caplog.at_level(logging.WARNING, logger="shared.contract.topic_registry"):
        assert load_settings(Settings).topics.dead_letters == "gpu-metrics-dlq"
    assert "GPUHEALTH_TOPICS__DEAD_LETTERS" in caplog.text
    monkeypatch.setenv("GPUHEALTH_TOPICS__DEAD_LETTERS", "gpu-dead-letters")
    with pytest.raises(ConfigError, match="GPUHEALTH_TOPICS__DLQ"):
        load_settings(Settings)


def test_an_entry_without_a_line_on_what_it_carries_is_refused() -> None:
    class Unsaid(TopicSettings):
        quiet: Annotated[
            TopicName,
            Topic(
                Message(GpuFlight, "gpu-quiet.v1.schema.json"),
                key=GPU_KEY,
                keep=Keep.RAW,
                writers=("scorer",),
            ),
        ] = "gpu-quiet"

    with pytest.raises(TypeError, match="quiet"):
        Unsaid.registry()
    with pytest.raises(TypeError, match="at least one"):
        Topic(key=GPU_KEY, keep=Keep.RAW, writers=("scorer",))
    with pytest.raises(TypeError, match="at least one writer"):
        Topic(Message(GpuFlight, "gpu-quiet.v1.schema.json"), key=GPU_KEY, keep=Keep.RAW, writers=())
    with pytest.raises(TypeError, match="the sink reads"):
        Topic(
            Message(GpuFlight, "gpu-quiet.v1.schema.json"),
            key=GPU_KEY,
            keep=Keep.RAW,
            writers=("scorer",),
            stored_by="metrics",
        )


def test_only_the_scorer_writes_verdicts_and_alerts_and_the_remediator_only_its_records() -> None:
    entries = {r.setting: r.topic for r in TopicSettings.registry()}
    assert entries["health"].writers == entries["alerts"].writers == ("scorer",)
    assert entries["remediations"].writers == ("remediator",)
    written = {who for t in entries.values() for who in t.writers}
    assert {s for s, t in entries.items() if "collector" in t.writers} == {
        "metrics_raw",
        "events",
        "processes",
        "systems",
    }
    assert [s for s, t in entries.items() if "remediator" in t.writers] == ["remediations"]
    assert {s for s, t in entries.items() if "remediator" in t.readers} == {"health", "alerts"}
    assert written <= set(PRINCIPALS)


def test_the_acls_are_the_registry_s_grants() -> None:
    topics = WithFlights()
    acls = {
        (a.name, a.principal, str(a.operation))
        for a in project_acls(topics)
        if a.restype == ResourceType.TOPIC
    }
    assert ("gpu-flights", "User:collector", str(AclOperation.WRITE)) in acls
    assert ("gpu-flights", "User:scorer", str(AclOperation.READ)) in acls
    assert ("gpu-health", "User:scorer", str(AclOperation.WRITE)) in acls
    assert not {a for a in acls if a[0] == "gpu-health" and a[2] == str(AclOperation.WRITE)} - {
        ("gpu-health", "User:scorer", str(AclOperation.WRITE))
    }
    groups = {(a.name, a.principal) for a in project_acls(topics) if a.restype == ResourceType.GROUP}
    assert groups == {
        (prefix, f"User:{who}") for who, prefixes in CONSUMER_GROUPS.items() for prefix in prefixes
    }


KAFKA_ALPHABET = "abcxyzABCXYZ0189._-"


@settings(max_examples=200, deadline=None)
@given(
    setting=st.sampled_from([r.setting for r in TopicSettings.registry()]),
    name=st.text(min_size=0, max_size=300),
)
def test_a_topic_name_the_broker_would_refuse_is_refused_at_start(setting: str, name: str) -> None:
    legal = 1 <= len(name) <= 249 and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    if legal:
        assert getattr(TopicSettings.model_validate({setting: name}), setting) == name
    else:
        with pytest.raises(ValueError, match=setting):
            TopicSettings.model_validate({setting: name})


@settings(max_examples=100, deadline=None)
@given(name=st.text(alphabet=KAFKA_ALPHABET, min_size=1, max_size=249))
def test_every_legal_name_is_kept_as_given(name: str) -> None:
    assert TopicSettings(metrics_raw=name).metrics_raw == name
