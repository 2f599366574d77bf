"""The chain check of /gpus/{uuid}/verifications: a fork is one break, whatever order its records come in."""

from __future__ import annotations

from typing import Any

import pytest

from services.api.routes.verification import chain_breaks


def rec(seq: int, sha: str, prev: str) -> dict[str, Any]:
    return {"seq": seq, "sha256": sha, "prev_sha256": prev}


CHAIN = [rec(0, "a", "0"), rec(1, "b", "a"), rec(2, "c", "b"), rec(3, "d", "c")]


def test_an_intact_chain_has_no_break() -> None:
    assert chain_breaks(CHAIN) == []


@pytest.mark.parametrize("forged_first", [True, False])
def test_a_forged_copy_of_one_record_is_one_break_in_any_order(forged_first: bool) -> None:
    forged = rec(1, "f", "a")  # same place in the chain, other content: the record after still links
    pair = [forged, CHAIN[1]] if forged_first else [CHAIN[1], forged]
    records = [CHAIN[0], *pair, *CHAIN[2:]]  # as the route sorts them: by seq, then time (equal here)
    assert chain_breaks(records) == [
        {"seq": 1, "reason": "two records with the same seq (a fork or a forgery)"}
    ]


def test_an_edited_record_breaks_the_link_of_the_next() -> None:
    edited = [CHAIN[0], rec(1, "e", "a"), CHAIN[2], CHAIN[3]]
    assert chain_breaks(edited) == [{"seq": 2, "reason": "prev_sha256 does not match the previous record"}]


def test_a_gap_is_not_a_broken_link_between_the_records_returned() -> None:
    assert chain_breaks([CHAIN[0], CHAIN[2]]) == []
