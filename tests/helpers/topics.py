"""Topics of a test's own: every topic a service reads or writes, so none is a real deployment's.

A service started by a test with only some topics named would use the default names for the rest,
and read (or write) whatever a `make up` pipeline on the same broker put there.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.settings.common import TopicSettings


def topic_fields() -> list[str]:
    """The settings fields that name a topic (the topic registry's)."""
    return [entry.setting for entry in TopicSettings.registry()]


def isolated_topics(topic_factory: Callable[..., str], **partitions: int) -> TopicSettings:
    """Fresh uuid-named topics for every topic field (the factory's partitions unless `partitions` says)."""
    unknown = set(partitions) - set(topic_fields())
    assert not unknown, f"no such topic field: {sorted(unknown)}"
    names = {}
    for field in topic_fields():
        sized = {"partitions": partitions[field]} if field in partitions else {}
        names[field] = topic_factory(prefix=field.replace("_", "-"), **sized)
    return TopicSettings(**names)


def topics_env(topics: TopicSettings) -> dict[str, str]:
    """The GPUHEALTH_TOPICS__* variables naming every topic of `topics`."""
    return {f"GPUHEALTH_TOPICS__{field.upper()}": getattr(topics, field) for field in topic_fields()}
