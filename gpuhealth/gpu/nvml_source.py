"""Reads GPUs through NVML (the `pynvml` module of nvidia-ml-py), one handle per GPU.

A poll must stay cheap on an 8-GPU node, so the read follows what each query
cost on an H100 (driver 580; tests/data/h100/nvml-per-call.json). There a
poll takes 0.8-1.0 ms per GPU, where one call per metric took 49 ms:

- The counters come in ONE ``nvmlDeviceGetFieldValues`` call per GPU
  (FAST_FIELDS): ECC totals, retired pages, remapped rows, PCIe replays and
  byte counters, NVLink error totals, power violation time, memory
  temperature, the GPU recovery action. Each field has its own return code, so
  a field a GPU lacks is a null, not a failed batch. The two costly fields
  (SLOW_FIELDS: energy 2.8 ms, thermal violation time 0.6 ms) are read every
  `slow_every_s` and their last values carried in between.
- PCIe traffic comes from the PCIe byte counters (pcie_counters: they wrap at
  4 GiB, so a thread keeps them sampled). ``nvmlDeviceGetPcieThroughput``
  samples for 20 ms per call and is never called.
- Memory uses the v2 query: `used` excludes the driver's reserved memory,
  which is reported apart (as nvidia-smi does); v1 only where v2 is missing.
- What never changes (name, PCI bus id, temperature thresholds, the link's
  maximum generation and width) is read once per GPU.

Every query goes through the NVML session's helper (nvml.py), which turns an
NVML error (not supported, no permission, GPU lost) into None. XIDs come from
NVML's event set, drained until it is empty at every poll: each XID is listed
in the reading, repeats included. The module is injected, so tests run on a
fake with no GPU.
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .nvml import NvmlSession
from .pcie_counters import PcieSampler, PcieTraffic
from .readings import GpuReading, MetricValue, Source, SourceReading

log = logging.getLogger(__name__)

# sample field -> (pynvml constant, its number in nvml.h for older bindings). Each table is one
# nvmlDeviceGetFieldValues call; the costs are per field alone, medians on an H100 (driver 580).
# Every poll: 0.15 ms for the replay counter and each PCIe byte counter, ~0.005 ms the others.
FAST_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("memory_temp_c", "NVML_FI_DEV_MEMORY_TEMP", 82),
    ("pcie_replay_total", "NVML_FI_DEV_PCIE_REPLAY_COUNTER", 94),
    ("_pcie_tx_bytes", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197),
    ("_pcie_rx_bytes", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198),
    ("ecc_sbe_volatile_total", "NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 3),
    ("ecc_dbe_volatile_total", "NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 4),
    ("ecc_sbe_aggregate_total", "NVML_FI_DEV_ECC_SBE_AGG_TOTAL", 5),
    ("ecc_dbe_aggregate_total", "NVML_FI_DEV_ECC_DBE_AGG_TOTAL", 6),
    ("retired_pages_sbe", "NVML_FI_DEV_RETIRED_SBE", 29),
    ("retired_pages_dbe", "NVML_FI_DEV_RETIRED_DBE", 30),
    ("retired_pages_pending", "NVML_FI_DEV_RETIRED_PENDING", 31),
    ("remapped_rows_correctable", "NVML_FI_DEV_REMAPPED_COR", 142),
    ("remapped_rows_uncorrectable", "NVML_FI_DEV_REMAPPED_UNC", 143),
    ("row_remap_pending", "NVML_FI_DEV_REMAPPED_PENDING", 144),
    ("row_remap_failure", "NVML_FI_DEV_REMAPPED_FAILURE", 145),
    ("_power_violation_ns", "NVML_FI_DEV_PERF_POLICY_POWER", 74),
    ("nvlink_crc_flit_errors_total", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 38),
    ("nvlink_crc_data_errors_total", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 45),
    ("nvlink_replay_errors_total", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 52),
    ("nvlink_recovery_errors_total", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 59),
    ("gpu_recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230),
)
# Every `slow_every_s`, the last values in between: the energy counter costs 2.8 ms (as much as
# the rest of a read three times over), the thermal violation counter 0.6 ms.
SLOW_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("total_energy_mj", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 83),
    ("_thermal_violation_ns", "NVML_FI_DEV_PERF_POLICY_THERMAL", 75),
)
_VIOLATIONS = (
    ("_power_violation_ns", "power_violation_us"),
    ("_thermal_violation_ns", "thermal_violation_us"),
)
_FLAGS = ("row_remap_pending", "row_remap_failure", "retired_pages_pending")
# nvmlValueType_t -> (the member of the value union that holds it, its width in bits)
_VALUE_MEMBER = {
    0: ("dVal", 64),
    1: ("uiVal", 32),
    2: ("ulVal", 64),
    3: ("ullVal", 64),
    4: ("sllVal", 64),
    5: ("siVal", 32),
    6: ("usVal", 16),
}
MAX_XIDS_PER_POLL = 100_000  # a bound on one drain; an XID storm beyond it waits for the next poll


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_key(handle: Any) -> Any:
    """A comparable key for a device handle: ctypes pointers compare by identity, not address."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


