"""What the drivers write in the schedulers: a taint value Kubernetes takes, a reason Slurm keeps as ours."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.remediator.drivers.kubernetes import taint_value
from services.remediator.drivers.slurm import REASON_PREFIX, reason_for

LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@given(st.text(max_size=300))
def test_any_finding_makes_a_valid_taint_value(finding: str) -> None:
    assert LABEL_VALUE.match(taint_value(finding))


def test_a_plain_finding_is_kept() -> None:
    assert taint_value("xid_79") == "xid_79"
    assert taint_value("memory:dbe") == "memory-dbe"


@given(st.text(max_size=300), st.integers(1, 2**62))
def test_the_slurm_reason_is_marked_and_safe_for_a_command_line(finding: str, plan: int) -> None:
    reason = reason_for(finding, plan)
    assert reason.startswith(REASON_PREFIX + " ")
    assert reason.endswith(f"(remediation {plan})")
    assert re.match(r"^[A-Za-z0-9_.:/ ()-]+$", reason)
