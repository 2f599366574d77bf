"""The simulated fleet: per-GPU workload cycles, physics that follow load, and faults.

Each GPU runs jobs in a cycle (idle, ramp, peak, ramp-down) with noise. Power
follows load up to the model's limit; temperature relaxes exponentially
towards the level that power sets (exact for any step length, so an
accelerated clock stays stable); clock-event reasons and clocks follow
temperature and power. Everything random comes from one generator per GPU
seeded from the fleet seed, so a fleet advanced through the same simulated
times renders the same bytes.
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from dataclasses import dataclass, field

from gpuhealth.gpu.driver_codes import ClockEventReason as Reason

from .faults import Fault, FaultKind, counter_totals, xid_of
from .profiles import GpuModel

AMBIENT_C = 27.0
THERMAL_TAU_S = 90.0
# HGX baseboard PCI bus ids for GPUs 0-7; further GPUs get synthetic ones.
_HGX_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_NAMESPACES = ("ml-training", "ml-inference", "research")

IDLE, RAMP, PEAK, RAMP_DOWN = "idle", "ramp", "peak", "ramp_down"


@dataclass(slots=True)
class Job:
    pod: str
    namespace: str
    container: str
    level: float  # peak load, 0..1
    memory_fraction: float


@dataclass(slots=True)
class GpuSim:
    node: int
    index: int
    model: GpuModel
    rng: random.Random
    uuid: str
    pci_bus_id: str
    t: float
    phase: str = IDLE
    phase_start: float = 0.0
    phase_end: float = 0.0
    own_job: Job | None = None  # the job of the GPU's own cycle
    # jobs that span several GPUs (a scenario's multi-GPU job, services/mock_dcgm/jobs.py): (from, until, job)
    shared_jobs: list[tuple[float, float, Job]] = field(default_factory=list)
    load: float = 0.0
    temp_c: float = AMBIENT_C + 8
    power_w: float = 0.0
    sm_clock_mhz: float = 0.0
    reasons: int = Reason.GPU_IDLE
    energy_mj: float = 0.0
    power_violation_us: float = 0.0
    thermal_violation_us: float = 0.0
    nvlink_bandwidth_total: float = 0.0
    xid_last: int = 0
    present: bool = True
    faults: list[Fault] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    heat_c: float = 0.0
    hung: bool = False
    pending_pages: float = 0.0
    remap_failed: bool = False
    remap_pending: bool = False
    brake: bool = False
    forced_load: float | None = None  # a sustained workload holds the load here
    t0: float = 0.0
    # Steady background counts per hour that a healthy GPU shows (a rare corrected error,
    # a PCIe replay now and then): a function of simulated time, never of the scrape cadence.
    background: dict[str, float] = field(default_factory=dict)
    # The GPU's last reset (a reset, a reboot of its node, a repair: services/mock_dcgm/remedies.py): what
    # came before it is no longer the last XID or a pending remap, and its volatile counts start again.
    reset_s: float | None = None
    volatile_at_reset: dict[str, float] = field(default_factory=dict)  # volatile counts resets cleared

    # ---------------------------------------------------------------- workload
    def job_at(self, t: float) -> Job | None:
        """The job the GPU runs at t: a job it shares with other GPUs, else its own cycle's."""
        for start, end, job in self.shared_jobs:
            if start <= t < end:
                return job
        return self.own_job

    @property
    def job(self) -> Job | None:
        return self.job_at(self.t)

    def _next_phase(self) -> None:
        r = self.rng
        start = self.phase_end
        if self.phase == IDLE:
            self.phase, duration = RAMP, r.uniform(60, 180)
            self.own_job = Job(
                pod=f"train-{r.randrange(16**6):06x}-worker-{self.index}",
                namespace=r.choice(_NAMESPACES),
                container="trainer",
                level=r.uniform(0.82, 1.0),
                memory_fraction=r.uniform(0.55, 0.95),
            )
        elif self.phase == RAMP:
            self.phase, duration = PEAK, r.uniform(20 * 60, 120 * 60)
        elif self.phase == PEAK:
            self.phase, duration = RAMP_DOWN, r.uniform(30, 120)
        else:
            self.phase, duration = IDLE, r.uniform(5 * 60, 30 * 60)
            self.own_job = None
        self.phase_start, self.phase_end = start, start + duration

    def _load_at(self, t: float) -> float:
        job = self.job_at(t)
        if job is None:
            return 0.0
        if job is not self.own_job:
            return job.level  # a shared job runs flat out from its start to its end
        span = max(self.phase_end - self.phase_start, 1e-9)
        frac = min(max((t - self.phase_start) / span, 0.0), 1.0)
        if self.phase == RAMP:
            return job.level * frac
        if self.phase == RAMP_DOWN:
            return job.level * (1 - frac)
        return job.level

    # ---------------------------------------------------------------- faults
    def _apply_faults(self, t: float) -> float:
        """Refresh fault-driven state at t; returns the scrape delay the node should add."""
        totals: dict[str, float] = {}
        self.heat_c, self.hung, self.pending_pages = 0.0, False, 0.0
        self.remap_failed = self.remap_pending = False
        self.present, delay, brake = True, 0.0, False
        self.forced_load = None
        latest_xid: tuple[float, int] | None = None
        for f in self.faults:
            for name, value in counter_totals(f, t, self.model).items():
                totals[name] = totals.get(name, 0.0) + value
            xid = xid_of(f)
            # An XID fault's code stays the last XID until the fault is cleared (the GPU was
            # reset); the XIDs other faults log (48, 63, 64, 79) outlive them.
            shown = f.kind is not FaultKind.XID or f.active(t)
            before_repair = self.reset_s is not None and f.start_s <= self.reset_s <= t
            if (
                not before_repair
                and xid is not None
                and shown
                and f.start_s <= t
                and (latest_xid is None or f.start_s >= latest_xid[0])
            ):
                latest_xid = (f.start_s, xid)
            if f.kind is FaultKind.DBE and f.start_s <= t and self.model.row_remapping and not before_repair:
                self.remap_pending = True  # until the GPU is reset (the reset applies the remap)
            if not f.active(t):
                continue
            match f.kind:
                case FaultKind.THERMAL_RUNAWAY:
                    self.heat_c += min(f.p("c_per_minute") * f.elapsed(t) / 60, f.p("max_c"))
                case FaultKind.THERMAL_CREEP:
                    self.heat_c += min(f.p("c_per_hour") * f.elapsed(t) / 3600, f.p("max_c"))
                case FaultKind.HEAVY_WORKLOAD:
                    # Full load around the clock in a warm aisle: hot, steady, not failing.
                    self.heat_c += f.p("extra_c")
                    self.forced_load = max(self.forced_load or 0.0, f.p("level"))
                case FaultKind.POWER_BRAKE:
                    brake = True
                case FaultKind.FALL_OFF_BUS:
                    self.present, delay = False, max(delay, f.p("scrape_delay_s"))
                case FaultKind.HANG:
                    self.hung = True
                case FaultKind.PENDING_RETIREMENT:
                    self.pending_pages += f.p("pages")
                case FaultKind.ROW_REMAP_FAILURE:
                    self.remap_failed = True
                case _:
                    pass
        self.xid_last = latest_xid[1] if latest_xid is not None else 0
        self.counters = totals
        self.brake = brake
        return delay

    # ---------------------------------------------------------------- physics
    def advance(self, t: float) -> float:
        """Move this GPU's state to simulated time t; returns its scrape delay."""
        if t <= self.t:
            return self._apply_faults(self.t)
        dt = t - self.t
        while self.phase_end <= t:
            self._next_phase()
        delay = self._apply_faults(t)
        m, r = self.model, self.rng
        base = self._load_at(t) if self.forced_load is None else self.forced_load
        load = 0.0 if self.hung else min(max(base + r.gauss(0, 0.015), 0.0), 1.0)
        reasons, clock = 0, 1.0
        power = m.idle_power_w + load * (m.power_limit_w * 0.97 - m.idle_power_w)
        power *= 1 + r.gauss(0, 0.02)
        if load < 0.05:
            reasons |= Reason.GPU_IDLE
        if self.brake:
            reasons |= Reason.HW_POWER_BRAKE_SLOWDOWN | Reason.HW_SLOWDOWN
            clock = 0.35
            power = min(power, m.idle_power_w + 0.3 * (m.power_limit_w - m.idle_power_w))
        if power >= m.power_limit_w:
            reasons |= Reason.SW_POWER_CAP
            clock = min(clock, 0.93)
            power = m.power_limit_w
        if self.temp_c >= m.slowdown_temp_c:
            reasons |= Reason.HW_THERMAL_SLOWDOWN | Reason.SW_THERMAL_SLOWDOWN
            clock = min(clock, 0.55)
            power *= 0.7
        elif self.temp_c >= m.slowdown_temp_c - 4:
            reasons |= Reason.SW_THERMAL_SLOWDOWN
            clock = min(clock, 0.85)
        # Equilibrium: full power lands about 15 C under the slowdown temperature.
        per_watt = (m.slowdown_temp_c - 15 - AMBIENT_C) / m.power_limit_w
        target = AMBIENT_C + per_watt * power + self.heat_c
        self.temp_c = target + (self.temp_c - target) * math.exp(-dt / THERMAL_TAU_S)
        self.energy_mj += (self.power_w + power) / 2 * dt * 1000 if self.power_w else power * dt * 1000
        if reasons & (Reason.SW_POWER_CAP | Reason.HW_POWER_BRAKE_SLOWDOWN):
            self.power_violation_us += dt * 1e6
        if reasons & (Reason.HW_THERMAL_SLOWDOWN | Reason.SW_THERMAL_SLOWDOWN):
            self.thermal_violation_us += dt * 1e6
        self.nvlink_bandwidth_total += load * m.nvlink_peak_bytes_per_s * 0.3 * dt / 1024
        busy = load >= 0.05
        self.sm_clock_mhz = m.max_sm_clock_mhz * clock if busy else m.idle_sm_clock_mhz
        self.load, self.power_w, self.reasons, self.t = load, power, reasons, t
        return delay

    def values(self) -> dict[str, float | None]:
        """Current readings by sample-field name; None where the model has no such reading."""
        m, load = self.model, self.load
        usable = m.memory_mib - m.reserved_mib
        used = int(usable * self.job.memory_fraction) if self.job else 3
        counter = dict(self.baseline)
        hours = max(self.t - self.t0, 0.0) / 3600
        for name, per_hour in self.background.items():
            counter[name] = counter.get(name, 0.0) + math.floor(per_hour * hours)
        for name, value in self.counters.items():
            counter[name] = counter.get(name, 0.0) + value
        out: dict[str, float | None] = {
            "sm_clock_mhz": round(self.sm_clock_mhz),
            "mem_clock_mhz": m.mem_clock_mhz,
            "memory_temp_c": round(self.temp_c + 5 + 4 * load),
            "gpu_temp_c": round(self.temp_c),
            "power_usage_w": round(self.power_w, 3),
            "total_energy_mj": int(self.energy_mj),
            "pcie_tx_bytes_per_s": int(load * m.pcie_peak_bytes_per_s * 0.08),
            "pcie_rx_bytes_per_s": int(load * m.pcie_peak_bytes_per_s * 0.12),
            "gpu_util_pct": round(load * 100),
            "mem_copy_util_pct": round(load * 55),
            "xid_last": self.xid_last,
            "clocks_event_reasons": self.reasons,
            "power_violation_us": int(self.power_violation_us),
            "thermal_violation_us": int(self.thermal_violation_us),
            "fb_total_mib": m.memory_mib,
            "fb_free_mib": usable - used,
            "fb_used_mib": used,
            "fb_reserved_mib": m.reserved_mib,
            "row_remap_failure": int(self.remap_failed),
            "row_remap_pending": int(self.remap_pending),
            "retired_pages_pending": int(self.pending_pages),
            "nvlink_bandwidth_total": int(self.nvlink_bandwidth_total),
            "prof_gr_engine_active_ratio": round(load * 0.97, 6),
            "prof_sm_active_ratio": round(load * 0.9, 6),
            "prof_sm_occupancy_ratio": round(load * 0.45, 6),
            "prof_tensor_active_ratio": round(load * 0.6, 6),
            "prof_dram_active_ratio": round(load * 0.4, 6),
            "slowdown_temp_c": m.slowdown_temp_c,
            "shutdown_temp_c": m.shutdown_temp_c,
            "power_limit_w": m.power_limit_w,
        }
        for name in COUNTER_FIELDS:
            out[name] = int(counter.get(name, 0.0) - self.volatile_at_reset.get(name, 0.0))
        return out


