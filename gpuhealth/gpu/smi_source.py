"""Reads GPUs with `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`.

For hosts without NVML bindings.

The field list is explicit. `[N/A]`, `[Not Supported]` and blank values become
None. A driver too old to know a field answers 'Field "x" is not a valid field
to query': that field is dropped and the query retried, so an old driver
costs a column, not the source. The temperature thresholds, which the query
does not offer, come once per GPU from `nvidia-smi -q -x` (smi_xml). The
runner is injected, so tests replay recorded output.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime

from .readings import GpuReading, MetricValue, Source, SourceError, SourceReading
from .smi_xml import parse_smi_xml, recovery_action_code

# nvidia-smi field -> sample field ("" for identity columns handled separately).
QUERY_FIELDS: dict[str, str] = {
    "index": "", "uuid": "", "name": "", "pci.bus_id": "", "driver_version": "",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "temperature.gpu": "gpu_temp_c",
    "temperature.memory": "memory_temp_c",
    "power.draw": "power_usage_w",
    "enforced.power.limit": "power_limit_w",
    "utilization.gpu": "gpu_util_pct",
    "utilization.memory": "mem_copy_util_pct",
    "memory.total": "fb_total_mib",
    "memory.used": "fb_used_mib",
    "memory.free": "fb_free_mib",
    "memory.reserved": "fb_reserved_mib",
    "clocks_event_reasons.active": "clocks_event_reasons",
    "ecc.errors.corrected.volatile.total": "ecc_sbe_volatile_total",
    "ecc.errors.uncorrected.volatile.total": "ecc_dbe_volatile_total",
    "ecc.errors.corrected.aggregate.total": "ecc_sbe_aggregate_total",
    "ecc.errors.uncorrected.aggregate.total": "ecc_dbe_aggregate_total",
    "retired_pages.single_bit_ecc.count": "retired_pages_sbe",
    "retired_pages.double_bit.count": "retired_pages_dbe",
    "retired_pages.pending": "retired_pages_pending",
    "remapped_rows.correctable": "remapped_rows_correctable",
    "remapped_rows.uncorrectable": "remapped_rows_uncorrectable",
    "remapped_rows.pending": "row_remap_pending",
    "remapped_rows.failure": "row_remap_failure",
    "pcie.link.gen.current": "pcie_link_gen",
    "pcie.link.gen.max": "pcie_link_gen_max",
    "pcie.link.width.current": "pcie_link_width",
    "pcie.link.width.max": "pcie_link_width_max",
    # microseconds the clocks were held down by each policy (NVML's violation counters)
    "clocks_event_reasons_counters.sw_power_cap": "power_violation_us",
    "clocks_event_reasons_counters.sw_thermal_slowdown": "thermal_violation_us",
    "gpu_recovery_action": "gpu_recovery_action",
}  # fmt: skip
# Older drivers call the clock-event reasons "throttle reasons".
FALLBACKS = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
_BLANKS = {
    "",
    "[n/a]",
    "n/a",
    "[not supported]",
    "not supported",
    "[unknown error]",
    "[gpu is lost]",
}
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')

Runner = Callable[[list[str]], str]
log = logging.getLogger(__name__)


def run_nvidia_smi(args: list[str], timeout_s: float = 10.0) -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SourceError(f"nvidia-smi could not run: {e}") from e
    if done.returncode != 0:
        raise SourceError(f"nvidia-smi failed ({done.returncode}): {(done.stdout + done.stderr).strip()}")
    return done.stdout


def _value(text: str) -> MetricValue:
    text = text.strip()
    lowered = text.lower()
    if lowered in _BLANKS:
        return None
    if lowered in ("yes", "enabled", "active"):
        return 1
    if lowered in ("no", "disabled", "not active"):
        return 0
    try:
        return int(text, 16) if lowered.startswith("0x") else float(text)
    except ValueError:
        return None


def _median(values: list[MetricValue]) -> MetricValue:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def _sample_value(sample_field: str, text: str) -> MetricValue:
    if sample_field == "gpu_recovery_action":
        return recovery_action_code(text)
    return _value(text)


class SmiSource:
    kind = Source.SMI
    target = "nvidia-smi"

    def __init__(self, runner: Runner = run_nvidia_smi) -> None:
        self.run = runner
        # nvidia-smi field -> sample field, trimmed to what this driver understands.
        self.fields = dict(QUERY_FIELDS)
        # GPU UUID -> its temperature thresholds (read once from `nvidia-smi -q -x`)
        self.limits: dict[str, dict[str, MetricValue]] = {}

    def _read_limits(self, uuids: list[str]) -> None:
        """Thresholds for GPUs not seen before, tried once each: the median of three XML reports,
        as a driver that derives them from the live temperature can be a degree off in one."""
        reports: list[dict[str, dict[str, MetricValue]]] = []
        for _ in range(3):
            try:
                reports.append(parse_smi_xml(self.run(["-q", "-x"])))
            except (SourceError, ValueError) as e:
                log.warning("nvidia-smi -q -x gave no temperature thresholds: %s", e)
                break
        for uuid in uuids:
            self.limits[uuid] = {
                name: _median([r.get(uuid, {}).get(name) for r in reports])
                for name in ("slowdown_temp_c", "shutdown_temp_c")
            }

    def _query(self) -> str:
        while self.fields:
            args = [f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits"]
            try:
                return self.run(args)
            except SourceError as e:
                match = _INVALID_FIELD.search(str(e))
                if not match or match[1] not in self.fields or QUERY_FIELDS.get(match[1]) == "":
                    raise
                self._forget(match[1])
        raise SourceError("nvidia-smi refused every field")

    def _forget(self, field: str) -> None:
        """Drop a field this driver does not know, or swap in its older name."""
        renamed = {FALLBACKS.get(field, field) if f == field else f: v for f, v in self.fields.items()}
        renamed.pop(field, None)  # still there: no older name to try
        self.fields = renamed

    def read(self) -> SourceReading:
        started, read_at = time.perf_counter(), datetime.now(UTC)
        output = self._query()
        names = list(self.fields)
        gpus = []
        for row in csv.reader(io.StringIO(output), skipinitialspace=True):
            if not row:
                continue
            if len(row) != len(names):
                raise SourceError(f"nvidia-smi row has {len(row)} columns, expected {len(names)}: {row}")
            raw = dict(zip(names, (c.strip() for c in row), strict=True))
            gpus.append(
                GpuReading(
                    uuid=raw["uuid"],
                    index=int(_value(raw["index"]) or 0),
                    model=raw["name"] or "unknown",
                    pci_bus_id=raw.get("pci.bus_id") or None,
                    driver_version=raw.get("driver_version") or None,
                    time=read_at,
                    metrics={s: _sample_value(s, raw[f]) for f, s in self.fields.items() if s},
                )
            )
        unknown = [g.uuid for g in gpus if g.uuid not in self.limits]
        if unknown:
            self._read_limits(unknown)
        for gpu in gpus:
            gpu.metrics.update(self.limits.get(gpu.uuid, {}))
        return SourceReading(
            source=self.kind,
            target=self.target,
            gpus=gpus,
            read_at=read_at,
            latency_ms=(time.perf_counter() - started) * 1000,
        )

    def close(self) -> None:
        return None
