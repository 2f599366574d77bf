"""Produce throughput: the project's JsonProducer against raw confluent-kafka, same run.

Both use the project's producer settings (idempotent, acks=all, lz4, linger);
the baseline produces pre-encoded bytes, so the ratio is the cost of our JSON
encoding, validation and bookkeeping per message.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import best_of, report, scratch_topic
from shared.plumbing.kafka import JsonProducer, encode_json, make_producer, wait_for_kafka
from shared.settings.common import Settings

N = 50_000


def sample(i: int) -> dict[str, object]:
    return {
        "schema_version": 1,
        "gpu_uuid": f"GPU-{i % 1024:08d}",
        "time_ms": 1_700_000_000_000 + i,
        "gpu_temp_c": 55.5,
        "power_usage_w": 412.25,
        "gpu_util_pct": 97.0,
        "fb_used_mib": 61234,
        "ecc_sbe_volatile_total": 3,
        "xid_last": None,
        "hostname": "node-17",
        "rack": "r12",
    }


def main() -> int:
    settings = Settings()
    wait_for_kafka(settings.kafka)
    samples = [sample(i) for i in range(N)]
    encoded = [(str(s["gpu_uuid"]).encode(), encode_json(s)) for s in samples]
    with scratch_topic(settings.kafka) as topic:

        def project() -> None:
            producer = JsonProducer(make_producer(settings.kafka))
            for s in samples:
                producer.produce(topic, str(s["gpu_uuid"]), s)
            assert producer.flush(60) == 0

        def raw() -> None:
            producer = make_producer(settings.kafka)
            for key, value in encoded:
                producer.produce(topic, value=value, key=key)
                producer.poll(0)
            assert producer.flush(60) == 0

        raw()  # warm the connection and the topic's leaders
        t_raw = best_of(3, raw)
        t_project = best_of(3, project)
    report("JsonProducer msgs/s", N / t_project, "msg/s", "raw bytes producer", N / t_raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
