"""A training job's alerts reach the real Kafka's gpu-alerts topic, keyed by GPU, as valid messages."""

from __future__ import annotations

from collections.abc import Callable

from gpuhealth.contract.training import TrainingJob, parse_training_alert
from gpuhealth.training import AlertPublisher, Andon, AndonChecker, GpuMonitor
from shared.fakes.scripted_nvml import ScriptedNvml
from shared.settings.common import KafkaSettings
from tests.helpers.kafka import consume_all

H100 = "GPU-11111111-2222-3333-4444-555555555555"


def test_alerts_opened_and_resolved_are_published(
    kafka_settings: KafkaSettings, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(prefix="training-alerts")
    job = TrainingJob(id="job-42", name="tiny", hostname="node-1", pid=1234, rank=0)
    publisher = AlertPublisher.connect(
        bootstrap_servers=kafka_settings.bootstrap_servers, topic=topic, job=job
    )
    nvml = ScriptedNvml()
    nvml.temp_c = [92, 50]
    clock = [0.0]
    andon = Andon(monitor=GpuMonitor(nvml=nvml, devices=[0, 1]), checker=AndonChecker(), every_s=1,
                  publisher=publisher, clock=lambda: clock[0])  # fmt: skip
    andon.check_now()
    nvml.temp_c = [60, 50]
    clock[0] = 1.0
    andon.check_now()
    andon.close()  # flushes
    messages = consume_all(kafka_settings, topic, expected=2)
    assert [m.key() for m in messages] == [H100.encode(), H100.encode()]
    opened, resolved = (parse_training_alert(m.value() or b"") for m in messages)
    assert (opened.source, opened.kind, opened.state, opened.severity) == (
        "training",
        "thermal",
        "open",
        "critical",
    )
    assert (opened.value, opened.threshold, opened.gpu_index) == (92.0, 82.0, 0)
    assert opened.job == job
    assert (resolved.kind, resolved.state) == ("thermal", "resolved")
