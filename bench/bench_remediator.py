"""Remediation latency: from an injected fault to the node's cordon in the API server, p50/p99, next to the
time the verdict itself took in the same run, at 1,000 and 10,000 GPUs (8 per node).

The whole path is the real one: a scratch schema holds the fleet (the scorer
bench's: inventory, latest samples, an hour of rollup); the API server
(`make services`) holds one Node per host. Each round writes a double-bit ECC
error into the newest rollup minute of GPUS_PER_ROUND GPUs on nodes not yet
touched (as the sink would), then runs one scoring cycle over the fleet, which
publishes the verdicts on gpu-health; the remediator (live, its Kubernetes
driver with the role the manifest grants) consumes them, decides, and cordons.
A watch on the API server notes when each node turns unschedulable.

- the verdict took: from the fault's write to the cycle's verdicts acknowledged by the broker;
- the cordon took: from the fault's write to the node's cordon seen by the watch.

The breaker is opened wide for the bench (every faulted node may be taken out);
its bound is shown by the integration tests.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from statistics import quantiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client import CollectorRegistry

from bench import fleets
from bench._common import report, scratch_topic
from services.remediator.drivers.kubeconfig import load_kubeconfig
from services.remediator.drivers.kubernetes import KubernetesDriver
from services.remediator.drivers.node_exec import NodeExec
from services.remediator.executor import Executor
from services.remediator.findings import NodeMap
from services.remediator.loop import RemediatorLoop
from services.remediator.policy import Breaker, NodesOut, load_policy
from services.remediator.steps import Steps
from services.remediator.trust import Trust
from services.scorer.loop import ScorerLoop
from services.scorer.rules_config import load_rules
from services.scorer.settings import ScorerSection
from shared.contract.signing import Keyring, Signer
from shared.plumbing.db import connect
from shared.plumbing.kafka import JsonProducer, make_consumer, make_producer
from shared.plumbing.migrate import migrated_schema
from shared.plumbing.running import running
from shared.settings.common import Settings

GPUS_PER_NODE, ROUNDS, GPUS_PER_ROUND = 8, 5, 10
NOW = datetime.now(UTC).replace(second=0, microsecond=0)
KUBE = Path(os.environ.get("GPUHEALTH_RUN", Path.home() / ".cache" / "gpu-health" / "run")) / "kube"


def gpu(g: int) -> str:
    """The scorer bench fleet's GPU number g (shared.store.fleet)."""
    return f"GPU-{g:08d}-0000-4000-8000-000000000000"


