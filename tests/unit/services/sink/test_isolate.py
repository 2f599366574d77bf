"""split_refused: every record the database takes is stored once, every one it refuses stands alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.sink.isolate import split_refused
from shared.plumbing.errors import DataRefusedError


@given(refused=st.lists(st.booleans(), max_size=64))
def test_each_good_record_is_stored_once_and_each_bad_one_is_named_alone(refused: list[bool]) -> None:
    items = list(enumerate(refused))  # (position, whether the database refuses it)
    stored: list[int] = []
    tries = 0

    def store_part(part: list[tuple[int, bool]]) -> DataRefusedError | None:
        nonlocal tries
        tries += 1
        if any(bad for _, bad in part):
            return DataRefusedError(f"refused in a part of {len(part)}")  # whole or nothing
        stored.extend(i for i, _ in part)
        return None

    found = split_refused(items, store_part)
    assert sorted(stored) == [i for i, bad in items if not bad]
    assert [item for item, _ in found] == [item for item in items if item[1]]  # in batch order
    assert all(str(fault) == "refused in a part of 1" for _, fault in found)
    bad = sum(refused)
    assert tries <= 1 + 2 * bad * max(1, len(items)).bit_length()  # halving: about k log n tries
