"""A job's crash across its GPUs is one finding for the job; a fault across a host is one for the host."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from services.scorer.cycle import run_cycle
from services.scorer.rules_config import load_rules
from services.sink.rows import stage_row
from services.sink.workload_rows import poll_row, process_rows
from services.sink.writer import Batch, BatchWriter
from shared.contract.models import GpuEvent, parse_event
from shared.contract.models_workload import GpuProcess, GpuProcesses, ProcessClass
from shared.fakes.samples import T0, gpu_uuid, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.workload import insert_process_poll

GPUS = 16  # node-00: GPUs 0-7, node-01: GPUs 8-15


def event(i: int, kind: str, seconds: float, details: dict[str, Any]) -> GpuEvent:
    return parse_event(json.dumps({
        "schema_version": 1, "time": (T0 + timedelta(seconds=seconds)).isoformat(), "kind": kind,
        "gpu_uuid": gpu_uuid(i), "hostname": f"node-{i // 8:02d}", "rack": "r1", "source": "mock",
        "collector_id": "itest", "details": details,
    }))  # fmt: skip


def pod_of(i: int) -> str:
    # GPUs 0-3 run one job's workers (train-3f2a-worker-0..3), GPU 4 a job of its own
    return f"train-3f2a-worker-{i}" if i < 4 else f"solo-{i}-0"


def test_a_job_crash_is_the_jobs_and_a_host_fault_the_hosts(migrated: DatabaseSettings) -> None:
    rows = [
        stage_row(json.dumps(sample(k, gpus=GPUS, pod=pod_of(k % GPUS), namespace="ml")))
        for k in range(GPUS * 60)  # ten minutes, every 10 s
    ]
    crash = [event(i, "xid", 500 + 0.3 * i, {"xid": 13}) for i in range(4)]  # the job dies on its four GPUs
    crash += [event(i, "xid", 501 + 0.3 * i, {"xid": 45}) for i in range(4)]
    solo = [event(4, "xid", 510, {"xid": 13})]  # one GPU's own job: its verdict, as ever
    host = [event(i, "xid", 520 + i, {"xid": 79}) for i in (8, 9, 10)]  # node-01 loses three GPUs at once
    writer = BatchWriter(migrated, group="itest-32-correlation", connections=1)
    try:
        writer.write(Batch(rows=rows, events=crash + solo + host, next_offsets={("t", 0): len(rows) + 11}))
    finally:
        writer.close()
    rules = load_rules()
    with connect(migrated) as conn:
        run_cycle(conn, T0 + timedelta(seconds=595), rules, predictions={})
        xid = {str(u): str(st) for u, st in conn.execute(
            "SELECT gpu_uuid, state FROM gpu_health_current WHERE subsystem = 'xid'").fetchall()}  # fmt: skip
        alerts: list[Any] = conn.execute(
            "SELECT gpu_uuid, kind, summary, evidence FROM gpu_alerts ORDER BY kind"
        ).fetchall()
        actions = {
            str(u): str(a) for u, a in conn.execute("SELECT gpu_uuid, action FROM gpu_status").fetchall()
        }
    # the job's four GPUs are neither degraded nor escalated for its crash
    assert all(xid.get(gpu_uuid(i), "healthy") == "healthy" for i in range(4))
    assert all(actions[gpu_uuid(i)] == "none" for i in range(4))
    assert xid[gpu_uuid(4)] == "degraded"  # a lone application XID is still the GPU's finding
    jobs = [a for a in alerts if a[1] == "job_crash"]
    assert len(jobs) == 1
    holder, _, summary, evidence = jobs[0]
    assert holder == min(gpu_uuid(i) for i in range(4))
    assert evidence["job"] == "ml/train-3f2a"
    assert sorted(evidence["gpus"]) == sorted(gpu_uuid(i) for i in range(4))
    assert evidence["xids"] == [13, 45]
    assert "ml/train-3f2a" in summary
    hosts = [a for a in alerts if a[1] == "node_fault"]
    assert len(hosts) == 1
    assert hosts[0][3]["node"] == "node-01"
    assert hosts[0][3]["gpu_count"] == 3
    assert [a for a in alerts if a[1] == "rack_fault"] == []  # one host is no rack fault
    assert all(actions[gpu_uuid(i)] == "reboot_node" for i in (8, 9, 10))  # the GPUs' own verdicts stay


def listing(i: int, seconds: float, job_key: str) -> GpuProcesses:
    process = GpuProcess(pid=1000 + i, type="compute", executable="/usr/bin/python3",
                         command_line="python3 -c import w; w.main()", classification=ProcessClass.TRAINING,
                         rule="launched-worker", launcher="torchrun", job_key=job_key, rank=i % 4,
                         local_rank=i % 2, world_size=4)  # fmt: skip
    return GpuProcesses(time=T0 + timedelta(seconds=seconds), source="nvml", collector_id="itest",
                        hostname=f"node-{i // 8:02d}", gpu_uuid=gpu_uuid(i), gpu_index=i % 8,
                        processes=[process])  # fmt: skip


def test_without_pod_labels_the_launchers_job_key_groups_the_gpus(migrated: DatabaseSettings) -> None:
    """Bare-metal torchrun across two hosts: no pod or job label, only the workers' elastic run id."""
    job = (0, 1, 8, 9)  # two GPUs on each of node-00 and node-01
    rows = [stage_row(json.dumps(sample(k, gpus=GPUS))) for k in range(GPUS * 60)]
    crash = [event(i, "xid", 500 + 0.5 * n, {"xid": 13}) for n, i in enumerate(job)]
    other = [event(4, "xid", 502, {"xid": 13})]  # a worker of another run, alone: its GPU's finding
    writer = BatchWriter(migrated, group="itest-32-launch", connections=1)
    try:
        writer.write(Batch(rows=rows, events=crash + other, next_offsets={("t", 0): len(rows) + 5}))
    finally:
        writer.close()
    with connect(migrated) as conn:
        with conn.cursor() as cur:
            for seconds in (300, 490):
                for i in (*job, 4):
                    m = listing(i, seconds, "elastic:run-9" if i in job else "elastic:run-other")
                    insert_process_poll(cur, poll_row(m), process_rows(m))
        conn.commit()
        run_cycle(conn, T0 + timedelta(seconds=595), load_rules(), predictions={})
        alerts: list[Any] = conn.execute(
            "SELECT gpu_uuid, evidence FROM gpu_alerts WHERE kind = 'job_crash'"
        ).fetchall()
        actions = {
            str(u): str(a) for u, a in conn.execute("SELECT gpu_uuid, action FROM gpu_status").fetchall()
        }
    assert len(alerts) == 1
    assert alerts[0][1]["job"] == "launch/elastic:run-9"
    assert sorted(alerts[0][1]["gpus"]) == sorted(gpu_uuid(i) for i in job)
    assert sorted(alerts[0][1]["hosts"]) == ["node-00", "node-01"]
    assert all(actions[gpu_uuid(i)] == "none" for i in job)
    assert actions[gpu_uuid(4)] == "restart_workload"
