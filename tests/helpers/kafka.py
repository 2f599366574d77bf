"""Reading topics back in integration tests, and the local stack's Kafka identities."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import confluent_kafka

from shared.plumbing.kafka import make_consumer
from shared.settings.common import KafkaSettings


def header_map(msg: confluent_kafka.Message) -> dict[str, str]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return {str(k): v.decode() if isinstance(v, bytes) else str(v) for k, v in items}


def consume_all(
    settings: KafkaSettings, topic: str, expected: int, timeout_s: float = 30.0, *, linger_s: float = 0.0
) -> list[confluent_kafka.Message]:
    """Read `topic` from the start until `expected` messages arrived or the deadline passed.

    `linger_s`: once `expected` arrived, go on reading that long, so that a test can see
    messages that should not be there (a duplicate) without betting on the join's speed.
    """
    consumer = make_consumer(settings, group_id=f"test-{uuid.uuid4().hex[:8]}")
    consumer.subscribe([topic])
    messages: list[confluent_kafka.Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=1.0):
                assert msg.error() is None, msg.error()
                messages.append(msg)
        linger_until = time.monotonic() + linger_s
        while linger_s and time.monotonic() < linger_until:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                assert msg.error() is None, msg.error()
                messages.append(msg)
    finally:
        consumer.close()
    return messages


def local_tls_dir() -> Path:
    """Where `make services` keeps the broker's CA and each principal's certificate (scripts/env.sh)."""
    if os.environ.get("GPUHEALTH_TLS"):
        return Path(os.environ["GPUHEALTH_TLS"])
    cache = Path(os.environ.get("GPUHEALTH_CACHE") or Path.home() / ".cache" / "gpu-health")
    return Path(os.environ.get("GPUHEALTH_RUN") or cache / "run") / "tls"


def local_stack_env() -> dict[str, str]:
    """The admin's client settings for the local broker (GPUHEALTH_KAFKA__*), and the local database's TLS
    (GPUHEALTH_DB__SSL*), when `make services` made them (none else: plain connections, as before)."""
    tls = local_tls_dir()
    env: dict[str, str] = {}
    if (tls / "admin.key").is_file():
        env |= {
            "GPUHEALTH_KAFKA__SECURITY_PROTOCOL": "SSL",
            "GPUHEALTH_KAFKA__SSL_CA_LOCATION": str(tls / "ca.pem"),
            "GPUHEALTH_KAFKA__SSL_CERTIFICATE_LOCATION": str(tls / "admin.pem"),
            "GPUHEALTH_KAFKA__SSL_KEY_LOCATION": str(tls / "admin.key"),
        }
    if (tls / "postgres.pem").is_file():  # the local PostgreSQL serves TLS with it: verified, name and all
        env |= {"GPUHEALTH_DB__SSLMODE": "verify-full", "GPUHEALTH_DB__SSLROOTCERT": str(tls / "ca.pem")}
    return env


def as_principal(settings: KafkaSettings, principal: str | None) -> KafkaSettings:
    """`settings` with the local stack's certificate of `principal` (None: no certificate at all)."""
    tls = local_tls_dir()
    assert (tls / "ca.pem").is_file(), f"no {tls}/ca.pem: the broker has no identities; run `make services`"
    cert, key = (str(tls / f"{principal}.pem"), str(tls / f"{principal}.key")) if principal else (None, None)
    return settings.model_copy(
        update={
            "security_protocol": "SSL",
            "ssl_ca_location": str(tls / "ca.pem"),
            "ssl_certificate_location": cert,
            "ssl_key_location": key,
            "client_id": f"test-{principal or 'anonymous'}",
        }
    )


def kafka_env(settings: KafkaSettings) -> dict[str, str]:
    """`settings` as the GPUHEALTH_KAFKA__* variables of a service a test starts in a clean environment:
    the brokers, and the TLS identity the local broker asks for (the admin's, as the tests')."""
    env = {"GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "GPUHEALTH_KAFKA__SECURITY_PROTOCOL": settings.security_protocol}  # fmt: skip
    for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
        if value := getattr(settings, name):
            env[f"GPUHEALTH_KAFKA__{name.upper()}"] = value
    return env
