"""The remediator through the API: its plans listed by state, one plan's record, its pause and breaker;
approving, pausing, resuming and resetting need an admin (each recorded under the token's subject)
and reach the database only through its functions."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from services.api import cli
from services.remediator.decide import decide
from services.remediator.findings import NodeMap
from services.remediator.policy import load_policy
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import ADMIN, OPERATOR, VIEWER, token_args
from tests.helpers.remediation import add_fleet, plans_in_every_state, rows, verdict_finding


def plans_for(db: DatabaseSettings) -> None:
    """Two plans: a GPU reset that runs on its own, a reboot that waits for approval (the policy's)."""
    add_fleet(db, 40)
    policy = load_policy()
    with connect(db) as conn:
        for finding in (verdict_finding(0), verdict_finding(1, action="reboot_node")):
            decide(conn, finding, policy=policy, nodes=NodeMap(), dry_run=False, now=datetime.now(UTC))
            conn.commit()


def test_plans_are_listed_by_state_and_shown_with_their_record(
    served_api: str, migrated: DatabaseSettings
) -> None:
    plans_for(migrated)
    listed = VIEWER.get(f"{served_api}/api/v1/remediations").json()
    assert [(p["id"], p["state"], p["held_for"]) for p in listed["remediations"]] == [
        (2, "held", "approval"), (1, "running", None),
    ]  # fmt: skip
    pending = VIEWER.get(
        f"{served_api}/api/v1/remediations", params={"state": "pending", "mode": "live"}
    ).json()
    assert [p["id"] for p in pending["remediations"]] == [2]
    assert VIEWER.get(f"{served_api}/api/v1/remediations", params={"mode": "dry_run"}).json()["total"] == 0
    first = VIEWER.get(f"{served_api}/api/v1/remediations", params={"limit": 1}).json()
    second = VIEWER.get(
        f"{served_api}/api/v1/remediations", params={"limit": 1, "cursor": first["next_cursor"]}
    )
    assert [p["id"] for p in second.json()["remediations"]] == [1]
    detail = VIEWER.get(f"{served_api}/api/v1/remediations/1").json()
    assert detail["steps"] == ["cordon", "drain", "reset_gpu", "validate", "return"]
    assert [(e["kind"], e["status"]) for e in detail["events"]] == [("decision", "act")]
    assert detail["decision_key"].startswith("gpu-health/")
    assert VIEWER.get(f"{served_api}/api/v1/remediations/99").status_code == 404
    refused = VIEWER.get(f"{served_api}/api/v1/remediations", params={"state": "everything; DROP TABLE x"})
    assert refused.status_code == 422


def test_approving_needs_an_admin_and_a_pending_plan(served_api: str, migrated: DatabaseSettings) -> None:
    plans_for(migrated)
    url = f"{served_api}/api/v1/remediations/2/approve"
    assert httpx.post(url, json={"by": "oncall"}).status_code == 401
    assert httpx.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert VIEWER.post(url).status_code == 403
    assert OPERATOR.post(url).status_code == 403
    approved = ADMIN.post(url, json={"by": "someone-else"})  # the body's `by` is ignored
    assert approved.status_code == 200, approved.text
    assert (approved.json()["state"], approved.json()["approved_by"]) == ("running", "local-admin")
    again = ADMIN.post(url)
    assert (again.status_code, again.json()["detail"]) == (409, "remediation 2 is running, not pending")
    assert ADMIN.post(f"{served_api}/api/v1/remediations/99/approve").status_code == 404
    assert rows(migrated, "SELECT kind, status, response FROM remediation_events WHERE remediation_id = 2"
                " AND kind = 'control'") == [("control", "approved", {"by": "local-admin"})]  # fmt: skip


def test_the_remediator_is_paused_resumed_and_its_breaker_reset_by_an_admin(
    served_api: str, migrated: DatabaseSettings
) -> None:
    state = VIEWER.get(f"{served_api}/api/v1/remediator").json()
    assert [(m["dry_run"], m["paused"], m["breaker"]) for m in state["modes"]] == [
        (False, False, "closed"), (True, False, "closed"),
    ]  # fmt: skip
    assert httpx.post(f"{served_api}/api/v1/remediator/pause").status_code == 401
    for role in (VIEWER, OPERATOR):
        for what in ("pause", "resume", "reset-breaker"):
            assert role.post(f"{served_api}/api/v1/remediator/{what}").status_code == 403, (role.role, what)
    paused = ADMIN.post(f"{served_api}/api/v1/remediator/pause", json={"by": "oncall"}).json()
    assert {(m["paused"], m["paused_by"]) for m in paused["modes"]} == {(True, "local-admin")}
    with connect(migrated) as conn:
        conn.execute("UPDATE remediation_control SET breaker = 'open', tripped_at = now(), trip_reason = 't'")
        conn.commit()
    assert {m["breaker"] for m in VIEWER.get(f"{served_api}/api/v1/remediator").json()["modes"]} == {"open"}
    reset = ADMIN.post(f"{served_api}/api/v1/remediator/reset-breaker").json()
    assert {(m["breaker"], m["reset_by"]) for m in reset["modes"]} == {("closed", "local-admin")}
    resumed = ADMIN.post(f"{served_api}/api/v1/remediator/resume").json()
    assert {m["paused"] for m in resumed["modes"]} == {False}
    controls = rows(migrated, "SELECT status FROM remediation_events WHERE kind = 'control' ORDER BY time")
    assert [s for (s,) in controls] == ["paused", "reset", "resumed"]


def test_the_cli_lists_approves_and_operates_with_an_admins_token_file(
    served_api: str, migrated: DatabaseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    plans_for(migrated)
    assert cli.main([*token_args("viewer"), "--url", served_api, "remediations", "--state", "pending"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == "1 pending remediation(s)"
    assert listed[1].split()[:5] == ["#2", "held", "(approval)", "gpu-node-01", "reboot_node"]
    assert cli.main([*token_args("operator"), "--url", served_api, "approve", "2"]) == 2  # not an admin
    assert "403" in capsys.readouterr().err
    assert cli.main([*token_args("admin"), "--url", served_api, "approve", "2"]) == 0
    assert (
        capsys.readouterr().out.strip()
        == "remediation #2 (reboot_node on gpu-node-01) approved by local-admin"
    )
    assert cli.main([*token_args("admin"), "--url", served_api, "pause"]) == 0
    status = capsys.readouterr().out.splitlines()
    assert status == [
        "live     paused by local-admin    breaker closed",
        "dry run  paused by local-admin    breaker closed",
    ]
    assert cli.main([*token_args("admin"), "--url", served_api, "resume"]) == 0
    assert "paused" not in capsys.readouterr().out


def test_pending_running_and_failed_plans_and_an_open_breaker_show_in_the_api_and_the_cli(
    served_api: str, migrated: DatabaseSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    plans_in_every_state(migrated, load_policy())
    for state, expected in (("pending", [2]), ("running", [1]), ("failed", [3]), ("all", [3, 2, 1])):
        listed = VIEWER.get(f"{served_api}/api/v1/remediations", params={"state": state}).json()
        assert [p["id"] for p in listed["remediations"]] == expected, state
    modes = VIEWER.get(f"{served_api}/api/v1/remediator").json()["modes"]
    assert [(m["dry_run"], m["breaker"], m["trip_reason"]) for m in modes] == [
        (False, "open", "4 nodes taken out within 900 s (at most 4)"), (True, "closed", None),
    ]  # fmt: skip
    assert cli.main([*token_args("viewer"), "--url", served_api, "remediations", "--state", "failed"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == "1 failed remediation(s)"
    assert listed[1].split()[:4] == ["#3", "failed", "gpu-node-02", "reset_gpu"]
    assert cli.main([*token_args("viewer"), "--url", served_api, "remediator"]) == 0
    live, dry = capsys.readouterr().out.splitlines()
    assert live.startswith("live ")
    assert "breaker OPEN since " in live
    assert live.endswith(": 4 nodes taken out within 900 s (at most 4)")
    assert dry.endswith("breaker closed")
