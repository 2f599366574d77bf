"""NVIDIA's workflow XIDs judged from what accompanies them: repeats, companions, remaps, decoded messages."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scorer.features import XidCounts, XidEvent
from services.scorer.rules import Verdict, evaluate
from services.scorer.workflows import judge
from tests.helpers.scorer import HEALTHY, NOW, RULES

BLACKWELL = replace(HEALTHY, model="NVIDIA B200", driver_version="570.124.06")


def at(seconds_ago: float) -> Any:
    return NOW - timedelta(seconds=seconds_ago)


def seen(*occurrences: tuple[int, float, str | None], source: str = "kmsg", gpu: Any = HEALTHY) -> Any:
    """A GPU whose XIDs are `(code, seconds ago, kernel message)`, counted and listed as read."""
    xids: dict[int, XidCounts] = {}
    events: dict[int, tuple[XidEvent, ...]] = {}
    for code, ago, message in sorted(occurrences, key=lambda o: o[1]):
        before = xids.get(code, XidCounts(0, 0, 0, ()))
        stamp = at(ago).isoformat()
        xids[code] = XidCounts(before.recent + 1, before.total + 1, (before.in_repeat_window or 0) + 1,
                               (*before.times, stamp))  # fmt: skip
        if code in RULES.xid and RULES.xid[code].workflow:
            events[code] = (*events.get(code, ()), XidEvent(at(ago), source, message))
    return replace(gpu, xids=xids, xid_events=events)


def xid(gpu: Any) -> Verdict:
    return evaluate(gpu, RULES, NOW)["xid"]


def test_45_alone_restarts_the_job_and_after_another_xid_follows_it() -> None:
    alone = xid(seen((45, 60, "pid=1, name=python, Ch 00000008")))
    assert (alone.state, alone.rule, alone.action) == ("degraded", "xid_45", "restart_workload")
    after_13 = xid(seen((13, 61, "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address"),
                        (45, 60, "pid=1, name=python, Ch 00000008")))  # fmt: skip
    assert (after_13.rule, after_13.action) == ("xid_13", "restart_workload")  # the 45 is no finding
    followed = judge(RULES.xid[45], seen((13, 61, None), (45, 60, None)), RULES, NOW)
    assert (followed.state, followed.action, followed.evidence["follows"]) == ("info", "none", [13])
    later = judge(RULES.xid[45], seen((13, 3000, None), (45, 60, None)), RULES, NOW)  # two separate stories
    assert (later.state, later.action, later.evidence["solo"]) == ("degraded", "restart_workload", 1)


def test_a_dbe_then_a_successful_or_a_failed_row_remap() -> None:
    solo = xid(seen((48, 60, None)))
    assert (solo.state, solo.action, solo.evidence["then"]) == ("unhealthy", "reset_gpu", "run_diagnostics")
    remapped = xid(seen((48, 60, None), (63, 59, None)))
    assert (remapped.action, remapped.evidence["with_xids"]) == ("reset_gpu", [63])
    assert "remapped" in remapped.evidence["workflow"]
    failed = xid(seen((48, 60, None), (64, 59, None)))
    assert (failed.state, failed.rule, failed.action) == ("unhealthy", "xid_48", "send_for_repair")
    flagged = xid(replace(seen((48, 60, None)), remap_failure=1))  # NVML's remap-failure flag, no XID 64
    assert flagged.action == "send_for_repair"
    sram = xid(seen((48, 60, None), (172, 60, None)))
    assert sram.evidence["memory"] == "SRAM"


WARP = "Graphics SM Warp Exception on (GPC {g}, TPC {t}, SM 0): Out Of Range Address"
GLOBAL = "Graphics SM Global Exception on (GPC {g}, TPC {t}, SM 0): Multiple Warp Errors"


def test_13_repeating_at_one_gpc_and_tpc_is_the_hardware_at_different_places_the_application() -> None:
    limit = RULES.xid_repeats.count
    # each fault logs two lines a moment apart: they count once
    same = [
        (13, 600.0 * k + d, (WARP if d else GLOBAL).format(g=3, t=1))
        for k in range(limit + 1)
        for d in (0, 0.2)
    ]
    hardware = xid(seen(*same))
    assert (hardware.state, hardware.action) == ("unhealthy", "run_diagnostics")
    assert hardware.evidence["occurrences_in_repeat_window"] == limit + 1
    assert hardware.evidence["repeated_at"] == "GPC 3, TPC 1"
    spread = [(13, 600.0 * k, WARP.format(g=k, t=k)) for k in range(limit + 1)]
    app = xid(seen(*spread))
    assert (app.state, app.action) == ("degraded", "restart_workload")
    assert len(app.evidence["locations"]) == limit + 1
    few = xid(seen(*same[: 2 * limit]))
    assert few.action == "restart_workload"
    blind = xid(seen(*[(13, 600.0 * k, None) for k in range(limit + 1)], source="dcgm"))
    assert blind.action == "run_diagnostics"
    assert blind.evidence["decode"].startswith("not possible")


def test_31_repeating_on_one_gpu_asks_for_diagnostics() -> None:
    limit = RULES.xid_repeats.count
    assert xid(seen(*[(31, 900.0 * k, None) for k in range(limit)])).action == "restart_workload"
    assert xid(seen(*[(31, 900.0 * k, None) for k in range(limit + 1)])).action == "run_diagnostics"


LINK_DOWN_V1 = (
    "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000)"
)
LINK_DOWN_V2 = "NETIR_LINK_DOWN Fatal XC0 i0 Link 09 (0x02500011 0x00000000 0x00000000 0x00000000 0x00000000)"
BER_V1 = "NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000)"
SRC_TRACK_V1 = "RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000 0x00000000)"


def test_nvlink5_xids_are_decoded_for_both_driver_generations() -> None:
    old = xid(seen((149, 30, LINK_DOWN_V1), gpu=BLACKWELL))
    assert (old.state, old.action) == ("unhealthy", "reset_gpu")
    decoded = old.evidence["decoded"][0]
    assert (decoded["generation"], decoded["subcode"], decoded["link"]) == (
        "v1 (before R575)", "NETIR_LINK_EVT/NETIR_LINK_DOWN", 9)  # fmt: skip
    assert decoded["nvidia_investigation"] == "INVESTIGATE_PEER_DEVICE"
    assert "not_decoded" not in old.evidence
    new = xid(seen((149, 30, LINK_DOWN_V2), gpu=replace(BLACKWELL, driver_version="580.65.06")))
    assert new.evidence["decoded"][0]["generation"] == "v2 (R575 and later)"
    assert new.action == "reset_gpu"
    # the sub-unit's V1 name says the message is V1's, whatever the inventory's driver says
    named = xid(seen((149, 30, LINK_DOWN_V1), gpu=replace(BLACKWELL, driver_version="580.65.06")))
    assert named.evidence["decoded"][0]["generation"] == "v1 (before R575)"
    # a V1 message whose name both generations write, on a driver that writes V2, does not match:
    # not decoded, so the safe action
    saw_v1 = "SAW_MVB Fatal XC0 i0 Link 00 (0x00000021 0x00000002 0x00000000)"
    wrong = xid(seen((144, 30, saw_v1), gpu=replace(BLACKWELL, driver_version="580.65.06")))
    assert (wrong.action, wrong.evidence["decode"][:12]) == ("reset_gpu", "not possible")
    assert "matches no single row" in wrong.evidence["decode"]


def test_a_non_fatal_nvlink5_event_is_no_finding_and_154_eval_follows_xid_154() -> None:
    assert xid(seen((149, 30, BER_V1), gpu=BLACKWELL)).state == "healthy"
    alone = xid(seen((145, 30, SRC_TRACK_V1), gpu=BLACKWELL))
    assert (alone.state, alone.action) == ("degraded", "restart_workload")  # no XID 154: restart the app
    reboot = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    with_154 = xid(seen((145, 30, SRC_TRACK_V1), (154, 29.6, reboot), gpu=BLACKWELL))
    assert (with_154.state, with_154.action) == ("unhealthy", "reboot_node")


def test_where_only_dcgm_saw_an_nvlink5_xid_the_decode_was_not_possible_and_the_action_is_safe() -> None:
    blind = xid(seen((149, 30, None), source="dcgm", gpu=BLACKWELL))
    assert (blind.state, blind.action) == ("unhealthy", "reset_gpu")
    assert blind.evidence["decode"].startswith("not possible: no kernel log message (seen by dcgm)")
    assert blind.evidence["not_decoded"] == [
        {"time": at(30).isoformat().replace("+00:00", "Z"), "source": "dcgm"}
    ]


@pytest.mark.parametrize(
    ("message", "state", "action"),
    [
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "unhealthy", "reset_gpu"),
        (
            "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            "unhealthy",
            "reboot_node",
        ),
        ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", "degraded", "reset_gpu"),
        ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", "healthy", "none"),
        ("GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", "degraded", "inspect"),
        (None, "unhealthy", "reset_gpu"),
    ],
)
def test_154_takes_the_action_it_names(message: str | None, state: str, action: str) -> None:
    verdict = xid(seen((154, 30, message)))
    assert (verdict.state, verdict.action) == (state, action)


def test_xid_74_by_its_registers() -> None:
    mechanical = "NVLink: fatal error detected on link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
    once = xid(seen((74, 60, mechanical)))
    assert (once.action, once.evidence["then"]) == ("reset_gpu", "check_mechanicals")
    again = xid(seen((74, 7200, mechanical), (74, 60, mechanical)))
    assert again.action == "check_mechanicals"
    ignorable = "NVLink: fatal error detected on link 1(0x40800001, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)"
    assert xid(seen((74, 60, ignorable))).state == "healthy"
    unknown = "NVLink: fatal error detected on link 1(0x0, 0x0, 0x2000, 0x0, 0x0, 0x0, 0x0)"
    assert xid(seen((74, 60, unknown))).action == "inspect"
    blind = xid(seen((74, 60, None), source="dcgm"))
    assert (blind.action, blind.evidence["decode"][:12]) == ("reset_gpu", "not possible")


def test_xid_74s_third_register_bits_16_and_19_repeated_mean_field_diagnostics_not_mechanicals() -> None:
    """NVIDIA: "Bits 16, 19: If seen repeatedly, please run Field Diags and report a bug"."""
    for bits in ("0x10000", "0x80000"):
        third = f"NVLink: fatal error detected on link 14(0x0, 0x0, {bits}, 0x0, 0x0, 0x0, 0x0)"
        once = xid(seen((74, 60, third)))
        assert (once.state, once.action) == ("unhealthy", "reset_gpu")
        assert "then" not in once.evidence
        again = xid(seen((74, 7200, third), (74, 60, third)))
        assert again.action == "run_diagnostics"
        assert "report" in again.evidence
        assert again.evidence["decoded"][0]["bits"] == {
            "repeat_diagnose": [f"reg2.bit{16 if bits == '0x10000' else 19}"]
        }


def test_a_45_that_names_its_cause_follows_it_wherever_its_line_is() -> None:
    named = "pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
    # the cause's line came earlier than the companion window: its verdict stands, the 45 is no finding
    link_down = "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000)"
    earlier = judge(RULES.xid[45], seen((149, 900, link_down), (45, 60, named), gpu=BLACKWELL), RULES, NOW)
    assert (earlier.state, earlier.action, earlier.evidence["caused_by"]) == ("info", "none", [149])
    assert "solo" not in earlier.evidence
    # the cause's line was never seen: the cause's catalogue action, and the evidence says so
    lost = judge(RULES.xid[45], seen((45, 60, named), gpu=BLACKWELL), RULES, NOW)
    assert (lost.state, lost.action) == (RULES.xid[149].severity, RULES.xid[149].action)
    assert (lost.evidence["caused_by"], lost.evidence["cause_not_seen"]) == ([149], [149])
    # the whole verdict: the GPU is reset, not its job restarted
    verdict = xid(seen((45, 60, named), gpu=BLACKWELL))
    assert verdict.action == "reset_gpu"
    dbe = judge(RULES.xid[45], seen((45, 60, "Ch 00000008 caused by previous Xid 48")), RULES, NOW)
    assert dbe.action == "reset_gpu"  # NVIDIA's action for a DBE


def test_an_nvlink5_line_the_table_cannot_decode_takes_the_drivers_own_severity_word() -> None:
    # no row of XID 144 has this errorStatus
    nonfatal = "SAW_MVB Nonfatal XC0 i0 Link 03 (0x00000001 0x00000100 0x00000000)"
    assert xid(seen((144, 30, nonfatal), gpu=BLACKWELL)).state == "healthy"
    judged = judge(RULES.xid[144], seen((144, 30, nonfatal), gpu=BLACKWELL), RULES, NOW)
    assert (judged.state, judged.action) == ("info", "none")
    assert "Nonfatal" in judged.evidence["driver_severity"]["decode"]
    fatal = nonfatal.replace("Nonfatal", "Fatal")
    unsafe = xid(seen((144, 30, fatal), gpu=BLACKWELL))
    assert (unsafe.state, unsafe.action) == ("unhealthy", "reset_gpu")
    assert "matches no single row" in unsafe.evidence["decode"]


def test_a_link_minus_one_line_is_decoded_not_called_unreadable() -> None:
    line = "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    verdict = xid(seen((149, 30, line), gpu=replace(BLACKWELL, driver_version="590.48.01")))
    assert (verdict.state, verdict.action) == ("unhealthy", "reset_gpu")
    (decoded,) = verdict.evidence["decoded"]
    assert (decoded["link"], decoded["subcode"], decoded["severity"]) == (-1, "NETIR/NETIR_INT", "Link Fatal")
    assert "decode" not in verdict.evidence


@settings(max_examples=200)
@given(
    code=st.sampled_from([74, 144, 145, 146, 147, 148, 149, 150, 154]),
    message=st.none() | st.text(max_size=500),
    driver=st.none() | st.sampled_from(["570.86.15", "580.65.06", "garbage"]),
)
def test_any_message_gets_a_verdict_and_an_unread_one_the_safe_action(
    code: int, message: str | None, driver: str | None
) -> None:
    verdict = xid(seen((code, 30, message), gpu=replace(BLACKWELL, driver_version=driver)))
    entry = RULES.xid[code]
    decoded = verdict.evidence.get("decoded") or "recovery_action" in verdict.evidence
    nonfatal = "driver_severity" in verdict.evidence  # the driver's own word, where the table is silent
    if not decoded and not nonfatal and not (code == 74 and verdict.state == "healthy"):
        assert (verdict.state, verdict.action) == (entry.severity, entry.action), verdict.evidence
