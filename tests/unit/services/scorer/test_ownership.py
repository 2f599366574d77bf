"""A scorer's share of the fleet: the GPUs keyed to its gpu-events partitions; each GPU in one share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.scorer.ownership import Ownership, Share
from shared.plumbing.kafka import key_partition

gpu_ids = st.lists(st.uuids().map(lambda u: f"GPU-{u}"), max_size=60, unique=True)


@given(
    gpus=gpu_ids,
    count=st.integers(1, 64),
    members=st.integers(1, 8),
    data=st.data(),
)
def test_shares_that_split_the_partitions_split_the_fleet(
    gpus: list[str], count: int, members: int, data: st.DataObject
) -> None:
    # However the group spreads the partitions over its members, every GPU is judged by exactly one.
    member_of = data.draw(st.lists(st.integers(0, members - 1), min_size=count, max_size=count))
    shares = [Share(frozenset(p for p in range(count) if member_of[p] == m), count) for m in range(members)]
    for g in gpus:
        holders = [s for s in shares if s.owns(g)]
        assert len(holders) == 1
        assert key_partition(g, count) in holders[0].partitions
    assert sorted(g for s in shares for g in s.select(gpus)) == sorted(gpus)


@given(gpus=gpu_ids)
def test_everything_owns_every_gpu_and_nothing_owns_none(gpus: list[str]) -> None:
    assert Share(everything=True).select(gpus) == gpus
    assert Share().select(gpus) == []


def test_assignments_and_revocations_move_the_share_and_say_so() -> None:
    own = Ownership()
    assert not own.changed.is_set()
    own.assigned([0, 2], 6)
    assert own.share == Share(frozenset({0, 2}), 6)
    assert own.changed.is_set()
    own.changed.clear()
    own.assigned([5], 6)
    own.revoked([0, 3])
    assert own.share == Share(frozenset({2, 5}), 6)
    assert own.changed.is_set()
    assert own.generation == 3
    assert Ownership(everything=True).share.everything