@dataclass(slots=True)
class _Static:
    """What one GPU reports once: identity and limits that do not change while it runs."""

    model: str
    pci_bus_id: str | None
    slowdown_temp_c: MetricValue
    shutdown_temp_c: MetricValue
    link_gen_max: MetricValue
    link_width_max: MetricValue


class NvmlSource:
    kind = Source.NVML
    target = "nvml"

    def __init__(
        self,
        nvml: Any | None = None,
        *,
        slow_every_s: float = 30.0,
        pcie_sampler: bool = True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`slow_every_s`: how often SLOW_FIELDS are read (0: every poll); `pcie_sampler`: keep
        the wrapping PCIe counters sampled between polls (pcie_counters)."""
        self.session = NvmlSession(nvml)
        self.nvml, self.handles, self._q = self.session.module, self.session.handles, self.session.query
        nvml = self.nvml
        self._index_of = {_handle_key(h): i for i, h in enumerate(self.handles)}
        self._fast_ids = [getattr(nvml, const, number) for _, const, number in FAST_FIELDS]
        self._slow_ids = [getattr(nvml, const, number) for _, const, number in SLOW_FIELDS]
        self._pcie_ids = self._fast_ids[2:4]
        self._static: dict[int, _Static] = {}
        self._slow: dict[int, tuple[float, dict[str, MetricValue]]] = {}  # GPU -> (read at, values)
        self.slow_every_s, self._monotonic = slow_every_s, monotonic
        self.traffic = PcieTraffic()
        self.driver = self._q("nvmlSystemGetDriverVersion")
        self.events = self._register_xid_events()
        self._sample_pcie()  # the start of the first poll's window: it then has a rate
        for i in range(len(self.handles)):
            self.traffic.poll_rate(i, "tx"), self.traffic.poll_rate(i, "rx")
        self.sampler = PcieSampler(self.traffic, self._sample_pcie) if pcie_sampler else None

    def _register_xid_events(self) -> Any:
        nvml = self.nvml
        event_set = self._q("nvmlEventSetCreate")
        if event_set is None:
            return None
        for handle in self.handles:
            self._q("nvmlDeviceRegisterEvents", handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        return event_set

    def drain_xids(self) -> dict[int, list[int]] | None:
        """GPU index -> every XID code queued since the last poll, in order; None without events."""
        if self.events is None:
            return None
        seen: dict[int, list[int]] = {}
        for _ in range(MAX_XIDS_PER_POLL):
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.session.error:
                break  # timeout: the set is empty (or the driver cannot say more this poll)
            index = self._index_of.get(_handle_key(data.device))
            if index is not None:
                seen.setdefault(index, []).append(int(data.eventData))
        else:
            log.warning("XID storm: %d XIDs in one poll; the rest wait for the next", MAX_XIDS_PER_POLL)
        return seen

    def read(self) -> SourceReading:
        started, read_at = time.perf_counter(), datetime.now(UTC)
        xids = self.drain_xids()
        gpus = []
        for i, handle in enumerate(self.handles):
            uuid = self._q("nvmlDeviceGetUUID", handle)
            if uuid is None:
                continue  # the GPU stopped answering: the detector calls it lost
            static = self._static.get(i) or self._read_static(i, handle)
            gpu_xids = None if xids is None else xids.get(i, [])
            metrics = self._metrics(i, handle, static)
            if gpu_xids:
                metrics["xid_last"] = gpu_xids[-1]
            gpus.append(
                GpuReading(
                    uuid=_text(uuid),
                    index=i,
                    model=static.model,
                    pci_bus_id=static.pci_bus_id,
                    driver_version=_text(self.driver) if self.driver else None,
                    time=read_at,
                    metrics=metrics,
                    xids=gpu_xids,
                )
            )
        return SourceReading(
            source=self.kind,
            target=self.target,
            gpus=gpus,
            read_at=read_at,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def _read_static(self, i: int, h: Any) -> _Static:
        n, q = self.nvml, self._q
        pci = q("nvmlDeviceGetPciInfo", h)
        static = _Static(
            model=_text(q("nvmlDeviceGetName", h) or "unknown"),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            slowdown_temp_c=q("nvmlDeviceGetTemperatureThreshold", h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            shutdown_temp_c=q("nvmlDeviceGetTemperatureThreshold", h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            link_gen_max=q("nvmlDeviceGetMaxPcieLinkGeneration", h),
            link_width_max=q("nvmlDeviceGetMaxPcieLinkWidth", h),
        )
        if pci is not None:  # a GPU that answered nothing is asked again next poll
            self._static[i] = static
        return static

    def _metrics(self, i: int, h: Any, static: _Static) -> dict[str, MetricValue]:
        n, q = self.nvml, self._q
        util = q("nvmlDeviceGetUtilizationRates", h)
        reasons = q("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        m: dict[str, MetricValue] = {
            "sm_clock_mhz": q("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": q("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_MEM),
            "gpu_temp_c": q("nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU),
            "power_usage_w": _scale(q("nvmlDeviceGetPowerUsage", h), 1e-3),
            "gpu_util_pct": util.gpu if util is not None else None,
            "mem_copy_util_pct": util.memory if util is not None else None,
            "clocks_event_reasons": reasons,
            "pcie_link_gen": q("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_link_width": q("nvmlDeviceGetCurrPcieLinkWidth", h),
            "pcie_link_gen_max": static.link_gen_max,
            "pcie_link_width_max": static.link_width_max,
            "slowdown_temp_c": static.slowdown_temp_c,
            "shutdown_temp_c": static.shutdown_temp_c,
            "power_limit_w": _scale(q("nvmlDeviceGetEnforcedPowerLimit", h), 1e-3),
            **self._memory(h),
            **self._fast(i, h),
            **self._slow_fields(i, h),
        }
        return m

    def _memory(self, h: Any) -> dict[str, MetricValue]:
        """FB memory in MiB: v2 separates reserved from used (as nvidia-smi shows them)."""
        n = self.nvml
        memory, reserved_apart = None, False
        version = getattr(n, "nvmlMemory_v2", None)
        if version is not None:
            try:
                memory, reserved_apart = n.nvmlDeviceGetMemoryInfo(h, version=version), True
            except (self.session.error, TypeError):
                memory = None  # a driver or binding without v2: v1 counts reserved as used
        if memory is None:
            memory = self._q("nvmlDeviceGetMemoryInfo", h)
        if memory is None:
            return dict.fromkeys(("fb_total_mib", "fb_free_mib", "fb_used_mib", "fb_reserved_mib"))
        return {
            "fb_total_mib": _mib(memory.total),
            "fb_free_mib": _mib(memory.free),
            "fb_used_mib": _mib(memory.used),
            "fb_reserved_mib": _mib(memory.reserved) if reserved_apart else None,
        }

    def _fields(self, h: Any, table: tuple[tuple[str, str, int], ...], ids: list[int]) -> dict[str, Any]:
        """One nvmlDeviceGetFieldValues call: name -> the field's value struct, where it succeeded."""
        values = self._q("nvmlDeviceGetFieldValues", h, ids)
        success = self.nvml.NVML_SUCCESS
        return {
            name: v for (name, _, _), v in zip(table, values or (), strict=False) if v.nvmlReturn == success
        }

    def _fast(self, i: int, h: Any) -> dict[str, MetricValue]:
        found = self._fields(h, FAST_FIELDS, self._fast_ids)
        self._fold_pcie(i, found)
        out = _numbers(FAST_FIELDS, found) | _violations_us(FAST_FIELDS, found)
        out["pcie_tx_bytes_per_s"] = self.traffic.poll_rate(i, "tx")
        out["pcie_rx_bytes_per_s"] = self.traffic.poll_rate(i, "rx")
        return out

    def _slow_fields(self, i: int, h: Any) -> dict[str, MetricValue]:
        """SLOW_FIELDS, read again once `slow_every_s` has passed; the last values in between."""
        now = self._monotonic()
        kept = self._slow.get(i)
        if kept is not None and now - kept[0] < self.slow_every_s:
            return kept[1]
        found = self._fields(h, SLOW_FIELDS, self._slow_ids)
        out = _numbers(SLOW_FIELDS, found) | _violations_us(SLOW_FIELDS, found)
        self._slow[i] = (now, out)
        return out

    def _sample_pcie(self) -> None:
        """Every GPU's two PCIe byte counters into the traffic totals (the sampler's sweep)."""
        names = ("_pcie_tx_bytes", "_pcie_rx_bytes")
        for i, h in enumerate(self.handles):
            values = self._q("nvmlDeviceGetFieldValues", h, self._pcie_ids)
            if values:
                ok = self.nvml.NVML_SUCCESS
                self._fold_pcie(i, {n: v for n, v in zip(names, values, strict=False) if v.nvmlReturn == ok})

    def _fold_pcie(self, i: int, found: dict[str, Any]) -> None:
        for direction in ("tx", "rx"):
            value = found.get(f"_pcie_{direction}_bytes")
            number = _field_number(value) if value is not None else None
            if isinstance(number, int):
                bits = _VALUE_MEMBER.get(int(getattr(value, "valueType", 3)), ("", 64))[1]
                at_us = int(getattr(value, "timestamp", 0) or 0) or int(self._monotonic() * 1e6)
                self.traffic.sample(i, direction, number, bits, at_us)

    def close(self) -> None:
        """Stop the sampler, free the event set and shut NVML down; a second call does nothing."""
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.events is not None:
            self._q("nvmlEventSetFree", self.events)
            self.events = None
        self.session.close()


def _field_number(value: Any) -> MetricValue:
    """One nvmlFieldValue_t's number, read from the union member its valueType names."""
    member, bits = _VALUE_MEMBER.get(int(getattr(value, "valueType", 3)), ("ullVal", 64))
    number = getattr(value.value, member, None)
    if isinstance(number, float):
        return number if math.isfinite(number) else None
    if not isinstance(number, int) or number == (1 << bits) - 1:  # NVML_VALUE_NOT_AVAILABLE
        return None
    return number


def _violations_us(table: tuple[tuple[str, str, int], ...], found: dict[str, Any]) -> dict[str, MetricValue]:
    """The table's perf-policy counters: ns in NVML (as nvmlDeviceGetViolationStatus), µs here."""
    out: dict[str, MetricValue] = {}
    names = {name for name, _, _ in table}
    for counter, name in _VIOLATIONS:
        if counter in names:
            ns = _field_number(found[counter]) if counter in found else None
            out[name] = int(ns) // 1000 if ns is not None else None
    return out


def _numbers(table: tuple[tuple[str, str, int], ...], found: dict[str, Any]) -> dict[str, MetricValue]:
    """The sample fields of a batch (the _private ones left out); flags as 0/1."""
    out: dict[str, MetricValue] = {}
    for name, _, _ in table:
        if name.startswith("_"):
            continue
        number = _field_number(found[name]) if name in found else None
        out[name] = int(bool(number)) if name in _FLAGS and number is not None else number
    return out


def _scale(value: Any, factor: float) -> MetricValue:
    return None if value is None else value * factor


def _mib(value: Any) -> MetricValue:
    return None if value is None else int(value) // (1024 * 1024)
