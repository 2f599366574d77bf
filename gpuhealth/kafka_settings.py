"""How to reach the Kafka brokers: the settings and librdkafka properties every client starts from.

The services' settings tree (shared.settings.common) and the training library's
publisher read the same GPUHEALTH_KAFKA__* variables into this model. Nothing
here needs confluent-kafka.
"""

from __future__ import annotations

import zlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class KafkaSettings(BaseModel):
    """How to reach the brokers."""

    # each field's docstring is its description in the configuration reference
    # (as shared.settings.common.Section)
    model_config = ConfigDict(use_attribute_docstrings=True)

    bootstrap_servers: str = "127.0.0.1:9092"
    """Brokers, `host:port` separated by commas."""
    client_id: str = "gpu-health"
    """librdkafka's `client.id`; some clients add their own suffix (`-collector`, `-llm`…)."""
    security_protocol: str = "PLAINTEXT"
    """librdkafka's `security.protocol`: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`."""
    sasl_mechanism: str | None = None
    """SASL mechanism (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`…); unset: no SASL."""
    sasl_username: str | None = None
    """SASL user name."""
    sasl_password: SecretStr | None = None
    """SASL password."""
    ssl_ca_location: str | None = None
    """The CA certificate(s) (PEM file) the brokers' certificates are checked against; unset: the system's.
    `make up` and compose: the local stack's CA (`$GPUHEALTH_RUN/tls/ca.pem`)."""
    ssl_certificate_location: str | None = None
    """This client's certificate (PEM file), when the brokers take mTLS principals: its `CN` is the
    Kafka principal (`make up`: one per service, `$GPUHEALTH_RUN/tls/<service>.pem`)."""
    ssl_key_location: str | None = None
    """The private key (PEM file) of `ssl_certificate_location`."""
    ssl_key_password: SecretStr | None = None
    """The password of `ssl_key_location`, if the key is encrypted."""
    extra: dict[str, str] = Field(default_factory=dict)
    """Further librdkafka properties, e.g. `{"ssl.endpoint.identification.algorithm": "none"}` (secrets
    among them, such as `sasl.password`, are masked in logs)."""


PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": "lz4",
    "linger.ms": 20,
    "batch.size": 1_000_000,
    # Keep retrying a message for 10 minutes before reporting it lost, so a
    # broker restart or a short outage costs latency, not data.
    "message.timeout.ms": 600_000,
    # Stated, not left to the default: key_partition() computes where a keyed record goes.
    "partitioner": "consistent_random",
}

# Messages bigger than this are refused by the broker's default message.max.bytes.
MAX_MESSAGE_BYTES = 1_000_000


def key_partition(key: str | bytes, partitions: int) -> int:
    """The partition the producers' partitioner (consistent_random, librdkafka's default: CRC-32 of the
    key, modulo the topic's partitions) puts a record with this non-empty key in. The scorers share the
    fleet by it (services/scorer/ownership.py); a test against the broker checks the two agree."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    raw = key.encode() if isinstance(key, str) else key
    if not raw:
        raise ValueError("an empty key is placed at random: it has no partition")
    return zlib.crc32(raw) % partitions


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection properties shared by producers, consumers and admin clients."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        config["sasl.mechanism"] = settings.sasl_mechanism
    if settings.sasl_username:
        config["sasl.username"] = settings.sasl_username
    if settings.sasl_password:
        config["sasl.password"] = settings.sasl_password.get_secret_value()
    for key, value in (
        ("ssl.ca.location", settings.ssl_ca_location),
        ("ssl.certificate.location", settings.ssl_certificate_location),
        ("ssl.key.location", settings.ssl_key_location),
    ):
        if value:
            config[key] = value
    if settings.ssl_key_password:
        config["ssl.key.password"] = settings.ssl_key_password.get_secret_value()
    config.update(settings.extra)
    return config
