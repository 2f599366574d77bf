"""sparkline(): one block per value, ordered like the values, blanks for what is missing."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpuhealth.training import sparkline
from gpuhealth.training.sparkline import BLOCKS, MISSING

anything = st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**20), 10**20)
)


def known(v: float | int | None) -> bool:
    return v is not None and math.isfinite(v)


@given(st.lists(anything, max_size=60))
def test_one_character_per_value_blanks_where_unknown(values: list[float | int | None]) -> None:
    line = sparkline(values)
    assert len(line) == len(values)
    for v, ch in zip(values, line, strict=True):
        assert (ch == MISSING) == (not known(v))
        assert ch == MISSING or ch in BLOCKS


@given(st.lists(st.one_of(st.none(), st.floats(min_value=-1e300, max_value=1e300)), max_size=60))
@example([0.0, 5e-324])  # a span of the tiniest numbers, which halving rounded down to nothing
@example([-1.7e308, 0.0, 1.7e308])  # a span that overflows a float
def test_higher_values_never_get_lower_blocks(values: list[float | None]) -> None:
    line = sparkline(values)
    pairs = [(v, BLOCKS.index(ch)) for v, ch in zip(values, line, strict=True) if v is not None]
    for a, level_a in pairs:
        for b, level_b in pairs:
            if a < b:
                assert level_a <= level_b
    if pairs and len({v for v, _ in pairs}) > 1:  # its own range: lowest at the bottom, highest at the top
        assert min(level for _, level in pairs) == 0
        assert max(level for _, level in pairs) == len(BLOCKS) - 1


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6), max_size=40), st.integers(min_value=0, max_value=50)
)
def test_width_keeps_the_most_recent_values(values: list[float], width: int) -> None:
    line = sparkline(values, width=width, lo=-1e6, hi=1e6)
    assert len(line) == min(width, len(values))
    assert line == sparkline(values, lo=-1e6, hi=1e6)[len(values) - len(line) :]


@given(st.lists(st.floats(min_value=-500, max_value=500), min_size=1, max_size=40))
def test_a_fixed_scale_clamps_what_lies_outside(values: list[float]) -> None:
    line = sparkline(values, lo=0, hi=100)
    for v, ch in zip(values, line, strict=True):
        if v <= 0:
            assert ch == BLOCKS[0]
        if v >= 100:
            assert ch == BLOCKS[-1]


def test_examples() -> None:
    assert sparkline([]) == ""
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == BLOCKS
    assert sparkline([5, 5, 5]) == BLOCKS[0] * 3
    assert sparkline([0, None, float("nan"), 100], lo=0, hi=100) == f"{BLOCKS[0]}  {BLOCKS[-1]}"
    assert sparkline([None, None]) == "  "
    with pytest.raises(ValueError, match="width"):
        sparkline([1], width=-1)
    with pytest.raises(ValueError, match="hi"):
        sparkline([1], lo=2, hi=1)
    with pytest.raises(ValueError, match="finite"):
        sparkline([1], lo=float("nan"))
