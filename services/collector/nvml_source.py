"""Reads GPUs through NVML (the `pynvml` module of nvidia-ml-py), one handle per GPU.

Every query goes through one helper that turns an NVML error (not supported,
no permission, GPU lost) into None, so a query a GPU cannot answer is a null
field rather than a failed poll. XIDs come through NVML's event API: every
XID since the last poll is seen, not only the latest. Device limits (slowdown
and shutdown temperature, the enforced power limit) are read from the GPU.
The module is injected, so tests run on a fake with no GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from shared.models import Source

from .readings import GpuReading, MetricValue, SourceError, SourceReading

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    kind = Source.NVML
    target = "nvml"

    def __init__(self, nvml: Any | None = None) -> None:
        if nvml is None:
            import pynvml  # only hosts with the NVIDIA driver need it

            nvml = pynvml
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as e:
            raise SourceError(f"NVML is not usable here: {e}") from e
        self.driver = self._q(nvml.nvmlSystemGetDriverVersion)
        self.events = self._register_xid_events()

    def _q(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML query; None when the GPU cannot answer it."""
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def _register_xid_events(self) -> Any:
        nvml = self.nvml
        event_set = self._q(nvml.nvmlEventSetCreate)
        if event_set is None:
            return None
        for handle in self.handles:
            self._q(nvml.nvmlDeviceRegisterEvents, handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        return event_set

    def _drain_xids(self) -> dict[int, int]:
        """GPU index -> latest XID code from the events queued since the last poll."""
        latest: dict[int, int] = {}
        if self.events is None:
            return latest
        for _ in range(1000):  # bounded: a storm of XIDs cannot stall the poll
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:
                break  # timeout: nothing more queued
            for i, handle in enumerate(self.handles):
                if data.device == handle:
                    latest[i] = int(data.eventData)
        return latest

    def read(self) -> SourceReading:
        started, read_at = time.perf_counter(), datetime.now(UTC)
        xids = self._drain_xids()
        gpus = []
        for i, handle in enumerate(self.handles):
            uuid = self._q(self.nvml.nvmlDeviceGetUUID, handle)
            if uuid is None:
                continue  # the GPU stopped answering: the detector calls it lost
            pci = self._q(self.nvml.nvmlDeviceGetPciInfo, handle)
            gpus.append(
                GpuReading(
                    uuid=_text(uuid),
                    index=i,
                    model=_text(self._q(self.nvml.nvmlDeviceGetName, handle) or "unknown"),
                    pci_bus_id=_text(pci.busId) if pci is not None else None,
                    driver_version=_text(self.driver) if self.driver else None,
                    time=read_at,
                    metrics=self._metrics(handle, xids.get(i)),
                )
            )
        return SourceReading(
            source=self.kind, target=self.target, gpus=gpus, read_at=read_at,
            latency_ms=(time.perf_counter() - started) * 1000,
        )  # fmt: skip

    def _metrics(self, h: Any, xid: int | None) -> dict[str, MetricValue]:
        n, q = self.nvml, self._q
        util = q(n.nvmlDeviceGetUtilizationRates, h)
        memory = q(n.nvmlDeviceGetMemoryInfo, h)
        remap = q(n.nvmlDeviceGetRemappedRows, h)
        reasons = q(n.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is None:
            reasons = q(n.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        m: dict[str, MetricValue] = {
            "sm_clock_mhz": q(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": q(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            "gpu_temp_c": q(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "memory_temp_c": self._field(h, n.NVML_FI_DEV_MEMORY_TEMP),
            "power_usage_w": _scale(q(n.nvmlDeviceGetPowerUsage, h), 1e-3),
            "total_energy_mj": q(n.nvmlDeviceGetTotalEnergyConsumption, h),
            "gpu_util_pct": util.gpu if util is not None else None,
            "mem_copy_util_pct": util.memory if util is not None else None,
            "fb_total_mib": _mib(memory.total) if memory is not None else None,
            "fb_free_mib": _mib(memory.free) if memory is not None else None,
            "fb_used_mib": _mib(memory.used) if memory is not None else None,
            "fb_reserved_mib": _mib(getattr(memory, "reserved", None)) if memory is not None else None,
            "pcie_replay_total": q(n.nvmlDeviceGetPcieReplayCounter, h),
            "pcie_tx_bytes_per_s": _scale(q(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES), 1024),
            "pcie_rx_bytes_per_s": _scale(q(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES), 1024),
            "clocks_event_reasons": reasons,
            "power_violation_us": self._violation_us(h, n.NVML_PERF_POLICY_POWER),
            "thermal_violation_us": self._violation_us(h, n.NVML_PERF_POLICY_THERMAL),
            "ecc_sbe_volatile_total": q(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            "ecc_dbe_volatile_total": q(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
            "ecc_sbe_aggregate_total": q(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC),
            "ecc_dbe_aggregate_total": q(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC),
            "retired_pages_sbe": _count(q(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
            "retired_pages_dbe": _count(q(n.nvmlDeviceGetRetiredPages, h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
            "retired_pages_pending": q(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
            "remapped_rows_correctable": remap[0] if remap is not None else None,
            "remapped_rows_uncorrectable": remap[1] if remap is not None else None,
            "row_remap_pending": int(bool(remap[2])) if remap is not None else None,
            "row_remap_failure": int(bool(remap[3])) if remap is not None else None,
            "slowdown_temp_c": q(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            "shutdown_temp_c": q(n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            "power_limit_w": _scale(q(n.nvmlDeviceGetEnforcedPowerLimit, h), 1e-3),
            **self._nvlink(h),
        }  # fmt: skip
        if xid is not None:
            m["xid_last"] = xid
        return m

    def _field(self, h: Any, field_id: int) -> MetricValue:
        values = self._q(self.nvml.nvmlDeviceGetFieldValues, h, [field_id])
        if not values or values[0].nvmlReturn != self.nvml.NVML_SUCCESS:
            return None
        value = values[0].value
        return getattr(value, "uiVal", None) or getattr(value, "ullVal", None)

    def _violation_us(self, h: Any, policy: int) -> MetricValue:
        status = self._q(self.nvml.nvmlDeviceGetViolationStatus, h, policy)
        return None if status is None else int(status.violationTime // 1000)

    def _nvlink(self, h: Any) -> dict[str, MetricValue]:
        n = self.nvml
        counters = {
            "nvlink_crc_flit_errors_total": n.NVML_NVLINK_ERROR_DL_CRC_FLIT,
            "nvlink_crc_data_errors_total": n.NVML_NVLINK_ERROR_DL_CRC_DATA,
            "nvlink_replay_errors_total": n.NVML_NVLINK_ERROR_DL_REPLAY,
            "nvlink_recovery_errors_total": n.NVML_NVLINK_ERROR_DL_RECOVERY,
        }
        totals: dict[str, MetricValue] = dict.fromkeys(counters)
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            if self._q(n.nvmlDeviceGetNvLinkState, h, link) != n.NVML_FEATURE_ENABLED:
                continue
            for name, counter in counters.items():
                value = self._q(n.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if value is not None:
                    totals[name] = int(totals[name] or 0) + int(value)
        return totals

    def close(self) -> None:
        if self.events is not None:
            self._q(self.nvml.nvmlEventSetFree, self.events)
        self._q(self.nvml.nvmlShutdown)


def _scale(value: Any, factor: float) -> MetricValue:
    return None if value is None else value * factor


def _mib(value: Any) -> MetricValue:
    return None if value is None else int(value) // (1024 * 1024)


def _count(pages: Any) -> MetricValue:
    return None if pages is None else len(pages)
