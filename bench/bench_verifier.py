"""Audit speed: records checked per second by verify_chain, next to hashing the same bytes alone.

The baseline is the least any audit must do (SHA-256 over every record's
bytes); the ratio says what parsing, canonicalising and link checking cost on
top. Then the whole `audit` path through the broker: records read and checked
per second from a scratch topic.
"""

from __future__ import annotations

import hashlib
import sys

from bench._common import best_of, report, scratch_topic
from services.verifier.chainlog import MemoryChain, audit_topic
from shared.contract.chain import verify_chain
from shared.contract.models_verify import Outcome, RecordKind
from shared.plumbing.kafka import make_producer
from shared.settings.common import Settings

RECORDS = 20_000
GPUS = 64


def build() -> MemoryChain:
    chain = MemoryChain()
    for i in range(RECORDS):
        chain.append(
            {
                "kind": RecordKind.COMPUTE_CHECK,
                "gpu_uuid": f"GPU-{i % GPUS:08d}-0000-0000-0000-000000000000",
                "hostname": "bench-node",
                "verifier_id": "bench",
                "name": "matmul",
                "device": "cuda:0",
                "outcome": Outcome.PASS,
                "device_ms": 0.345,
                "cpu_ms": 15.1,
                "speedup": 43.8,
                "input_shape": [2000, 2000, 2000],
                "dtype": "float32",
                "rtol": 1e-4,
                "max_rel_err": 1.9e-6,
            }
        )
    return chain


def main() -> int:
    chain = build()
    entries = chain.entries()
    values = [e.value or b"" for e in entries]
    verified = best_of(3, lambda: verify_chain(entries))
    hashed = best_of(3, lambda: [hashlib.sha256(v).digest() for v in values])
    report("verify_chain records/s", RECORDS / verified, "rec/s", "sha256 alone", RECORDS / hashed)

    settings = Settings()
    with scratch_topic(settings.kafka) as topic:
        producer = make_producer(settings.kafka)
        for e in entries:
            producer.produce(topic, key=e.key, value=e.value)
        producer.flush(60)
        audited = best_of(2, lambda: audit_topic(settings.kafka, topic))
    report(
        "audit via broker records/s", RECORDS / audited, "rec/s", "verify_chain in memory", RECORDS / verified
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
