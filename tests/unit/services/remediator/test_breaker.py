"""The breaker's rule over any sequence of attempts, resets and timings: never more nodes than the bound
within a window, nothing admitted while open, and no trip while there is room; and the cap beside it:
never more nodes held out at once than the cap, however slowly they go out."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from services.remediator.breaker import judge, within_cap
from services.remediator.policy import load_policy

WINDOW = 100.0


@dataclass
class Model:
    """The state admit_node keeps in the database, in memory: admissions (time, node) and the open flag."""

    bound: int
    admitted: list[tuple[float, str]] = field(default_factory=list)
    is_open: bool = False

    def in_window(self, now: float) -> set[str]:
        return {node for at, node in self.admitted if at > now - WINDOW}

    def attempt(self, now: float, node: str) -> str:
        in_window = self.in_window(now)
        answer = judge(is_open=self.is_open, in_window=in_window, node=node, bound=self.bound)
        if answer == "trip":
            self.is_open = True
        elif answer == "admit" and node not in in_window:
            self.admitted.append((now, node))
        return answer


events = st.lists(
    st.tuples(
        st.floats(0, 60, allow_nan=False),  # time since the previous event
        st.one_of(st.sampled_from([f"node-{i}" for i in range(30)]), st.just("RESET")),
    ),
    max_size=200,
)


@given(bound=st.integers(1, 12), sequence=events)
def test_no_window_ever_holds_more_nodes_than_the_bound(
    bound: int, sequence: list[tuple[float, str]]
) -> None:
    model, now = Model(bound), 0.0
    for gap, node in sequence:
        now += gap
        if node == "RESET":
            model.is_open = False
            continue
        was_open, in_window = model.is_open, model.in_window(now)
        answer = model.attempt(now, node)
        if was_open:
            assert answer == "refuse"  # open: nothing is admitted until an operator resets it
        elif answer == "trip":
            assert len(in_window) == bound  # a trip only when the window is full,
            assert node not in in_window  # and only for a new node
        else:
            assert answer == "admit"
        # every window that ends at an admission holds at most `bound` distinct nodes
        for end, _ in model.admitted:
            assert len({n for at, n in model.admitted if end - WINDOW < at <= end}) <= bound


@given(bound=st.integers(1, 12), nodes=st.integers(1, 1000))
def test_a_mass_failure_takes_out_exactly_the_bound(bound: int, nodes: int) -> None:
    model = Model(bound)
    answers = [model.attempt(0.0, f"node-{i}") for i in range(nodes)]
    taken = min(bound, nodes)
    assert answers[:taken] == ["admit"] * taken
    assert answers[taken : taken + 1] == (["trip"] if nodes > bound else [])
    assert set(answers[taken + 1 :]) <= {"refuse"}


def test_a_node_already_out_is_no_new_node() -> None:
    model = Model(1)
    assert model.attempt(0, "a") == "admit"
    assert model.attempt(1, "a") == "admit"  # its drain after its cordon
    assert model.attempt(2, "b") == "trip"
    assert model.attempt(3, "a") == "refuse"


def test_the_window_slides() -> None:
    model = Model(1)
    assert model.attempt(0, "a") == "admit"
    assert model.attempt(WINDOW + 1, "b") == "admit"  # a's admission has left the window


@dataclass
class Fleet:
    """The breaker and the cap together, as admit_node applies them: the cap first, then the window."""

    breaker: Model
    cap: int
    out: set[str] = field(default_factory=set)  # the nodes the remediator holds out

    def take_out(self, now: float, node: str) -> str:
        if not within_cap(held_out=self.out, node=node, cap=self.cap):
            return "cap"
        answer = self.breaker.attempt(now, node)
        if answer == "admit":
            self.out.add(node)
        return answer


def test_the_issues_slow_drip_trips_no_breaker_but_stops_at_the_cap() -> None:
    """One new node every 91 s: the breaker (10 nodes within 900 s) never trips; before the cap, 950 nodes
    were out within a day. With the committed cap (20 nodes or 10 % of the fleet) no more than 20 are."""
    policy = load_policy()
    window = policy.breaker.window_s
    fleet = Fleet(Model(policy.breaker.bound(10_000)), cap=policy.nodes_out.bound(10_000))
    answers = []
    for i in range(950):
        now = i * 91.0
        fleet.breaker.admitted = [(at, n) for at, n in fleet.breaker.admitted if at > now - window]
        answers.append(fleet.take_out(now, f"node-{i}"))
    assert "trip" not in answers
    assert answers.count("admit") == len(fleet.out) == 20
    assert set(answers[20:]) == {"cap"}


@given(
    cap=st.integers(1, 15),
    sequence=st.lists(
        st.tuples(st.sampled_from(["out", "back"]), st.sampled_from([f"node-{i}" for i in range(40)])),
        max_size=300,
    ),
)
def test_the_nodes_held_out_never_exceed_the_cap(cap: int, sequence: list[tuple[str, str]]) -> None:
    fleet = Fleet(Model(bound=1_000), cap=cap)
    for step, (what, node) in enumerate(sequence):
        if what == "back":
            fleet.out.discard(node)  # validated and returned, or an operator took it
            continue
        before = set(fleet.out)
        answer = fleet.take_out(float(step) * 1_000, node)
        assert len(fleet.out) <= cap
        if node in before:
            assert answer == "admit"  # a node already out is no new node (its drain after its cordon)
        elif answer == "cap":
            assert len(before) == cap  # held only when the cap is reached
