"""Random GPU features for the scorer's rule tests: every field the rules read, over ranges that cross
each threshold of the rules file, with XIDs from the catalogue (workflow codes with kernel lines) and
outside it, pattern bursts, remedies, the episodes a GPU shares, and when the fleet was last heard."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import strategies as st

from services.scorer.features import GpuFeatures, XidCounts, XidEvent
from services.scorer.patterns import Burst
from shared.store.correlated_inputs import Episode
from tests.helpers.scorer import HEALTHY, NOW, RULES

# Catalogue codes of every kind (workflow, hardware, application, ignored, fall off the bus) and two it lacks.
XID_CODES = sorted(
    {13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 109, 119, 144, 149, 154, *list(RULES.xid)[:8]}
)
CODES = st.sampled_from([*XID_CODES, 999, 1001])
KERNEL_LINES = (
    "pid=1, name=python, Ch 00000008",
    "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000)",
    "NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000)",
    "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


SECONDS_AGO = st.floats(min_value=0, max_value=40 * 86400, allow_nan=False)
TIMES = st.lists(SECONDS_AGO, max_size=5).map(lambda s: tuple(ago(x) for x in sorted(s)))
STAMPS = TIMES.map(lambda times: tuple(t.isoformat() for t in times))


@st.composite
def xid_values(draw: st.DrawFn) -> XidCounts | tuple[int, int]:
    recent = draw(st.integers(0, 4))
    total = recent + draw(st.integers(0, 4))
    if draw(st.booleans()):
        return (recent, total)
    repeats = draw(st.none() | st.integers(0, total))
    return XidCounts(recent, total, repeats, draw(STAMPS))


EPISODES = st.builds(
    Episode,
    scope=st.sampled_from(["job", "node", "rack"]),
    key=st.sampled_from(["ml/train-1", "n1", "rack-7"]),
    first=st.just(ago(3600)),
    last=st.sampled_from([ago(60), ago(1800), NOW]),
    gpus=st.lists(st.sampled_from(["GPU-0", "GPU-1", "GPU-2"]), min_size=1, max_size=3, unique=True),
    hosts=st.lists(st.sampled_from(["n1", "n2"]), min_size=1, max_size=2, unique=True),
    codes=st.lists(CODES, max_size=3),
    signals=st.integers(1, 9),
)


@st.composite
def bursts(draw: st.DrawFn) -> tuple[Burst, ...]:
    """A pattern's bursts, newest first: most a moment long, some spanning several of its burst windows."""
    ends = draw(TIMES)
    return tuple(
        Burst(
            end - timedelta(seconds=draw(st.sampled_from([0, 0, 1800, 7200]))), end, draw(st.integers(1, 5))
        )
        for end in ends
    )


RARELY = st.sampled_from([0, 0, 0, 1, 2])  # a count most GPUs show none of
PATTERNS = [pattern.name for pattern in RULES.patterns]


@st.composite
def gpu_features(draw: st.DrawFn) -> GpuFeatures:
    """A GPU's features with any mix of findings, healthy in none, some or every subsystem."""
    xids = draw(st.dictionaries(CODES, xid_values(), max_size=4))
    workflow = [code for code in xids if code in RULES.xid and RULES.xid[code].workflow]
    lines = st.none() | st.sampled_from(KERNEL_LINES)
    event = st.builds(
        XidEvent, st.sampled_from([ago(30), ago(600)]), st.sampled_from(["kmsg", "dcgm"]), lines
    )
    return GpuFeatures(
        gpu_uuid="GPU-1",
        hostname="n1",
        model=draw(st.sampled_from([HEALTHY.model, "NVIDIA B200", "NVIDIA A100-SXM4-80GB"])),
        last_time=draw(st.none() | st.sampled_from([0, 5, 30, 59, 60, 61, 120, 600]).map(ago)),
        slowdown_c=draw(st.sampled_from([80.0, 87.0, 95.0])),
        power_limit_w=700,
        fb_total_mib=81559,
        recovery_action=draw(st.none() | st.integers(0, 5) | st.just(99)),
        driver_version=draw(st.none() | st.sampled_from(["570.124.06", "580.65.06", "590.48.01", "garbage"])),
        dbe_volatile=draw(RARELY),
        retired_pages=draw(st.sampled_from([0, 0, 0, 62, 63, 80])),
        retired_pending=draw(RARELY),
        remap_failure=draw(RARELY),
        remap_pending=draw(RARELY),
        remapped_uncorrectable=draw(st.integers(0, 3)),
        temp_max=draw(st.none() | st.floats(40, 110, allow_nan=False)),
        reasons_any=draw(st.integers(0, 0x1FF)),
        sbe_new=draw(st.sampled_from([0, 20, 120, 240, 6000]) | st.integers(0, 10_000)),
        pcie_new=draw(st.integers(0, 3000)),
        nvlink_crc_new=draw(st.integers(0, 500)),
        nvlink_replay_recovery_new=draw(RARELY),
        dbe_new=draw(st.integers(0, 2)),
        minutes_long=draw(st.integers(0, 120)),
        span_long_s=draw(st.none() | st.floats(0, 7200, allow_nan=False)),
        xids=xids,
        lost_times=draw(STAMPS),
        xid_events={code: draw(st.lists(event, min_size=1, max_size=3).map(tuple)) for code in workflow},
        pattern_bursts=draw(st.dictionaries(st.sampled_from(PATTERNS), bursts(), max_size=3)),
        pattern_cancelled=draw(st.dictionaries(st.sampled_from(PATTERNS), SECONDS_AGO.map(ago))),
        remedy=draw(st.none() | st.just({"remedy": "reset_gpu", "by": "plan 7"})),
        episodes=draw(st.lists(EPISODES, max_size=3)),
    )


HEARD_UNTIL = st.none() | st.sampled_from([NOW, ago(30), ago(300), NOW + timedelta(seconds=60)])
