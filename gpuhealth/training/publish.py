"""Publishes a job's alerts to `gpu-alerts` (source: training), keyed by GPU UUID, with the job's identity.

Kafka settings come from the same GPUHEALTH_KAFKA__* / GPUHEALTH_TOPICS__ALERTS
variables the services read. confluent-kafka (the library's `kafka` extra) is
imported only when a publisher connects, so scripts that do not publish never need it.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from gpuhealth.contract.base import to_json
from gpuhealth.contract.training import TrainingAlert, TrainingJob
from gpuhealth.errors import ConfigError
from gpuhealth.kafka_settings import KafkaSettings

from .andon import Alert

# Where schedulers and launchers put a job's identity, first found wins.
JOB_ID_VARS = ("GPUHEALTH_JOB_ID", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "JOB_ID")
JOB_NAME_VARS = ("GPUHEALTH_JOB_NAME", "SLURM_JOB_NAME")


def job_from_env(
    env: dict[str, str] | os._Environ[str] = os.environ, *, job_id: str | None = None, name: str | None = None
) -> TrainingJob:
    """This process's job: given values, else the scheduler's variables, else host-pid."""
    hostname = socket.gethostname()
    pid = os.getpid()
    found_id = job_id or next((env[v] for v in JOB_ID_VARS if env.get(v)), None) or f"{hostname}-{pid}"
    found_name = name or next((env[v] for v in JOB_NAME_VARS if env.get(v)), None)
    if found_name is None and sys.argv and sys.argv[0]:
        found_name = Path(sys.argv[0]).name or None
    rank = env.get("RANK")
    return TrainingJob(
        id=found_id,
        name=found_name,
        hostname=hostname,
        pid=pid,
        rank=int(rank) if rank is not None and rank.isdigit() else None,
    )


def alert_message(alert: Alert, state: str, job: TrainingJob) -> TrainingAlert:
    """The gpu-alerts message for an alert that opened or resolved (validated by the contract)."""
    return TrainingAlert.model_validate(
        {
            "time": alert.time,
            "gpu_uuid": alert.gpu_uuid,
            "gpu_index": alert.gpu_index,
            "kind": alert.kind,
            "severity": alert.severity,
            "state": state,
            "summary": alert.summary,
            "value": alert.value,
            "threshold": alert.threshold,
            "unit": alert.unit,
            "job": job,
            "evidence": alert.evidence,
        },
        strict=False,
    )


# The services' default name for the topic (GPUHEALTH_TOPICS__ALERTS renames it for both).
ALERTS_TOPIC = "gpu-alerts"


class AlertsTopic(BaseModel):
    alerts: str = ALERTS_TOPIC


class PublisherSettings(BaseSettings):
    """The services' variables a publisher reads: GPUHEALTH_KAFKA__*, GPUHEALTH_TOPICS__ALERTS."""

    model_config = SettingsConfigDict(
        env_prefix="GPUHEALTH_", env_nested_delimiter="__", env_ignore_empty=True, extra="ignore"
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: AlertsTopic = Field(default_factory=AlertsTopic)


class Producer(Protocol):
    """What the publisher needs of gpuhealth.kafka.JsonProducer."""

    def produce(self, topic: str, key: str | None, value: Any) -> None: ...
    def flush(self, timeout_s: float = 30.0) -> int: ...


class AlertPublisher:
    def __init__(
        self, producer: Producer, *, topic: str = ALERTS_TOPIC, job: TrainingJob | None = None
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.job = job if job is not None else job_from_env()
        self.published = 0

    @classmethod
    def connect(
        cls, *, bootstrap_servers: str | None = None, topic: str | None = None, job: TrainingJob | None = None
    ) -> AlertPublisher:
        """A publisher with the project's producer settings (GPUHEALTH_* variables, or the given broker)."""
        from gpuhealth.kafka import JsonProducer, make_producer  # needs confluent-kafka

        try:
            settings = PublisherSettings()
        except (ValidationError, SettingsError) as e:
            raise ConfigError(f"invalid settings for the alert publisher: {e}") from e
        kafka = settings.kafka
        if bootstrap_servers is not None:
            kafka = kafka.model_copy(update={"bootstrap_servers": bootstrap_servers})
        producer = JsonProducer(make_producer(kafka, {"client.id": f"{kafka.client_id}-training"}))
        return cls(producer, topic=topic or settings.topics.alerts, job=job)

    def publish(self, alert: Alert, state: str) -> None:
        self.producer.produce(self.topic, alert.gpu_uuid, to_json(alert_message(alert, state, self.job)))
        self.published += 1

    def close(self) -> None:
        self.producer.flush(10.0)
