"""A job's crash and a host's fault as the API, the CLI and the page show them: the job or the place,
all its GPUs and hosts, not only the GPU that holds the alert."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from services.api import cli
from services.scorer.cycle import run_cycle
from services.scorer.rules_config import load_rules
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.contract.models import GpuEvent, parse_event
from shared.fakes.samples import T0, gpu_uuid, sample
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.browser import chromium, log_in, shot
from tests.helpers.identities import VIEWER, identities, token_args

GPUS = 16  # node-00: GPUs 0-7, node-01: GPUs 8-15
JOB = (0, 1, 8, 9)  # one job's workers on two hosts
HOST = (12, 13, 14)  # node-01 loses three GPUs at once


def event(i: int, seconds: float, code: int) -> GpuEvent:
    return parse_event(json.dumps({
        "schema_version": 1, "time": (T0 + timedelta(seconds=seconds)).isoformat(), "kind": "xid",
        "gpu_uuid": gpu_uuid(i), "hostname": f"node-{i // 8:02d}", "rack": "r1", "source": "mock",
        "collector_id": "itest", "details": {"xid": code},
    }))  # fmt: skip


@pytest.fixture
def findings(migrated: DatabaseSettings) -> dict[str, Any]:
    def pod(i: int) -> str:
        return f"train-3f2a-worker-{JOB.index(i)}" if i in JOB else f"solo-{i}-0"

    rows = [
        stage_row(json.dumps(sample(k, gpus=GPUS, pod=pod(k % GPUS), namespace="ml")))
        for k in range(GPUS * 60)
    ]
    events = [event(i, 500 + 0.4 * n, 13) for n, i in enumerate(JOB)] + [event(i, 520 + i, 79) for i in HOST]
    writer = BatchWriter(migrated, group="itest-32-shown", connections=1)
    try:
        writer.write(Batch(rows=rows, events=events, next_offsets={("t", 0): len(rows) + len(events)}))
    finally:
        writer.close()
    with connect(migrated) as conn:
        run_cycle(conn, T0 + timedelta(seconds=595), load_rules(), predictions={})
    return {"job_holder": min(gpu_uuid(i) for i in JOB), "job_gpus": sorted(gpu_uuid(i) for i in JOB),
            "host_gpus": sorted(gpu_uuid(i) for i in HOST)}  # fmt: skip


def test_the_api_names_the_job_and_the_host_with_all_their_gpus_and_hosts(
    served_api: str, findings: dict[str, Any]
) -> None:
    listed = VIEWER.get(served_api + "/api/v1/alerts", params={"limit": 100}, timeout=30).json()["alerts"]
    by_kind = {a["kind"]: a for a in listed if a["shared"] is not None}
    assert set(by_kind) == {"job_crash", "node_fault"}
    job = by_kind["job_crash"]
    assert job["gpu_uuid"] == findings["job_holder"]
    assert job["shared"] == {
        "scope": "job", "key": "ml/train-3f2a", "gpu_count": 4, "gpus": findings["job_gpus"],
        "hosts": ["node-00", "node-01"], "xids": [13], "first": job["evidence"]["first"],
        "last": job["evidence"]["last"],
    }  # fmt: skip
    node = by_kind["node_fault"]["shared"]
    assert (node["scope"], node["key"], node["hosts"]) == ("node", "node-01", ["node-01"])
    assert node["gpus"] == findings["host_gpus"]
    assert all(
        a["shared"] is None for a in listed if a["kind"] not in ("job_crash", "node_fault", "rack_fault")
    )
    detail = VIEWER.get(served_api + f"/api/v1/gpus/{findings['job_holder']}", timeout=30).json()
    assert [a["shared"]["key"] for a in detail["open_alerts"] if a["shared"]] == ["ml/train-3f2a"]


def test_the_cli_lists_the_jobs_gpus_and_hosts(
    served_api: str, findings: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*token_args("viewer"), "--url", served_api, "alerts"]) == 0
    listed = capsys.readouterr().out
    assert f"job ml/train-3f2a: 4 GPUs on node-00, node-01: {' '.join(findings['job_gpus'])}" in listed
    assert f"node node-01: 3 GPUs on node-01: {' '.join(findings['host_gpus'])}" in listed
    assert cli.main([*token_args("viewer"), "--url", served_api, "gpu", findings["job_holder"]]) == 0
    assert "job ml/train-3f2a: 4 GPUs on node-00, node-01" in capsys.readouterr().out


def test_the_page_shows_the_job_and_the_host_not_the_gpu_holding_the_alert(
    served_api: str, findings: dict[str, Any]
) -> None:
    html = VIEWER.get(served_api + "/", timeout=30).text  # the server's first paint
    assert '<span class="shared" data-scope="job"' in html
    assert "job ml/train-3f2a: 4 GPUs on node-00, node-01</span>" in html
    browser = chromium()
    try:
        log_in(browser, served_api, identities().tokens["viewer"])
        wait = WebDriverWait(
            browser, 30, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
        )
        wait.until(lambda d: "live" in d.find_element(By.ID, "s-updated").text)  # redrawn by the script
        job = browser.find_element(By.CSS_SELECTOR, '#alerts span.shared[data-scope="job"]')
        assert job.text == "job ml/train-3f2a: 4 GPUs on node-00, node-01"
        assert (job.get_attribute("title") or "").split() == findings["job_gpus"]
        node = browser.find_element(By.CSS_SELECTOR, '#alerts span.shared[data-scope="node"]')
        assert node.text == "node node-01: 3 GPUs on node-01"
        shot(browser, "fleet-page-6-job-and-host-findings.png")
        browser.find_element(By.CSS_SELECTOR, f'#alerts tr[data-uuid="{findings["job_holder"]}"]').click()
        wait.until(
            lambda d: d.find_element(By.ID, "detail").get_attribute("data-loaded") == findings["job_holder"]
        )
        wait.until(lambda d: "hosts node-00, node-01" in d.find_element(By.ID, "d-alerts").text)
        assert " ".join(findings["job_gpus"]) in browser.find_element(By.ID, "d-alerts").text
    finally:
        browser.quit()
