"""Hostile gpu-verifications and gpu-systems records through the real broker into the real database.

The sink's records loop (services/sink/verifications.py) is held to issue #13's
bar like the main loop: whatever a record holds (arbitrary bytes, arbitrary
JSON, deep nesting, NUL and lone surrogates, wrong keys, oversized values,
records the contract accepts and the database refuses through a CHECK this
test adds), the loop stays up, stores every valid record exactly once and
dead-letters every other exactly once (recorded in sink_dead_letters with its
batch and delivered by the relay), also when it is stopped while retrying.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from services.sink.verifications import VerificationLoop
from shared.contract.chain import GENESIS
from shared.contract.models_verify import SystemIdentity, parse_system, parse_verification, record_json
from shared.fakes.samples import T0
from shared.gpu.gpu_identity import NvmlReader
from shared.plumbing.errors import ContractError
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.hostile import (
    ANY_JSON,
    ANY_TEXT,
    NUMBERS,
    HostileRun,
    Produced,
    any_value,
    deep,
    example_lands,
    hostile_examples,
    hostile_run,
    ledger_balanced,
    loop_running,
    records_loop,
    refuse_in,
    stopped_while_retrying_then_restarted,
    stored_suffixes,
)
from tests.helpers.topics import isolated_topics
from tests.helpers.verifier_fakes import FakeNvml

MAX_BYTES = 8192
REFUSE = "refuse-me"  # a name (verifications) / collector_id (systems) the contract takes and a CHECK refuses
UNSTORABLE = st.sampled_from(["\x00", "\ud800", "\udfff", "a\x00b", "\x07", "\u2028"])
VERIFICATION_TEXT = ["name", "hostname", "verifier_id", "device", "backend", "reason", "gpu_model", "dtype"]
VERIFICATION_NUMBERS = [
    "seq",
    "device_ms",
    "cpu_ms",
    "speedup",
    "max_rel_err",
    "rtol",
    "repeats",
    "gpu_index",
]
SYSTEM_TEXT = ["driver_version", "collector_id", "nvml_version", "cuda_driver_version"]
_IDENTITY = record_json(NvmlReader(FakeNvml()).identity("base", "c1"))


@dataclass
class Draft:
    """A record to produce; 'verification' and 'system' drafts get a unique GPU/host when produced."""

    shape: str  # verification | system | raw
    changes: dict[str, Any] = field(default_factory=dict)
    raw: bytes | None = None
    to: str = "verifications"  # for raw drafts: verifications | systems
    key: str = "own"  # own | other | none


valid = st.builds(Draft, shape=st.sampled_from(["verification", "system"]))
verifications = st.builds(
    Draft, shape=st.just("verification"),
    changes=st.dictionaries(st.sampled_from(VERIFICATION_NUMBERS), NUMBERS, max_size=2)
    | st.tuples(st.sampled_from(VERIFICATION_TEXT), ANY_TEXT, UNSTORABLE).map(lambda t: {t[0]: t[1] + t[2]})
    | st.dictionaries(ANY_TEXT, ANY_JSON, max_size=2)
    | st.fixed_dictionaries({"result": ANY_JSON}),
)  # fmt: skip
systems = st.builds(
    Draft, shape=st.just("system"),
    changes=st.tuples(st.sampled_from(SYSTEM_TEXT), ANY_TEXT, UNSTORABLE).map(lambda t: {t[0]: t[1] + t[2]})
    | st.fixed_dictionaries({"gpus": ANY_JSON}) | st.fixed_dictionaries({"identity_sha256": ANY_TEXT}),
)  # fmt: skip
refused_by_db = st.builds(
    Draft, shape=st.sampled_from(["verification", "system"]), changes=st.just({"?": REFUSE})
)
anything = st.builds(
    Draft, shape=st.just("raw"), to=st.sampled_from(["verifications", "systems"]),
    key=st.sampled_from(["other", "none"]), raw=any_value(MAX_BYTES, deepest=5000),
)  # fmt: skip
wrong_key = st.builds(
    Draft, shape=st.sampled_from(["verification", "system"]), key=st.sampled_from(["other", "none"])
)
oversized = st.builds(Draft, shape=st.just("verification"), changes=st.just({"reason": "x" * MAX_BYTES}))
RECORDS = st.lists(
    st.one_of(valid, valid, verifications, systems, refused_by_db, anything, wrong_key, oversized),
    min_size=1,
    max_size=16,
)


class Run(HostileRun):
    """A hostile run over the records loop's topics; a stored row is named by its GPU UUID's or
    hostname's unique suffix."""

    def message(self, draft: Draft, i: int) -> Produced:
        gpu, host = f"GPU-{uuid.uuid4().hex[:8]}-0000-4000-8000-{i:012x}", f"host-{i:012x}"
        topic = self.topics.verifications if draft.to == "verifications" else self.topics.systems
        changes = dict(draft.changes)
        refuse = changes.pop("?", None) == REFUSE
        value: bytes | None
        if draft.shape == "verification":
            topic, own = self.topics.verifications, gpu
            record = {
                "schema_version": 1, "kind": "compute_check", "time": (T0 + timedelta(seconds=i)).isoformat(),
                "gpu_uuid": gpu, "seq": 0, "prev_sha256": GENESIS, "hostname": "node-1",
                "verifier_id": "node-1", "name": REFUSE if refuse else "matmul", "device": "cuda:0",
                "outcome": "pass", **changes,
            }  # fmt: skip
            value = _dumps(record)
        elif draft.shape == "system":
            topic, own = self.topics.systems, host
            record = {**_IDENTITY, "hostname": host, "collector_id": REFUSE if refuse else "c1"}
            record["time"] = (T0 + timedelta(seconds=i)).isoformat()
            record["identity_sha256"] = SystemIdentity.identity_digest(record)
            record.update(changes)  # after the hash: a forged identity is refused
            value = _dumps(record)
        else:
            own, value = host, draft.raw
        key = {"own": own.encode(), "other": b"someone-else", "none": None}[draft.key]
        accepted = _accepted(topic == self.topics.verifications, value, key, own)
        return Produced(topic, key, value, f"{i:012x}", accepted)


