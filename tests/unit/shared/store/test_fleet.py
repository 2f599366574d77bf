"""shared.store.fleet without a database: the GPU list's sort keys are the only text composed into its SQL."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.store.fleet import SORTS, GpuFilters, gpu_list_params, gpu_list_statements


def test_every_sort_key_orders_the_page_and_ties_break_by_uuid() -> None:
    for sort, order in SORTS.items():
        count, page = gpu_list_statements(sort)
        text = page.as_string(None)
        assert f"ORDER BY {order}, a.gpu_uuid LIMIT %(limit)s OFFSET %(offset)s" in text
        assert count.startswith("SELECT count(*) AS n")
        assert "ORDER BY" not in count


@given(st.text(max_size=60).filter(lambda s: s not in SORTS))
def test_a_sort_key_not_listed_is_refused_not_composed(sort: str) -> None:
    with pytest.raises(KeyError):
        gpu_list_statements(sort)


@given(st.text(max_size=30), st.integers(1, 1000), st.integers(0, 10**6))
def test_filters_are_bound_values(host: str, limit: int, offset: int) -> None:
    params = gpu_list_params(GpuFilters(host=host), limit=limit, offset=offset)
    assert params == {
        "cluster": None,
        "datacenter": None,
        "rack": None,
        "host": host,
        "model": None,
        "state": None,
        "limit": limit,
        "offset": offset,
    }


def test_the_composed_page_is_a_psycopg_composition() -> None:
    assert isinstance(gpu_list_statements("-power")[1], psycopg.sql.Composed)
