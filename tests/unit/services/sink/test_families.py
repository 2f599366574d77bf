"""Each of the sink's loops reads the topics the registry gives it, and knows how to decode each one."""

from __future__ import annotations

import confluent_kafka
import pytest

from services.sink.decode import decode_lanes
from services.sink.verifications import VerificationRecords
from services.sink.workload_rows import WorkloadRecords
from shared.contract.topic_registry import SinkLoopName, TopicSettings

# Names of their own, so a loop that reads a topic by its default name rather than its setting shows.
TOPICS = TopicSettings.model_validate({r.setting: f"own-{r.default}" for r in TopicSettings.registry()})


def stored_by(loop: SinkLoopName) -> list[str]:
    return [f"own-{r.default}" for r in TopicSettings.registry() if r.topic.stored_by == loop]


def refusals(loop: SinkLoopName, topic: str) -> set[str]:
    """The categories a loop refuses a contract-breaking record of `topic` with."""
    message = confluent_kafka.Message(topic=topic, partition=0, offset=0, key=None, value=b"{}")
    if loop == "metrics":
        return {d.category for lane in decode_lanes([message], TOPICS, 1_000_000).values() for d in lane.dead}
    family = VerificationRecords() if loop == "verification" else WorkloadRecords()
    return {d.category for d in family.batch_of([message], TOPICS, 1_000_000).dead}


def test_the_records_loops_subscribe_to_what_the_registry_gives_them() -> None:
    assert (
        VerificationRecords().topics(TOPICS)
        == stored_by("verification")
        == ["own-gpu-verifications", "own-gpu-systems"]
    )
    assert (
        WorkloadRecords().topics(TOPICS) == stored_by("workload") == ["own-gpu-processes", "own-llm-sessions"]
    )
    assert TOPICS.stored_by("metrics") == ["own-gpu-metrics-raw", "own-gpu-events"]


@pytest.mark.parametrize("loop", ["metrics", "verification", "workload"])
def test_every_topic_a_loop_is_given_is_one_it_decodes(loop: SinkLoopName) -> None:
    for topic in stored_by(loop):
        assert refusals(loop, topic) == {"contract"}, topic  # read against its contract, not "not mine"
    assert refusals(loop, "own-gpu-alerts") == {"topic"}  # a topic no sink loop stores