class Cordons:
    """Watches the API server's nodes (as its admin) and notes when each first turns unschedulable."""

    def __init__(self, client: httpx.Client, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.at: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        version = self.client.get("/api/v1/nodes", params={"limit": 1}).json()["metadata"]["resourceVersion"]
        params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": 600}
        with self.client.stream("GET", "/api/v1/nodes", params=params, timeout=None) as lines:
            for line in lines.iter_lines():
                seen = time.time()
                node = json.loads(line)["object"]
                name = node["metadata"]["name"]
                if name.startswith(self.prefix) and node["spec"].get("unschedulable") and name not in self.at:
                    self.at[name] = seen
                if self.stop.is_set():
                    return


def run(settings: Settings, gpus: int) -> tuple[list[float], list[float]]:
    """(verdict seconds, cordon seconds) of every faulted GPU, at a fleet of `gpus`."""
    admin_access = load_kubeconfig(KUBE / "admin.kubeconfig")
    admin = httpx.Client(base_url=admin_access.server, verify=admin_access.ssl_context,
                         headers=admin_access.headers, timeout=30)  # fmt: skip
    prefix, nodes = f"b{uuid.uuid4().hex[:6]}-", gpus // GPUS_PER_NODE
    names = {f"node-{i}": {"kubernetes": f"{prefix}{i}"} for i in range(nodes)}
    for kube_name in (n["kubernetes"] for n in names.values()):
        admin.post(
            "/api/v1/nodes",
            json={
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": kube_name, "labels": {"nvidia.com/gpu.present": "true"}},
            },
        )
    policy = load_policy()
    policy = policy.model_copy(update={
        "breaker": Breaker(max_nodes=nodes, max_fleet_percent=100, window_s=60),
        "nodes_out": NodesOut(max_nodes=nodes, max_fleet_percent=100),
        "actions": {a: p.model_copy(update={"max_per_window": None}) for a, p in policy.actions.items()},
    })  # fmt: skip
    verdicts: list[float] = []
    cordoned: list[float] = []
    try:
        with (
            migrated_schema(settings.db, "bench") as db, connect(db) as conn,
            scratch_topic(settings.kafka) as health, scratch_topic(settings.kafka) as alerts,
            scratch_topic(settings.kafka) as out,
        ):  # fmt: skip
            fleets.fill_scorer_bench_fleet(conn, as_of=NOW, gpus=gpus)
            topics = settings.topics.model_copy(
                update={"health": health, "alerts": alerts, "remediations": out}
            )
            producer = JsonProducer(make_producer(settings.kafka))
            key = Ed25519PrivateKey.generate()  # the scorer signs, the remediator verifies: as deployed
            scorer = ScorerLoop(cfg=ScorerSection(as_of=NOW.isoformat()), rules=load_rules(), db=db,
                                topics=topics, producer=producer, registry=CollectorRegistry(),
                                signer=Signer(key))  # fmt: skip
            scorer.score_once()  # the first cycle writes every GPU's first verdict
            driver = KubernetesDriver(load_kubeconfig(KUBE / "remediator.kubeconfig"), drain=policy.drain)
            node_map = NodeMap(hosts=names)
            steps = Steps(
                policy=policy, schedulers=[driver], node_exec=NodeExec({}), nodes=node_map, look_s=1.0
            )
            loop = RemediatorLoop(
                db=db, topics=topics, policy=policy, nodes=node_map, dry_run=False,
                consumer=make_consumer(settings.kafka, group_id=f"bench-{uuid.uuid4().hex[:8]}"),
                producer=JsonProducer(make_producer(settings.kafka)),
                executor=Executor(db=db, policy=policy, steps=steps, dry_run=False, retry_s=1.0),
                registry=CollectorRegistry(), poll_timeout_s=0.05, on_close=driver.close,
                trust=Trust(Keyring.of(key.public_key()), max_age_s=900, max_future_s=60),
            )  # fmt: skip
            watch = Cordons(admin, prefix)
            watch.thread.start()
            with running(loop, name="remediator"):
                time.sleep(8)  # the group's first assignment, and the first cycle's verdicts read
                for r in range(ROUNDS):
                    faulted = [(r * GPUS_PER_ROUND + i) * GPUS_PER_NODE for i in range(GPUS_PER_ROUND)]
                    fleets.inject_bench_dbe(conn, [gpu(g) for g in faulted])
                    injected = time.time()
                    scorer.score_once()
                    producer.flush(30)
                    verdict_s = time.time() - injected
                    want = [f"{prefix}{g // GPUS_PER_NODE}" for g in faulted]
                    deadline = time.time() + 120
                    while not all(n in watch.at for n in want) and time.time() < deadline:
                        time.sleep(0.02)
                    verdicts += [verdict_s] * len(want)
                    cordoned += [watch.at[n] - injected for n in want if n in watch.at]
                    if len(cordoned) < len(verdicts):
                        print(f"round {r}: {len(verdicts) - len(cordoned)} nodes not cordoned in 120 s")
            watch.stop.set()
            producer.close()
    finally:
        for kube_name in (n["kubernetes"] for n in names.values()):
            admin.delete(f"/api/v1/nodes/{kube_name}")
        admin.close()
    return verdicts, cordoned


def p(values: list[float], q: int) -> float:
    """The q-th percentile (q of 100); the largest for q = 100 - 1 over fewer than 100 values."""
    return quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> int:
    settings = Settings()
    for gpus in (1_000, 10_000):
        verdicts, cordoned = run(settings, gpus)
        if not cordoned:
            print(f"{gpus:,} GPUs: no node was cordoned")
            return 1
        for q in (50, 99):
            report(f"fault to cordon in the API server, {gpus:,} GPUs, p{q} ({len(cordoned)} faults)",
                   p(cordoned, q), "s", "fault to verdict on gpu-health", p(verdicts, q))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
