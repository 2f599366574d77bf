"""Every producer keys its messages as the topic registry says (issue 43).

Two checks. The producers, driven with generated messages through a recording producer, send each
message under the key its topic's entry gives it (`Topic.key_of`). And no `.produce(` (or a
publisher's three-argument `.publish(`) anywhere in the code is handed a key that did not come
from an entry's `encode`, except the few reviewed below.
"""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuhealth.contract.training import TrainingJob
from gpuhealth.errors import ContractError
from gpuhealth.gpu.readings import GpuReading, SourceReading
from gpuhealth.training.andon import Alert
from gpuhealth.training.publish import AlertPublisher
from services.llm_monitor.monitor import Monitor
from services.llm_monitor.settings import LlmSettings
from services.remediator.record import as_record, event
from services.scorer.messages import alert_resolved, publish
from shared.contract.models import GpuEvent, Source
from shared.contract.models_workload import GpuProcesses, LlmServerStatus
from shared.contract.topic_registry import (
    GPU_KEY,
    ORIGINAL_KEY,
    Key,
    KeyMismatchError,
    TopicField,
    TopicSettings,
)
from tests.helpers.collector import FakeProducer, FakeSource, make_collector

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
GPUS = st.from_regex(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", fullmatch=True)
NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,30}", fullmatch=True)
TOPICS = TopicSettings()
BY_NAME = {getattr(TOPICS, r.setting): r.topic for r in TopicSettings.registry()}


