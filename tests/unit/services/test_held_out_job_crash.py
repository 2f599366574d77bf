"""The held-out run, replayed: a DBE (XID 48) on one GPU, 20 s later its job crashes on all eight GPUs
with XID 45. The mock fleet writes the lines and the last-XID gauge; the collector reads both, as
the `make up` stack does (exporter and the node's kernel log); the scorer judges what it published.

The DBE GPU's gauge shows 48, then 45, then 48 again when the crash's XID clears: one DBE, so one
XID 48, and the GPU ends at NVIDIA's action for a DBE (reset the GPU), not escalated to a reboot.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuhealth.gpu.readings import SourceReading
from services.collector.dcgm_source import parse_exposition
from services.collector.enrich import Enricher, Placement
from services.collector.events import EventDetector
from services.collector.kernel_log import JournalFeed
from services.mock_dcgm.fleet import Fleet
from services.scorer.escalation import xid_counts
from services.scorer.features import XidCounts, XidEvent, XidValue
from services.scorer.rules import evaluate
from services.scorer.workflows import judge
from shared.contract.models import EventKind, GpuEvent, Source
from tests.helpers.mock_fleet import T0, make_fleet
from tests.helpers.scorer import HEALTHY, RULES

DBE_GPU = 3
ENRICH = Enricher(collector_id="c-1", local_hostname="collector", placement=Placement(cluster="local"))


def journal_of(fleet: Fleet) -> Any:
    """`journalctl -k -o json` of node 0, asked as the collector's journal feed asks the mock's."""

    def run(args: list[str]) -> str:
        query = dict(
            a.removeprefix("--").split("=", 1) for a in args if a.startswith(("--after-cursor=", "--since="))
        )
        body, _lost = fleet.journal(0, after_cursor=query.get("after-cursor"), since=query.get("since"))
        return body.decode()

    return run


def replay(*, interval_s: float, kernel_log: bool) -> tuple[Fleet, list[GpuEvent]]:
    fleet, hand = make_fleet(nodes=1, gpus=8)
    feed = JournalFeed(journal_of(fleet), hosts=True, from_start=True) if kernel_log else None
    detector = EventDetector(collector_id="c-1", fold_s=10.0)
    fleet.inject({"kind": "dbe", "node": 0, "gpu": DBE_GPU, "after_s": 60})
    fleet.inject({"kind": "job_crash", "node": 0, "gpu": 0, "after_s": 80, "duration_s": 300,
                  "params": {"gpus": 8, "code": 45, "spread_s": 2}})  # fmt: skip
    events: list[GpuEvent] = []
    while hand.t <= 460:  # the crash's XID clears at 382 s: the gauge goes back to 48
        at = datetime.fromtimestamp(T0 + hand.t, UTC)
        text, _ = fleet.scrape(0, timestamps=True)
        readings = parse_exposition(text, scraped_at=at)
        got = SourceReading(Source.MOCK, "node-0", readings, at, 1.0)
        samples = [s for r in readings if (s := ENRICH.sample(r, got)) is not None]
        if feed is not None:  # as the collector's poll does: the kernel log, then the source
            detector.take_kernel_xids("journal", feed.drain())
        events += detector.observe("node-0", Source.MOCK, samples, at)
        events += detector.kernel_xids("journal", [], at)
        events += detector.flush(at)
        hand.t += interval_s
    return fleet, events + detector.flush_all()


def xids_by_gpu(events: list[GpuEvent]) -> dict[str, dict[int, int]]:
    found: dict[str, dict[int, int]] = {}
    for e in events:
        if e.kind is EventKind.XID:
            code = int(str(e.details["xid"]))
            counts = found.setdefault(e.gpu_uuid, {})
            counts[code] = counts.get(code, 0) + (0 if "count" in e.details else 1)
    return found


@pytest.mark.parametrize(("interval_s", "kernel_log"), [(10.0, True), (60.0, True), (10.0, False)])
def test_the_dbe_gpu_counts_one_48_and_ends_at_nvidias_action(interval_s: float, kernel_log: bool) -> None:
    fleet, events = replay(interval_s=interval_s, kernel_log=kernel_log)
    dbe = fleet.nodes[0].gpus[DBE_GPU].uuid
    counts = xids_by_gpu(events)
    assert counts[dbe] == {48: 1, 45: 1}, counts[dbe]
    others = {uuid: c for uuid, c in counts.items() if uuid != dbe}
    assert len(others) == 7
    assert all(c == {45: 1} for c in others.values()), others

    # The scorer's reading of what was published for the DBE GPU.
    mine = [e for e in events if e.gpu_uuid == dbe and e.kind is EventKind.XID]
    now = max(e.time for e in mine)
    xids: dict[int, XidValue] = {}
    history: dict[int, tuple[XidEvent, ...]] = {}
    for e in sorted(mine, key=lambda e: e.time):
        code = int(str(e.details["xid"]))
        before = xid_counts(xids.get(code, XidCounts(0, 0, 0, ())))
        xids[code] = XidCounts(before.recent + 1, before.total + 1, (before.in_repeat_window or 0) + 1,
                               (e.time.isoformat(), *before.times))  # fmt: skip
        message = e.details.get("kernel_message")
        history[code] = (
            XidEvent(e.time, e.source.value, str(message) if message else None),
            *history.get(code, ()),
        )
    gpu = replace(HEALTHY, gpu_uuid=dbe, xids=xids, xid_events=history, last_time=now)
    verdict = evaluate(gpu, RULES, now)["xid"]
    assert (verdict.rule, verdict.action) == (
        "xid_48",
        "reset_gpu",
    )  # NVIDIA: WORKFLOW_XID_48 solo, RESET_GPU
    assert judge(RULES.xid[45], gpu, RULES, now).evidence["follows"] == [48]
