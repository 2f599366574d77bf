"""The cap beside the breaker, on the real database: the nodes the remediator holds out (its plans past their
cordon, its own cordons, the nodes its plans left out for a person) never exceed it, however slowly they go
out; the plan of one more node waits, held for `nodes_out`, and the breaker does not trip."""

from __future__ import annotations

from collections.abc import Callable

from services.remediator.policy import Breaker, NodesOut
from shared.plumbing.db import connect
from shared.store import remediation_ledger as ledger
from tests.helpers.remediation import Remediator, add_fleet, decide_all, returned, rows, verdict_finding


def test_the_cap_holds_the_next_node_and_trips_nothing(remediator_factory: Callable[..., Remediator]) -> None:
    cap = NodesOut(max_nodes=2, max_fleet_percent=100)
    r = remediator_factory(dry_run=True, policy_changes={"nodes_out": cap})
    add_fleet(r.db, 40)  # the breaker's bound: 4 nodes within its window; the cap: 2 nodes at once
    for node in range(3):  # one at a time, as slowly as the plans go: no window ever holds more than one
        decide_all(r, [verdict_finding(node, action="inspect")], dry_run=True)
        r.run_until_settled()
    plans = rows(r.db, "SELECT node, state, held_for FROM remediations ORDER BY id")
    assert plans == [
        ("gpu-node-00", "done", None),  # cordoned and kept out for a person
        ("gpu-node-01", "done", None),
        ("gpu-node-02", "held", "nodes_out"),
    ]
    assert rows(r.db, "SELECT breaker FROM remediation_control WHERE dry_run") == [("closed",)]
    (why,) = rows(r.db, "SELECT reason FROM remediation_events WHERE kind = 'action' AND status = 'held'")
    assert why[0] == (
        "not taken out: 2 nodes held out by the remediator: the cap is 2 (at most 2 nodes or 100 % of 40)"
    )
    with connect(r.db) as conn:
        assert ledger.nodes_held_out(conn, True) == {"gpu-node-00", "gpu-node-01"}
        assert ledger.nodes_held_out(conn, False) == set()  # the live mode holds its own count


def test_a_node_returned_frees_its_room(remediator_factory: Callable[..., Remediator]) -> None:
    """A node validated and returned is no longer out; one kept out for a person still is."""
    cap = NodesOut(max_nodes=1, max_fleet_percent=100)
    breaker = Breaker(max_nodes=10, max_fleet_percent=100, window_s=900)  # room: the cap is what binds
    r = remediator_factory(dry_run=True, policy_changes={"nodes_out": cap, "breaker": breaker})
    add_fleet(r.db, 3)
    decide_all(r, [verdict_finding(0, action="run_diagnostics")], dry_run=True)
    r.run_until_settled()
    returned(r, "gpu-node-00")  # its GPUs seen again and healthy cycles: validated, returned
    for node in (1, 2):
        decide_all(r, [verdict_finding(node, action="inspect")], dry_run=True)
        r.run_until_settled()
    assert rows(r.db, "SELECT node, action, state, held_for FROM remediations ORDER BY id") == [
        ("gpu-node-00", "run_diagnostics", "done", None),  # validated and returned
        ("gpu-node-01", "inspect", "done", None),  # kept out for a person: it holds the one place
        ("gpu-node-02", "inspect", "held", "nodes_out"),
    ]
