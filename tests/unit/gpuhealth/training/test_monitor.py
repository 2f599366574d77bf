"""GpuMonitor on the collector's NVML source (a fake NVML), the nvidia-smi fallback, device choice."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.gpu.nvml_source import NvmlSource
from gpuhealth.gpu.readings import GpuReading
from gpuhealth.gpu.smi_source import SmiSource
from gpuhealth.training import GpuMonitor, SourceError, open_source
from gpuhealth.training.monitor import statuses_from, visible_devices
from gpuhealth.training.sources import SourceReading
from shared.contract.models import Source
from shared.fakes.scripted_nvml import BrokenNvml, ScriptedNvml

H100, V100 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
SMI = {"index": "0", "uuid": "GPU-12345678-aaaa-bbbb-cccc-1234567890ab", "name": "NVIDIA H100 80GB HBM3",
       "temperature.gpu": "83", "utilization.gpu": "0", "memory.used": "79000", "memory.total": "81559",
       "power.draw": "690.5", "enforced.power.limit": "700.00"}  # fmt: skip


def test_reads_the_gpus_through_the_collectors_nvml_source() -> None:
    nvml = ScriptedNvml()
    nvml.temp_c = [71, 45]
    nvml.reasons = [0x20, 0]
    monitor = GpuMonitor(nvml=nvml, devices=None)
    assert isinstance(monitor.source, NvmlSource)
    h100, v100 = monitor.read()
    assert (h100.index, h100.uuid, h100.model) == (0, H100, "NVIDIA H100 80GB HBM3")
    assert (h100.temp_c, h100.slowdown_c, h100.util_pct) == (71, 87, 90)
    assert (h100.fb_used_mib, h100.fb_total_mib, h100.memory_used_ratio) == (40 * 1024, 80 * 1024, 0.5)
    assert (h100.power_w, h100.power_limit_w, h100.clocks_event_reasons) == (300, 700, 0x20)
    assert (v100.uuid, v100.temp_c) == (V100, 45)
    nvml.temp_c = [72, 46]
    monitor.read()
    assert monitor.series(H100, "temp_c") == [71, 72]
    assert "temp 72°C" in monitor.summary()
    assert "▁█" in monitor.summary()
    monitor.close()
    assert nvml.shut


def test_watches_only_the_devices_asked_for() -> None:
    assert [s.uuid for s in GpuMonitor(nvml=ScriptedNvml(), devices=[1]).read()] == [V100]
    assert [s.index for s in GpuMonitor(nvml=ScriptedNvml(), devices=["GPU-1111"]).read()] == [0]
    assert GpuMonitor(nvml=ScriptedNvml(), devices=[]).read() == []


def test_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert [s.uuid for s in GpuMonitor(nvml=ScriptedNvml()).read()] == [V100]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert len(GpuMonitor(nvml=ScriptedNvml()).read()) == 2


@given(st.text(alphabet="0123456789,GPU-abcdef MIG", max_size=40))
def test_cuda_visible_devices_parsing_never_fails(raw: str) -> None:
    devices = visible_devices({"CUDA_VISIBLE_DEVICES": raw})
    assert devices is not None
    assert all(isinstance(d, int) or d.startswith(("GPU-", "MIG-")) for d in devices)
    assert visible_devices({}) is None


def test_falls_back_to_nvidia_smi_when_nvml_is_unusable() -> None:
    source = open_source("auto", nvml=BrokenNvml(), smi_runner=smi_runner(SMI))
    assert isinstance(source, SmiSource)
    (gpu,) = GpuMonitor(source).read()
    assert (gpu.temp_c, gpu.util_pct, gpu.power_w, gpu.power_limit_w) == (83, 0, 690.5, 700)
    assert gpu.memory_used_ratio == pytest.approx(79000 / 81559)
    with pytest.raises(SourceError, match="NVML"):
        open_source("nvml", nvml=BrokenNvml())
    with pytest.raises(SourceError, match="unknown"):
        open_source("dcgm")  # type: ignore[arg-type]


def test_no_source_at_all_is_a_source_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SourceError, match="nvidia-smi"):
        open_source("auto", nvml=BrokenNvml())


values = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True)
)


@given(temp=values, util=values, used=values, total=values, power=values, reasons=values)
def test_hostile_readings_become_unknown_never_numbers_out_of_range(
    temp: object, util: object, used: object, total: object, power: object, reasons: object
) -> None:
    from datetime import UTC, datetime

    metrics = {"gpu_temp_c": temp, "gpu_util_pct": util, "fb_used_mib": used, "fb_total_mib": total,
               "power_usage_w": power, "clocks_event_reasons": reasons}  # fmt: skip
    reading = SourceReading(Source.NVML, "nvml", [GpuReading(uuid=H100, index=0, model="x", metrics=metrics)],  # type: ignore[arg-type]
                            datetime.now(UTC), 1.0)  # fmt: skip
    (s,) = statuses_from(reading)
    assert s.temp_c is None or 0 <= s.temp_c <= 250
    assert s.util_pct is None or 0 <= s.util_pct <= 100
    assert s.power_w is None or 0 <= s.power_w <= 10_000
    assert s.clocks_event_reasons is None or s.clocks_event_reasons >= 0
    ratio = s.memory_used_ratio
    assert ratio is None or ratio >= 0


def smi_runner(values: dict[str, str]) -> Callable[[list[str]], str]:
    """An nvidia-smi stand-in for one GPU: answers each queried field from `values`, else [N/A]."""

    def run(args: list[str]) -> str:
        query = [a for a in args if a.startswith("--query-gpu=")]
        if not query:  # e.g. `nvidia-smi -q -x`: not recorded, as on a driver that fails it
            raise SourceError(f"nvidia-smi {' '.join(args)}: not recorded")
        fields = query[0].split("=", 1)[1].split(",")
        return ", ".join(values.get(f, "[N/A]") for f in fields) + "\n"

    return run