class Recording:
    """A producer that keeps what it was given (the JsonProducer's and confluent's calls alike)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | bytes | None, Any]] = []

    def produce(self, topic: str, key: Any = None, value: Any = None, **_: Any) -> None:
        self.sent.append((topic, key, value))

    def poll(self, timeout_s: float = 0.0) -> int:
        return 0

    def flush(self, timeout_s: float = 30.0) -> int:
        return 0


def assert_keyed_as_registered(producer: Recording | FakeProducer) -> None:
    """Each record's key is what its topic's entry makes of the message it carries."""
    sent = producer.sent if isinstance(producer, Recording) else producer.messages
    assert sent
    for topic, key, value in sent:
        entry = BY_NAME[topic]
        message = entry.decode(value if isinstance(value, bytes) else json.dumps(value))
        wanted = entry.key_of(message)
        assert key in (wanted, wanted.encode()), (topic, key, wanted)


@settings(max_examples=50, deadline=None)
@given(gpus=st.lists(GPUS, min_size=1, max_size=4), alert_id=st.integers(1, 2**62))
def test_the_scorer_keys_its_messages_as_the_registry_says(gpus: list[str], alert_id: int) -> None:
    messages = [alert_resolved(as_of=NOW, alert_id=alert_id, gpu_uuid=g, kind="xid") for g in gpus]
    producer = Recording()
    publish(producer, None, {"health": TOPICS.health, "alerts": TOPICS.alerts}, [m for m in messages if m])  # type: ignore[arg-type]
    assert_keyed_as_registered(producer)


@settings(max_examples=30, deadline=None)
@given(gpus=st.lists(GPUS, min_size=1, max_size=4, unique=True), lost=st.booleans())
def test_the_collector_keys_samples_and_events_as_the_registry_says(gpus: list[str], lost: bool) -> None:
    """Samples of generated GPUs, and the events of one of them vanishing between two polls."""
    later = NOW + timedelta(seconds=10)
    polls = [_reading(gpus, NOW), _reading(gpus[1:] if lost else gpus, later)]
    producer = FakeProducer()
    collector, _ = make_collector(FakeSource(list(polls)), producer)
    collector.poll_once()
    collector.poll_once()
    assert_keyed_as_registered(producer)


def _reading(gpus: list[str], at: datetime) -> SourceReading:
    readings = [
        GpuReading(uuid=u, index=i, model="NVIDIA H100 80GB HBM3", hostname="node-7", time=at, metrics={})
        for i, u in enumerate(gpus)
    ]
    return SourceReading(
        source=Source.MOCK, target=FakeSource.target, gpus=readings, read_at=at, latency_ms=1.0
    )


@settings(max_examples=50, deadline=None)
@given(gpu=GPUS, index=st.integers(0, 7), state=st.sampled_from(["open", "resolved"]))
def test_a_training_job_keys_its_alerts_as_the_registry_says(gpu: str, index: int, state: str) -> None:
    """gpuhealth imports no shared: its publisher keys by hand, and this holds it to the registry."""
    alert = Alert("thermal", "warning", index, gpu, 2.5, 2.0, "s", "slow steps", NOW)  # type: ignore[arg-type]
    producer = Recording()
    job = TrainingJob(id="job-1", hostname="node-1", pid=4242)
    AlertPublisher(producer, topic=TOPICS.alerts, job=job).publish(alert, state)
    assert_keyed_as_registered(producer)


@settings(max_examples=50, deadline=None)
@given(server=NAMES, up=st.booleans())
def test_the_llm_monitor_keys_by_server_as_the_registry_says(server: str, up: bool) -> None:
    producer = Recording()
    monitor = Monitor(LlmSettings(), producer, CollectorRegistry())  # type: ignore[arg-type]
    status = LlmServerStatus(time=NOW, monitor_id="m", server=server, engine="vllm", up=up)
    monitor.publish(status)
    assert_keyed_as_registered(producer)


@settings(max_examples=100, deadline=None)
@given(gpu=st.none() | GPUS, node=st.sampled_from(["", "gpu-node-01"]))
def test_a_remediation_is_keyed_by_its_gpu_else_its_node_else_the_fleet(gpu: str | None, node: str) -> None:
    """The registry's entry and the remediator's records agree (the entry said GPU alone before)."""
    record = as_record(event("breaker", at=NOW, status="tripped", dry_run=True, node=node, gpu_uuid=gpu))
    entry = TopicSettings.entry("remediations")
    assert entry.encode(record).key == (gpu or node or "fleet")
    assert entry.key_of(entry.decode(json.dumps(entry.encode(record).value))) == entry.encode(record).key


def test_an_entry_refuses_a_model_that_is_not_its_topics() -> None:
    status = LlmServerStatus(time=NOW, monitor_id="m", server="s", engine="vllm", up=True)
    with pytest.raises(TypeError, match="LlmServerStatus is not a message of this topic"):
        TopicSettings.entry("lifecycle").encode(status)
    with pytest.raises(TypeError, match="keep the key"):
        ORIGINAL_KEY.of(status)


def test_a_record_whose_key_is_not_its_messages_is_refused_by_the_one_check() -> None:
    status = LlmServerStatus(time=NOW, monitor_id="m", server="s", engine="vllm", up=True)
    entry = TopicSettings.entry("llm_sessions")
    entry.check_key(b"s", status)
    entry.check_key(None, status)  # no key: the topic does not require one
    with pytest.raises(KeyMismatchError, match="does not match server"):
        entry.check_key(b"t", status)
    required = TopicSettings.entry("verifications")
    assert required.key.required
    assert not required.key_matches(None, "GPU-1")
    assert Key(("a", "b"), fallback="f").of({"a": None, "b": ""}) == "f"
    assert GPU_KEY.field == "gpu_uuid"
    with pytest.raises(TypeError, match="not one field"):
        TopicSettings.entry("remediations").key.field  # noqa: B018


def test_topic_field_names_every_topic_of_the_table() -> None:
    from typing import get_args

    assert list(get_args(TopicField)) == [r.setting for r in TopicSettings.registry()]


# .produce( calls given a key made elsewhere, each reviewed: why it is not the registry's to make.
REVIEWED = {
    "gpuhealth/training/publish.py": "gpuhealth imports no shared: the training publisher's key is held "
    "to the registry by test_a_training_job_keys_its_alerts_as_the_registry_says",
    "services/sink/deadletters.py": "a dead letter keeps the key of the record it carries (ORIGINAL_KEY)",
    "services/collector/spool.py": "the spool re-sends records as they were keyed when first produced",
}
SOURCES = ("services", "shared", "gpuhealth")


def _made_by_an_entry(node: ast.expr, allowed: set[str]) -> bool:
    """A key expression that is an entry's encode, or a name bound from one (or handed in)."""
    match node:
        case ast.Starred(value=ast.Call(func=ast.Attribute(attr="encode"))):
            return True
        case ast.Name(id=name):
            return name in allowed
        case ast.Call(func=ast.Attribute(attr="encode", value=inner), args=[]):
            return _made_by_an_entry(inner, allowed)
        case ast.IfExp(body=body, orelse=orelse):
            return _made_by_an_entry(body, allowed) and _made_by_an_entry(orelse, allowed)
        case ast.Constant(value=None):
            return True
    return False


