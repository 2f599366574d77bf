"""The health scorer on the real pipeline: injected faults become the right verdicts and actions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from evaluation.pipeline import pipeline
from shared.contract.models import to_json
from shared.contract.models_health import parse_alert, parse_health_verdict
from shared.contract.signing import Keyring
from shared.settings.common import DatabaseSettings, KafkaSettings, TopicSettings
from tests.helpers.kafka import consume_all
from tests.helpers.remediation import scorer_key
from tests.helpers.topics import isolated_topics, topics_env
from tests.paths import REPO


@pytest.fixture
def topics(topic_factory: Callable[..., str]) -> TopicSettings:
    return isolated_topics(topic_factory)


H100, H100B, A100, V100 = 0, 1, 2, 3  # nodes of the default model cycle
EXPECTED: dict[tuple[int, int], tuple[dict[str, Any], str, str, str, str]] = {
    # (node, gpu): (fault request, subsystem, state, rule, action on the GPU)
    (H100, 0): ({"kind": "sbe_storm", "params": {"rate_per_hour": 300, "growth_per_hour": 0}},
                "memory", "degraded", "sbe_rate_high", "restart_workload"),
    (H100, 1): ({"kind": "dbe"}, "memory", "unhealthy", "volatile_dbe", "reset_gpu"),
    # Changed by issue 32: a failed remap, the retired-page limit, a power brake and a PCIe replay storm
    # were inspect; the action ladder now has the rung each needs.
    (H100, 2): ({"kind": "row_remap_failure"}, "memory", "unhealthy", "row_remap_failure", "send_for_repair"),
    (H100, 3): ({"kind": "xid", "params": {"code": 74}}, "xid", "unhealthy", "xid_74", "reset_gpu"),
    (V100, 0): ({"kind": "retired_pages", "params": {"pages_per_hour": 60}},
                "memory", "unhealthy", "retired_pages_limit", "send_for_repair"),
    (V100, 1): ({"kind": "pending_retirement"}, "memory", "degraded", "page_retirement_pending", "reset_gpu"),
    (H100B, 0): ({"kind": "thermal_runaway", "after_s": 7200, "params": {"c_per_minute": 5, "max_c": 70}},
                 "thermal", "unhealthy", "hw_thermal_slowdown", "inspect"),
    (H100B, 1): ({"kind": "power_brake", "after_s": 7800}, "power", "unhealthy", "hw_power_brake",
                 "check_mechanicals"),
    (H100B, 2): ({"kind": "pcie_replay_storm"}, "pcie", "unhealthy", "pcie_replay_storm",
                 "check_mechanicals"),
    (H100B, 3): ({"kind": "nvlink_errors"}, "nvlink", "unhealthy", "nvlink_replay_recovery", "reset_gpu"),
    (A100, 0): ({"kind": "fall_off_bus", "after_s": 7200, "params": {"scrape_delay_s": 0}},
                "availability", "unhealthy", "not_reporting", "reboot_node"),
}  # fmt: skip


def test_every_fault_type_gets_its_verdict_and_action_and_the_healthy_stay_healthy(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    with pipeline(kafka_settings, migrated, topics, nodes=4, gpus=4, hours_back=3) as p:
        ids = {}
        for (node, gpu), (request, *_) in EXPECTED.items():
            ids[(node, gpu)] = p.inject(node=node, gpu=gpu, **{"after_s": 600, **request})
        p.run(9000)  # 2.5 simulated hours
        first = p.score()
        verdicts = p.verdicts()
        status = {
            str(u): (str(a), float(s))
            for u, a, s in p.query("SELECT gpu_uuid, action, score FROM gpu_status")
        }
        for (node, gpu), (_, subsystem, state, rule, action) in EXPECTED.items():
            uuid = p.gpu(node, gpu)
            assert verdicts[(uuid, subsystem)] == (state, rule), (node, gpu, subsystem)
            assert status[uuid][0] == action, (node, gpu)
            assert status[uuid][1] < 100
        faulty = {p.gpu(n, g) for n, g in EXPECTED}
        healthy = [uuid for node in p.fleet.nodes for g in node.gpus if (uuid := g.uuid) not in faulty]
        assert healthy
        for uuid in healthy:
            bad = {k[1]: v for k, v in verdicts.items() if k[0] == uuid and v[0] != "healthy"}
            assert bad == {}, (uuid, bad)
            assert status[uuid] == ("none", 100.0) or status[uuid][1] > 75
        assert first.states["unhealthy"] == 9
        assert sum(1 for m in first.messages if m[0] == "health") >= len(EXPECTED)

        # An alert opens once and stays single while its evidence lasts.
        lost = p.gpu(A100, 0)
        alert = "SELECT id, state FROM gpu_alerts WHERE gpu_uuid = %s AND kind = 'unhealthy_availability'"
        opened = p.query(alert, lost)
        assert [s for _, s in opened] == ["open"]
        p.run(240)
        p.score()
        assert p.query(alert, lost) == opened

        # Back on the bus (and the other faults ended): verdicts clear, alerts resolve.
        p.fleet.clear(ids[(A100, 0)])
        p.fleet.clear(ids[(H100B, 0)])
        p.run(1500)
        p.score()
        verdicts = p.verdicts()
        assert verdicts[(lost, "availability")] == ("healthy", None)
        assert verdicts[(p.gpu(H100B, 0), "thermal")] == ("healthy", None)
        assert [s for _, s in p.query(alert, lost)] == ["resolved"]
        history = p.query(
            "SELECT state FROM gpu_health WHERE gpu_uuid = %s AND subsystem = 'availability' ORDER BY time",
            lost,
        )
        assert [s for (s,) in history] == ["unhealthy", "healthy"]
        predictions = p.query(
            "SELECT p_fail_30d FROM gpu_failure_predictions WHERE gpu_uuid = %s", p.gpu(V100, 0)
        )
        assert predictions
        assert max(float(x) for (x,) in predictions) > 0.05  # 100+ retired pages is a real risk


def test_the_same_xid_after_repeated_resets_escalates(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=2, hours_back=2) as p:
        uuid = p.gpu(0, 1)
        p.run(600)
        actions = []
        for _ in range(3):
            fault = p.inject(node=0, gpu=1, kind="xid", params={"code": 79})
            p.run(240)
            p.score()
            actions.append(p.query("SELECT action FROM gpu_status WHERE gpu_uuid = %s", uuid)[0][0])
            p.fleet.clear(fault)  # the operator acted: the GPU was reset, the node rebooted
            p.run(240)
        # XID 79 first means reboot the node; the same XID after that reboot means inspect.
        assert actions == ["reboot_node", "inspect", "inspect"]
        xids = p.query("SELECT count(*) FROM gpu_events WHERE gpu_uuid = %s AND kind = 'xid'", uuid)
        assert xids == [(3,)]


def test_the_scorer_process_publishes_signed_verdicts_and_exits_cleanly(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings,
    topic_factory: Callable[..., str], tmp_path: Path,
) -> None:  # fmt: skip
    health, alerts, key = topics.health, topics.alerts, scorer_key(tmp_path / "keys")
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=2, hours_back=1) as p:
        p.inject(node=0, gpu=0, kind="dbe", after_s=300)
        p.run(1200)
        p.settle()
        (as_of,) = p.query("SELECT max(time) FROM gpu_latest")[0]
    env = {
        **os.environ,
        "GPUHEALTH_KAFKA__BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "GPUHEALTH_DB__SEARCH_PATH": migrated.search_path or "",
        **topics_env(topics),
        "GPUHEALTH_SCORER__GROUP": f"scorer-{topics.events}",  # its own group: never the running stack's
        "GPUHEALTH_SCORER__METRICS_PORT": "0", "GPUHEALTH_SCORER__AS_OF": as_of.isoformat(),
        "GPUHEALTH_SCORER__SIGNING__PRIVATE_KEY_FILE": str(key.signer_file),
    }  # fmt: skip
    once = subprocess.run([sys.executable, "-m", "services.scorer"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert once.returncode == 0, once.stderr
    read = consume_all(kafka_settings, health, expected=2) + consume_all(kafka_settings, alerts, expected=2)
    keyring = Keyring.load(key.trusted)  # what a remediator trusts: every message verifies under it
    for m in read:
        signed = keyring.verify(topic=str(m.topic()), key=m.key(), value=m.value(), headers=m.headers())
        assert signed.kid == key.signer.kid
    verdicts = [to_json(parse_health_verdict(m.value() or b"")) for m in read if m.topic() == health]
    assert {(v["subsystem"], v["state"]) for v in verdicts} >= {("memory", "unhealthy"), ("xid", "unhealthy")}
    opened = [to_json(parse_alert(m.value() or b"")) for m in read if m.topic() == alerts]
    assert {a["kind"] for a in opened} == {"unhealthy_memory", "unhealthy_xid"}
    assert {a["state"] for a in opened} == {"open"}

    loop_env = {**env, "GPUHEALTH_SCORER__AS_OF": "latest", "GPUHEALTH_SCORER__INTERVAL_S": "1"}
    looping = subprocess.Popen([sys.executable, "-m", "services.scorer"], cwd=REPO, env=loop_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        assert looping.stdout is not None
        for line in looping.stdout:  # wait for one full cycle
            if '"msg": "cycle"' in line:
                break
        looping.send_signal(signal.SIGTERM)
        assert looping.wait(30) == 0
    finally:
        looping.kill()


def test_falls_off_the_bus_repeat_into_inspect_and_an_application_xid_stays_and_clears(
    kafka_settings: KafkaSettings, migrated: DatabaseSettings, topics: TopicSettings
) -> None:
    # Issue 16, on the Kafka path: every fall off the bus reaches the database as its own XID 79
    # and gpu_lost, and the second one recommends inspect; one application XID is restart_workload
    # and clears after its own time-to-clear from the rules file.
    with pipeline(kafka_settings, migrated, topics, nodes=1, gpus=2, hours_back=3) as p:
        bus, app = p.gpu(0, 1), p.gpu(0, 0)
        p.run(600)
        p.inject(node=0, gpu=0, kind="xid", duration_s=300, params={"code": 13})
        actions, app_actions = [], []
        for _ in range(3):
            p.inject(node=0, gpu=1, kind="fall_off_bus", duration_s=480, params={"scrape_delay_s": 0})
            p.run(240)
            p.score()
            actions.append(p.query("SELECT action FROM gpu_status WHERE gpu_uuid = %s", bus)[0][0])
            app_actions.append(p.query("SELECT action FROM gpu_status WHERE gpu_uuid = %s", app)[0][0])
            p.run(600)  # back on the bus
        assert actions == ["reboot_node", "inspect", "inspect"]
        assert app_actions == ["restart_workload"] * 3
        p.run(1200)
        p.score()
        events = dict(p.query("SELECT kind, count(*) FROM gpu_events WHERE gpu_uuid = %s GROUP BY kind", bus))
        assert events["gpu_lost"] == 3
        assert events["gpu_back"] == 3
        assert p.query("SELECT count(*) FROM gpu_events WHERE gpu_uuid = %s AND kind = 'xid'", bus) == [(3,)]
        (evidence,) = p.query(
            "SELECT evidence FROM gpu_health_current WHERE gpu_uuid = %s AND subsystem = 'xid'", bus
        )[0]
        assert evidence["fall_off_episodes"] == 3
        assert len(evidence["repeats_counted"]["xid_79"]) == 3
        assert p.verdicts()[(app, "xid")] == ("healthy", None)  # XID 13 aged out after 3600 s
        history = p.query(
            "SELECT state FROM gpu_health WHERE gpu_uuid = %s AND subsystem = 'xid' ORDER BY time", app
        )
        assert [s for (s,) in history] == ["degraded", "healthy"]
        assert p.query("SELECT action FROM gpu_status WHERE gpu_uuid = %s", app) == [("none",)]
