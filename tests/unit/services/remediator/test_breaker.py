"""The breaker's rule over any sequence of attempts, resets and timings: never more nodes than the bound
within a window, nothing admitted while open, and no trip while there is room."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from services.remediator.breaker import judge

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