# Counters that only faults and history move; all start at the GPU's baseline.
COUNTER_FIELDS = (
    "pcie_replay_total",
    "ecc_sbe_volatile_total",
    "ecc_dbe_volatile_total",
    "ecc_sbe_aggregate_total",
    "ecc_dbe_aggregate_total",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "nvlink_crc_flit_errors_total",
    "nvlink_crc_data_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
)


@dataclass(slots=True)
class NodeSim:
    index: int
    hostname: str
    gpus: list[GpuSim]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def advance(self, t: float) -> float:
        """Advance every GPU to t; returns how long this node's scrape should stall."""
        return max((gpu.advance(t) for gpu in self.gpus), default=0.0)


def build_node(*, index: int, hostname: str, model: GpuModel, gpus: int, seed: int, t0: float) -> NodeSim:
    sims = []
    for g in range(gpus):
        rng = random.Random(f"{seed}:{index}:{g}")  # noqa: S311 - reproducible, not secret
        bus = _HGX_BUSES[g] if g < len(_HGX_BUSES) else f"{0xE0 + g:02X}"
        gpu = GpuSim(
            node=index,
            index=g,
            model=model,
            rng=rng,
            uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            pci_bus_id=f"00000000:{bus}:00.0",
            t=t0,
            phase_start=t0,
            # Stagger the fleet: each GPU starts part-way into an idle spell.
            phase_end=t0 + rng.uniform(0, 10 * 60),
            # History a healthy GPU carries: a few old corrected errors, nothing live.
            baseline={
                "ecc_sbe_aggregate_total": float(rng.choice((0, 0, 0, 1, 2, 5))),
                "pcie_replay_total": float(rng.choice((0, 0, 1))),
            },
        )
        noise = random.Random(f"{seed}:{index}:{g}:background")  # noqa: S311 - reproducible
        sbe_bg, pcie_bg = (
            noise.choice((0.0, 0.0, 0.0, 0.05, 0.2, 1.0)),
            noise.choice((0.0, 0.0, 0.5, 2.0, 6.0)),
        )
        gpu.t0, gpu.background = (
            t0,
            {
                "ecc_sbe_volatile_total": sbe_bg,
                "ecc_sbe_aggregate_total": sbe_bg,
                "pcie_replay_total": pcie_bg,
            },
        )
        gpu.temp_c = AMBIENT_C + 8 + rng.uniform(-2, 2)
        gpu.power_w = model.idle_power_w
        gpu.sm_clock_mhz = model.idle_sm_clock_mhz
        gpu.energy_mj = rng.uniform(1e9, 5e11)  # energy since boot: days to months
        sims.append(gpu)
    return NodeSim(index=index, hostname=hostname, gpus=sims)
