"""The sink's decoding of gpu-verifications / gpu-systems records, and the collector's identity announcer."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from services.collector.systems import SystemAnnouncer
from services.sink.verifications import decode_records
from services.verifier.chainlog import MemoryChain
from shared.contract.chain import link_of
from shared.contract.models_verify import Outcome, RecordKind, SystemIdentity, record_bytes, record_json
from shared.gpu.gpu_identity import NvmlReader
from shared.plumbing.errors import GpuHealthError
from shared.settings.common import TopicSettings
from tests.helpers.verifier_fakes import UUIDS, FakeNvml

TOPICS = TopicSettings()


@dataclass
class Msg:
    _topic: str
    _key: bytes | None
    _value: bytes | None
    _offset: int = 0
    _partition: int = 0

    def error(self) -> Any:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def verification_bytes() -> bytes:
    chain = MemoryChain()
    record = chain.append(
        {
            "kind": RecordKind.COMPUTE_CHECK,
            "gpu_uuid": UUIDS[0],
            "hostname": "n1",
            "verifier_id": "n1",
            "name": "matmul",
            "device": "cuda:0",
            "outcome": Outcome.PASS,
        }
    )
    return record_bytes(record)


def system_bytes(hostname: str = "node-1") -> bytes:
    return json.dumps(record_json(NvmlReader(FakeNvml()).identity(hostname))).encode()


def test_good_records_become_rows_with_their_link() -> None:
    value = verification_bytes()
    batch = decode_records(
        [
            Msg(TOPICS.verifications, UUIDS[0].encode(), value, 7),
            Msg(TOPICS.systems, b"node-1", system_bytes(), 3),
        ],
        TOPICS,
        1_000_000,
    )
    assert not batch.dead
    (row,) = batch.verifications
    assert row[1] == UUIDS[0]
    assert row[2] == 0
    assert row[13] == link_of(json.loads(value))
    assert row[-1] == 7
    (system,) = batch.systems
    assert system[1] == "node-1"
    assert system[4] == 2
    assert batch.next_offsets == {(TOPICS.verifications, 0): 8, (TOPICS.systems, 0): 4}


def test_bad_records_are_dead_lettered_with_a_reason_and_the_good_ones_kept() -> None:
    good = verification_bytes()
    forged_identity = json.loads(system_bytes())
    forged_identity["driver_version"] = "1.0"
    messages = [
        Msg(TOPICS.verifications, UUIDS[0].encode(), b"{not json", 0),
        Msg(TOPICS.verifications, UUIDS[1].encode(), good, 1),  # key is another GPU
        Msg(TOPICS.verifications, UUIDS[0].encode(), good.replace(b'"seq":0', b'"seq":-1'), 2),
        Msg(
            TOPICS.verifications,
            UUIDS[0].encode(),
            good.replace(b'"schema_version":1', b'"schema_version":2'),
            3,
        ),
        Msg(TOPICS.verifications, UUIDS[0].encode(), None, 4),
        Msg(TOPICS.verifications, UUIDS[0].encode(), b" " * 20_000, 5),
        Msg(TOPICS.systems, b"node-1", json.dumps(forged_identity).encode(), 6),
        Msg(TOPICS.systems, b"other-node", system_bytes(), 7),
        Msg(
            TOPICS.verifications, UUIDS[0].encode(), good.replace(b'"name":"matmul"', b'"name":"\\ud800"'), 9
        ),
        Msg(TOPICS.verifications, UUIDS[0].encode(), good, 8),
    ]
    batch = decode_records(messages, TOPICS, 10_000)
    reasons = {d.offset: (d.category, d.reason) for d in batch.dead}
    assert [r[0] for r in batch.verifications]
    assert batch.verifications[0][-1] == 8
    assert reasons[0][0] == "contract"
    assert "not JSON" in reasons[0][1]
    assert reasons[1] == ("key", "message key does not match gpu_uuid")
    assert reasons[2][0] == "contract"
    assert "seq" in reasons[2][1]
    assert "unknown schema_version 2" in reasons[3][1]
    assert reasons[4][0] == "empty"
    assert reasons[5][0] == "oversized"
    assert "identity_sha256 does not match" in reasons[6][1]
    assert reasons[7] == ("key", "message key does not match hostname")
    assert reasons[9][0] == "contract"  # a lone surrogate: not storable, not a crash
    headers = dict(batch.dead[0].headers())
    assert headers["dlq.source.topic"] == TOPICS.verifications.encode()
    assert headers["dlq.source.offset"] == b"0"


@given(st.binary(max_size=400), st.binary(max_size=40) | st.none())
def test_decode_never_raises_on_any_message(value: bytes, key: bytes | None) -> None:
    batch = decode_records(
        [Msg(TOPICS.verifications, key, value), Msg(TOPICS.systems, key, value, 1)], TOPICS, 1_000_000
    )
    assert len(batch.dead) + len(batch.verifications) + len(batch.systems) == 2


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def publish(self, topic: str, key: str, value: dict[str, Any]) -> bool:
        self.sent.append((topic, key, value))
        return True


def test_announcer_publishes_at_start_and_only_on_change() -> None:
    nvml = FakeNvml()
    publisher = FakePublisher()

    def read() -> SystemIdentity:
        return NvmlReader(nvml).identity("node-9", "c9")

    announcer = SystemAnnouncer(read=read, publisher=publisher, topic="gpu-systems", interval_s=60)  # type: ignore[arg-type]
    assert announcer.check()
    nvml.pcie_gen_current = 1  # the link idles down: not a change of identity
    assert not announcer.check()
    nvml.vbios = ["96.00.99.00.01", "96.00.99.00.01"]  # flashed
    assert announcer.check()
    assert [(t, k) for t, k, _ in publisher.sent] == [("gpu-systems", "node-9"), ("gpu-systems", "node-9")]
    assert publisher.sent[1][2]["gpus"][0]["vbios_version"] == "96.00.99.00.01"


def test_announcer_survives_a_failing_read() -> None:
    publisher = FakePublisher()

    def read() -> SystemIdentity:
        raise GpuHealthError("NVML went away")

    announcer = SystemAnnouncer(read=read, publisher=publisher, topic="gpu-systems", interval_s=60)  # type: ignore[arg-type]
    assert not announcer.check()
    assert publisher.sent == []


@given(depth=st.integers(17, 5000), topic=st.sampled_from([TOPICS.verifications, TOPICS.systems]))
def test_nesting_is_refused_before_parsing_at_any_depth(depth: int, topic: str) -> None:
    value = b'{"schema_version": 1, "gpus": ' + b"[" * depth + b"]" * depth + b"}"
    (dead,) = decode_records([Msg(topic, b"k", value)], TOPICS, 1_000_000).dead
    assert dead.category == "contract"
    assert "nested deeper than 16 levels" in dead.reason


def test_a_record_is_bounded_in_size_by_the_contract_itself() -> None:
    value = verification_bytes()[:-1] + b',"reason":"' + b"x" * 1_000_000 + b'"}'
    (dead,) = decode_records([Msg(TOPICS.verifications, UUIDS[0].encode(), value)], TOPICS, 10**8).dead
    assert "exceeds 1000000" in dead.reason


class BrokenConsumer:
    """A consumer whose client has failed for good (a fatal librdkafka error, say)."""

    def subscribe(self, topics: list[str], **_: Any) -> None:
        self.topics = topics

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        raise RuntimeError("fatal: the client is unusable")


class IdleProducer:
    def flush(self, timeout: float) -> int:
        return 0


def test_a_records_loop_that_fails_stops_the_whole_sink_and_says_so() -> None:
    from prometheus_client import CollectorRegistry

    from services.sink.metrics import SinkMetrics
    from services.sink.verifications import VerificationLoop
    from shared.settings.common import DatabaseSettings

    loop = VerificationLoop(
        consumer=BrokenConsumer(),  # type: ignore[arg-type]
        dlq_producer=IdleProducer(),  # type: ignore[arg-type]
        db=DatabaseSettings(), topics=TOPICS, group="g", metrics=SinkMetrics(CollectorRegistry()),
    )  # fmt: skip
    stop = threading.Event()
    loop.run(stop)  # returns: never raises out of its thread
    assert loop.failed
    assert stop.is_set()  # the service's stop: the whole sink stops and exits 1
