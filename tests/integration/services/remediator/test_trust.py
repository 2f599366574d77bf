"""Forged, replayed, stale and wrong-host verdicts against `python -m services.remediator`, live on the real
API server, through the real broker: each makes no decision and no plan and is a counted, recorded refusal;
the one genuine verdict among them cordons its node, once. And a key rotated: old and new both believed,
then the old one dropped and refused."""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from evaluation.pipeline import wait_until
from services.remediator.drivers.kubernetes import MARK, OWNER
from shared.contract.models import to_json
from shared.contract.models_health import AlertOpened, HealthVerdict
from shared.contract.models_remediation import parse_remediation
from shared.contract.signing import KID_HEADER, SIG_HEADER, Signer, keygen
from shared.plumbing.kafka import JsonProducer, make_producer
from shared.settings.common import DatabaseSettings, KafkaSettings
from tests.helpers.kafka import consume_all
from tests.helpers.kube import KubeAdmin
from tests.helpers.ports import free_port
from tests.helpers.remediation import (
    add_fleet,
    add_nodes,
    gpu_uuid,
    node_name,
    rows,
    scorer_key,
    service_env,
)
from tests.helpers.service_process import service_process, sigterm


def refused_by_reason(port: int) -> dict[str, float]:
    """gpuhealth_remediator_refused_total by reason, as the service's /metrics says."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.TransportError:
        return {}
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpuhealth_remediator_refused"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def verdict(gpu: str, hostname: str, at: datetime) -> dict[str, Any]:
    """A verdict calling for the node to be cordoned and kept out (`inspect`: automatic, no reset)."""
    return to_json(
        HealthVerdict(
            time=at, gpu_uuid=gpu, hostname=hostname, subsystem="xid", state="unhealthy", previous="healthy",
            rule="xid_79", action="inspect", evidence={"xid": 79},
        )
    )  # fmt: skip


def test_forged_replayed_stale_and_wrong_host_verdicts_make_no_plan_and_are_counted_refusals(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    kube: KubeAdmin,
    kube_nodes: Callable[[int], list[str]],
    kube_remediator: Path,
    tmp_path: Path,
) -> None:
    health, alerts, out = (
        topic_factory(prefix="health"),
        topic_factory(prefix="alerts"),
        topic_factory(prefix="rem"),
    )
    victim, bystander, sick = kube_nodes(3)  # GPU nodes in the API server, and in the inventory
    add_nodes(migrated, {victim: [gpu_uuid(0, 0)], bystander: [gpu_uuid(1, 0)], sick: [gpu_uuid(2, 0)]})
    key, now, port = scorer_key(tmp_path / "keys"), datetime.now(UTC), free_port()
    thief = Signer(Ed25519PrivateKey.generate())  # a key the remediator does not trust
    genuine = verdict(gpu_uuid(2, 0), sick, now)
    sent: list[bytes] = []  # every signature sent: none may appear in the service's output

    def signed_as(signer: Signer, topic: str, gpu: str, value: dict[str, Any]) -> dict[str, bytes]:
        headers = signer.headers(topic, gpu, value)
        sent.append(headers[SIG_HEADER])
        return headers

    with JsonProducer(make_producer(kafka_settings)) as producer:
        stolen = verdict(gpu_uuid(0, 0), victim, now)
        forged: list[tuple[str, str, dict[str, Any], dict[str, bytes] | None]] = [
            # unsigned: the forged verdict, naming the victim
            (health, gpu_uuid(0, 0), verdict(gpu_uuid(0, 0), victim, now), None),
            # signed by a key the remediator does not trust
            (health, gpu_uuid(0, 0), stolen, signed_as(thief, health, gpu_uuid(0, 0), stolen)),
        ]
        # the trusted key's id with another key's signature
        v = verdict(gpu_uuid(0, 0), victim, now + timedelta(seconds=1))
        stolen_id = {
            KID_HEADER: key.signer.kid.encode(),
            SIG_HEADER: base64.b64encode(thief.sign(health, gpu_uuid(0, 0).encode(), v)),
        }
        sent.append(stolen_id[SIG_HEADER])
        forged.append((health, gpu_uuid(0, 0), v, stolen_id))
        # signed, and all else wrong: another host than the inventory's (a control plane), a GPU nobody
        # knows, a time long past, a time ahead
        for gpu, host, at in (
            (gpu_uuid(1, 0), "control-plane-1", now),
            (gpu_uuid(9, 0), "control-plane-1", now),
            (gpu_uuid(1, 0), bystander, now - timedelta(hours=2)),
            (gpu_uuid(1, 0), bystander, now + timedelta(hours=2)),
        ):
            v = verdict(gpu, host, at)
            forged.append((health, gpu, v, signed_as(key.signer, health, gpu, v)))
        # the genuine verdict: signed for gpu-health under its GPU's key; replayed onto gpu-alerts and
        # under another GPU's key, its signature no longer holds
        headers = signed_as(key.signer, health, gpu_uuid(2, 0), genuine)
        forged.append((alerts, gpu_uuid(2, 0), genuine, headers))
        forged.append((health, gpu_uuid(0, 0), genuine, headers))
        for topic, gpu, value, with_headers in forged:
            producer.produce(topic, gpu, value, headers=with_headers)
        producer.produce(health, gpu_uuid(2, 0), genuine, headers=headers)  # acts
        producer.produce(
            health, gpu_uuid(2, 0), genuine, headers=headers
        )  # replayed as it was: decided already
        opened = to_json(
            AlertOpened(
                time=now, alert_id=7, gpu_uuid=gpu_uuid(1, 0), hostname=bystander, kind="thermal",
                severity="critical", state="open", summary="hot", evidence={},
            )
        )  # fmt: skip
        key.produce(producer, alerts, gpu_uuid(1, 0), opened)  # signed, genuine, and no action: nothing
    env = service_env(
        kafka_settings, migrated, {"health": health, "alerts": alerts, "remediations": out},
        port=port, trusted=key.trusted,
    ) | {
        "GPUHEALTH_REMEDIATOR__DRY_RUN": "false",
        "GPUHEALTH_REMEDIATOR__KUBERNETES__ENABLED": "true",
        "GPUHEALTH_REMEDIATOR__KUBERNETES__KUBECONFIG": str(kube_remediator),
    }  # fmt: skip
    expected = {
        "unsigned": 1, "unknown_key": 1, "bad_signature": 3, "invalid": 0,
        "stale": 1, "future": 1, "unknown_gpu": 1, "wrong_host": 1,
    }  # fmt: skip
    with service_process("remediator", env) as proc:
        wait_until(lambda: refused_by_reason(port) == expected, 90, "every forged verdict refused")
        wait_until(lambda: kube.node(sick)["spec"].get("unschedulable") is True, 60, "the genuine one acted")
        wait_until(
            lambda: rows(migrated, "SELECT state FROM remediations") == [("done",)], 60, "its plan done"
        )
        wait_until(
            lambda: rows(migrated, "SELECT count(*) FROM remediation_events WHERE NOT published") == [(0,)],
            60,
            "every record published",
        )
        ((written,),) = rows(migrated, "SELECT count(*) FROM remediation_events")
        records = [parse_remediation(m.value() or b"") for m in consume_all(kafka_settings, out, written, 60)]
        output = sigterm(proc)
    # one decision, one plan: the genuine verdict's, on its node; the replay decided nothing more
    assert rows(migrated, "SELECT node, action, outcome FROM remediation_decisions") == [
        (sick, "inspect", "act")
    ]
    assert rows(migrated, "SELECT node, state FROM remediations") == [(sick, "done")]
    assert kube.node(sick)["metadata"]["annotations"][MARK] == OWNER
    for node in (victim, bystander):
        assert not kube.node(node)["spec"].get("unschedulable"), node
    # each refusal recorded, naming where it was read and why, on no node
    refusals = [r for r in records if r.kind == "refusal"]
    assert sorted(str(r.response["reason"]) for r in refusals) == sorted(
        reason for reason, count in expected.items() for _ in range(int(count))
    )
    assert {(r.status, r.node, r.remediation_id, r.dry_run) for r in refusals} == {
        ("refused", "", None, False)
    }
    assert {str(r.response["topic"]) for r in refusals} == {health, alerts}
    assert all(isinstance(r.response["offset"], int) for r in refusals)
    wrong_host = next(r for r in refusals if r.response["reason"] == "wrong_host")
    assert wrong_host.gpu_uuid == gpu_uuid(1, 0)
    assert f"the inventory on '{bystander}'" in (wrong_host.reason or "")
    in_db = rows(
        migrated, "SELECT count(*) FROM remediation_events WHERE kind = 'refusal' AND status = 'refused'"
    )
    assert in_db == [(9,)]
    # logged, without the signatures
    assert output.count("message refused, nothing decided") == 9
    assert not [s for s in sent if s.decode() in output]


def test_a_key_rotated_out_is_trusted_beside_the_new_then_dropped(
    kafka_settings: KafkaSettings,
    migrated: DatabaseSettings,
    topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    """Rotation as docs/services/remediator.md has it: both keys in the keyring, then the old one gone."""
    health, alerts = topic_factory(prefix="health"), topic_factory(prefix="alerts")
    add_fleet(migrated, 40)
    old = scorer_key(tmp_path / "keys")
    _, new_private, _ = keygen(tmp_path / "keys", "scorer-2")
    new, now, port = Signer.load(new_private), datetime.now(UTC), free_port()
    topics = {"health": health, "alerts": alerts, "remediations": topic_factory(prefix="rem")}
    env = service_env(kafka_settings, migrated, topics, port=port, trusted=old.trusted)

    def send(signer: Signer, node: int) -> None:
        value = verdict(gpu_uuid(node, 0), node_name(node), now)
        with JsonProducer(make_producer(kafka_settings)) as producer:
            producer.produce(
                health, gpu_uuid(node, 0), value, headers=signer.headers(health, gpu_uuid(node, 0), value)
            )

    decided = "SELECT node FROM remediation_decisions ORDER BY node"
    send(old.signer, 0)  # in flight when the scorer moved to the new key
    send(new, 1)
    with service_process("remediator", env) as proc:
        wait_until(lambda: len(rows(migrated, decided)) == 2, 60, "both keys believed")
        sigterm(proc)
    (old.trusted / "scorer.pem").unlink()  # max_age_s later: the old key leaves the keyring
    send(old.signer, 2)
    send(new, 3)
    with service_process("remediator", env) as proc:
        wait_until(lambda: refused_by_reason(port).get("unknown_key") == 1, 60, "the old key refused")
        wait_until(lambda: len(rows(migrated, decided)) == 3, 60, "the new key believed")
        sigterm(proc)
    assert rows(migrated, decided) == [(node_name(0),), (node_name(1),), (node_name(3),)]