def _allowed_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The function's parameters (a key handed on) and the names it unpacks from an `.encode(...)`."""
    names = {a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute | ast.Name) and getattr(
                func, "attr", getattr(func, "id", "")
            ) in (
                "encode",
                "_wire",
            ):
                for target in node.targets:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _key_argument(call: ast.Call) -> ast.expr | None:
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            return arg
    keyword = next((k.value for k in call.keywords if k.arg == "key"), None)
    if keyword is not None:
        return keyword
    return call.args[1] if len(call.args) >= 2 else None


def hand_made_keys(path: Path, root: Path = REPO) -> list[str]:
    """Each `.produce(` / `.publish(topic, key, value)` in a file whose key no entry made."""
    tree = ast.parse(path.read_text())
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        allowed = _allowed_names(function)
        for call in ast.walk(function):
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
                continue
            if (
                call.func.attr == "publish"
                and len(call.args) + len(call.keywords) < 3
                and not any(isinstance(a, ast.Starred) for a in call.args)
            ):
                continue
            if call.func.attr in ("produce", "publish"):
                key = _key_argument(call)
                if key is not None and not _made_by_an_entry(key, allowed):
                    found.append(f"{path.relative_to(root)}:{call.lineno}: {ast.unparse(key)}")
    return found


def test_no_producer_hands_kafka_a_key_the_registry_did_not_make() -> None:
    found = [f for d in SOURCES for p in sorted((REPO / d).rglob("*.py")) for f in hand_made_keys(p)]
    unreviewed = [f for f in found if f.split(":")[0] not in REVIEWED]
    assert not unreviewed, f"keys chosen by hand (use TopicSettings.entry(...).encode(message)): {unreviewed}"
    assert {f.split(":")[0] for f in found} == set(REVIEWED), "a reviewed exception no longer needed"


def test_the_architecture_check_sees_a_hand_made_key(tmp_path: Path) -> None:
    source = tmp_path / "send.py"
    source.write_text(
        "def send(producer, entry, message):\n"
        "    producer.produce('t', message.gpu_uuid, {})\n"
        "    producer.produce('t', *entry.encode(message))\n"
        "    key, value = entry.encode(message)\n"
        "    producer.produce('t', value=value, key=key.encode())\n"
        "    publisher.publish('t', 'fleet', value)\n"
    )
    assert hand_made_keys(source, tmp_path) == ["send.py:2: message.gpu_uuid", "send.py:6: 'fleet'"]


def test_a_consumer_reads_a_topic_only_as_what_it_carries() -> None:
    """`entry.read(Model, raw)`: the record as the topic's model; another model is a TypeError at the call,
    and a record that is not the model is refused (ContractError), never returned as something else."""
    status = LlmServerStatus(time=NOW, monitor_id="m", server="s", engine="vllm", up=True)
    raw = json.dumps(status.model_dump(mode="json")).encode()
    events = TopicSettings.entry("events")
    with pytest.raises(TypeError, match="not LlmServerStatus"):
        events.read(LlmServerStatus, raw)
    with pytest.raises(ContractError):
        events.read(GpuEvent, raw)
    processes = TopicSettings.entry("processes")
    with pytest.raises(ContractError):
        processes.read(GpuProcesses, raw)