def _dumps(message: dict[str, Any]) -> bytes:
    return json.dumps(message, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _accepted(is_verification: bool, raw: bytes | None, key: bytes | None, own: str) -> bool:
    """The contract's verdict (and the test's CHECK): the record must be stored."""
    if raw is None or len(raw) > MAX_BYTES or key != own.encode():
        return False
    try:
        if is_verification:
            return parse_verification(raw).name != REFUSE
        return parse_system(raw).collector_id != REFUSE
    except ContractError:
        return False


# A stored row is named by its GPU UUID's or hostname's suffix.
stored_names = stored_suffixes({"gpu_verifications": "gpu_uuid", "gpu_systems": "hostname"})


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return isolated_topics(topic_factory, verifications=2, systems=2, dead_letters=2)


# What the contract accepts and the hostile run's database refuses, a CHECK on each table the loop writes.
REFUSED = {
    "gpu_verifications": f"name <> '{REFUSE}'",
    "gpu_systems": f"record->>'collector_id' IS DISTINCT FROM '{REFUSE}'",
}
verification_loop = partial(records_loop, VerificationLoop, max_message_bytes=MAX_BYTES)


def test_hostile_records_never_stop_the_records_loop_and_each_ends_up_in_exactly_one_place(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    refusing = refuse_in(migrated, REFUSED)
    run = hostile_run(Run, kafka_settings, refusing, topics)
    loop = verification_loop(kafka_settings, refusing, topics, run.group)

    @hostile_examples(25)
    @given(drafts=RECORDS)
    @example(drafts=[Draft("verification", {"?": REFUSE}), Draft("verification"), Draft("system")])
    @example(drafts=[Draft("system", {"?": REFUSE}), Draft("system"), Draft("verification")])
    @example(drafts=[Draft("raw", raw=f'{{"schema_version": 1, "x": {deep(3000)}}}'.encode(), to=t) for t in
                     ("verifications", "systems")] + [Draft("verification")])  # fmt: skip
    @example(drafts=[Draft("verification", {"name": "a\x00"}), Draft("system", {"driver_version": "\ud800"})])
    def one_example(drafts: list[Draft]) -> None:
        example_lands(
            run, drafts, alive=lambda: not stop.is_set(), stored=lambda n: stored_names(refusing, n)
        )

    with contextlib.closing(run.dlq), loop_running(loop) as stop:
        one_example()
    ledger_balanced(run, loop)
    print(f"\nrecords hostile run: tried={run.n} stored={run.stored} dead-lettered={len(run.dead)} crashes=0")


def test_stopped_while_retrying_then_restarted_each_record_is_stored_or_dead_lettered_once(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    """SIGTERM while a batch is retried, then a restart: each valid record stored once, the bad one
    dead-lettered once (tests/helpers/hostile.py says how)."""
    drafts = [Draft("verification"), Draft("raw", raw=b"{garbage"), Draft("system")]
    stopped_while_retrying_then_restarted(
        Run, drafts, kafka=kafka_settings, db=migrated, topics=topics, table="gpu_systems",
        loop=verification_loop, stored=stored_names,
    )  # fmt: skip
