"""The fleet bench's samples: what it produces is a sample the contract takes, for any GPU and time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_fleet import GPUS_PER_HOST, HOSTS_PER_RACK, TEMPLATES, render, templates
from gpuhealth.contract.wire_time import wire_time
from shared.contract.models import parse_sample
from shared.fakes.samples import gpu_uuid

TEMPLATE_SET = templates()


@settings(max_examples=200, deadline=None)
@given(
    g=st.integers(min_value=0, max_value=10_000_000),
    ago_ms=st.integers(min_value=-60_000, max_value=3_600_000),  # what the contract takes as a sample time
)
def test_a_rendered_sample_is_the_gpus_own_at_that_time(g: int, ago_ms: int) -> None:
    now = datetime.now(UTC)
    at = now.replace(microsecond=now.microsecond // 1000 * 1000) - timedelta(milliseconds=ago_ms)
    raw = render(TEMPLATE_SET[g % TEMPLATES], wire_time(at).encode(), gpu_uuid(g).encode(), g)
    parsed = parse_sample(raw)
    assert (parsed.gpu_uuid, parsed.time) == (gpu_uuid(g), at)
    assert parsed.hostname == f"node-{g // GPUS_PER_HOST}"
    assert parsed.rack == f"r{g // (GPUS_PER_HOST * HOSTS_PER_RACK)}"


def test_every_template_carries_every_field_once() -> None:
    assert len(TEMPLATE_SET) == TEMPLATES
    for pieces, order in TEMPLATE_SET:
        assert sorted(order) == [0, 1, 2, 3]
        assert len(pieces) == len(order) + 1
    at = datetime.now(UTC).replace(microsecond=5000)
    assert (
        parse_sample(render(TEMPLATE_SET[7], wire_time(at).encode(), gpu_uuid(7).encode(), 7)).gpu_index == 7
    )
