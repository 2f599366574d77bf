"""bench_collector_cost's arithmetic: the RSS trend it calls flat or growing, and what it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.bench_collector_cost import main, slope

finite = st.floats(-1e3, 1e3, allow_nan=False)


@given(a=finite, b=finite, xs=st.lists(st.floats(0, 3600), min_size=2, max_size=50, unique=True))
def test_the_trend_of_points_on_a_line_is_its_slope(a: float, b: float, xs: list[float]) -> None:
    if max(xs) - min(xs) < 1:
        return  # too close together to fit a slope to in floating point
    assert slope(xs, [a + b * x for x in xs]) == pytest.approx(b, abs=1e-6)


def test_a_single_point_or_points_at_one_time_have_no_trend() -> None:
    assert slope([5.0], [80.0]) == 0.0
    assert slope([5.0, 5.0], [80.0, 90.0]) == 0.0


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--sources", "mock,dcgm"], "unknown sources ['dcgm']"),
        (["--sources", "mock", "--ports", "1,2,3,4"], "--ports takes 3 ports"),
    ],
)
def test_a_source_or_ports_it_cannot_use_are_refused_by_name(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    assert said in capsys.readouterr().err
