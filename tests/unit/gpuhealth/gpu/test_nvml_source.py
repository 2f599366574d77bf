"""The NVML source on a fake NVML: batched field values, counters, memory v2, XIDs, recovery action."""

from __future__ import annotations

import ctypes
import time
from types import SimpleNamespace

import pytest

from gpuhealth.gpu.nvml_source import FAST_FIELDS, SLOW_FIELDS, NvmlSource, _field_number, _handle_key
from gpuhealth.gpu.pcie_counters import FASTEST_S, SLOWEST_S, PcieTraffic
from gpuhealth.gpu.readings import SourceError
from shared.fakes.nvml import BUS_IDS, UUIDS, FakeNvml


def source(fake: FakeNvml, **kwargs: object) -> NvmlSource:
    return NvmlSource(fake, pcie_sampler=False, **kwargs)  # type: ignore[arg-type]


def test_a_read_maps_every_query_and_nulls_what_a_gpu_lacks() -> None:
    fake = FakeNvml()
    hopper, volta = source(fake).read().gpus
    assert (hopper.uuid, hopper.model, hopper.pci_bus_id, hopper.driver_version) == (
        UUIDS[0], "NVIDIA H100 80GB HBM3", BUS_IDS[0], "550.90.07",
    )  # fmt: skip
    m = hopper.metrics
    assert m["power_usage_w"] == pytest.approx(612.345)
    assert (m["slowdown_temp_c"], m["shutdown_temp_c"], m["power_limit_w"]) == (87, 92, 700.0)
    assert (m["memory_temp_c"], m["total_energy_mj"], m["pcie_replay_total"]) == (71, 123_456_789, 3)
    assert (m["ecc_sbe_volatile_total"], m["ecc_dbe_volatile_total"]) == (12, 1)
    assert (m["ecc_sbe_aggregate_total"], m["ecc_dbe_aggregate_total"]) == (40, 2)
    assert (m["remapped_rows_correctable"], m["remapped_rows_uncorrectable"]) == (4, 1)
    assert (m["row_remap_pending"], m["row_remap_failure"]) == (0, 1)
    assert m["retired_pages_sbe"] is None  # Hopper remaps rows: not supported -> null
    assert m["clocks_event_reasons"] == 4
    assert m["nvlink_crc_flit_errors_total"] == 4
    assert (m["power_violation_us"], m["thermal_violation_us"]) == (5_000_000, 7000)  # ns -> µs
    assert (m["pcie_link_gen"], m["pcie_link_width"], m["pcie_link_gen_max"], m["pcie_link_width_max"]) == (
        5, 16, 5, 16,
    )  # fmt: skip
    assert m["gpu_recovery_action"] == 0
    v = volta.metrics
    assert (v["memory_temp_c"], v["total_energy_mj"], v["remapped_rows_correctable"]) == (None, None, None)
    assert (v["retired_pages_sbe"], v["retired_pages_dbe"], v["retired_pages_pending"]) == (2, 0, 1)
    assert v["clocks_event_reasons"] == 1  # fell back to the throttle-reasons call
    assert v["pcie_link_width"] == 8
    assert v["pcie_link_width_max"] == 16
    assert v["gpu_recovery_action"] is None  # the driver does not report it for this GPU


def test_one_field_values_call_per_gpu_and_never_the_sampling_pcie_call() -> None:
    fake = FakeNvml()
    nvml = source(fake, slow_every_s=3600)
    nvml.read()  # the first read also fetches the slow fields
    fake.calls.clear()
    nvml.read()
    assert fake.calls.count("nvmlDeviceGetFieldValues") == 2  # one batch per GPU
    assert "nvmlDeviceGetPcieThroughput" not in fake.calls  # it samples for 20 ms per call
    assert "nvmlDeviceGetViolationStatus" not in fake.calls
    assert "nvmlDeviceGetTotalEccErrors" not in fake.calls
    # static facts are read once, not every poll
    assert "nvmlDeviceGetName" not in fake.calls
    assert "nvmlDeviceGetTemperatureThreshold" not in fake.calls


def test_slow_counters_are_refreshed_on_their_own_period_and_kept_in_between() -> None:
    fake, clock = FakeNvml(), [0.0]
    nvml = source(fake, slow_every_s=30, monotonic=lambda: clock[0])
    assert nvml.read().gpus[0].metrics["total_energy_mj"] == 123_456_789
    fake.calls.clear()
    fake.energy_mj += 1000
    fake.dbe_volatile = 2
    clock[0] = 10.0
    m = nvml.read().gpus[0].metrics
    assert m["total_energy_mj"] == 123_456_789  # the kept value (2.8 ms to read), not a null
    assert m["ecc_dbe_volatile_total"] == 2  # ECC is read every poll
    assert fake.calls.count("nvmlDeviceGetFieldValues") == 2
    clock[0] = 31.0
    fake.calls.clear()
    assert nvml.read().gpus[0].metrics["total_energy_mj"] == 123_457_789
    assert fake.calls.count("nvmlDeviceGetFieldValues") == 4  # fast and slow batch, per GPU


def test_memory_v2_separates_reserved_from_used_as_nvidia_smi_does() -> None:
    fake = FakeNvml()
    m = source(fake).read().gpus[0].metrics
    assert (m["fb_total_mib"], m["fb_used_mib"], m["fb_reserved_mib"], m["fb_free_mib"]) == (
        81920, 61440, 480, 20480,
    )  # fmt: skip
    fake.memory_v2 = False  # an older driver: v1 counts the reserved memory as used
    m = source(fake).read().gpus[0].metrics
    assert (m["fb_used_mib"], m["fb_reserved_mib"]) == (61440 + 480, None)


@pytest.mark.parametrize(("action", "expected"), [(0, 0), (1, 1), (2, 2), (4, 4), (None, None)])
def test_recovery_action_read_where_the_driver_has_it(action: int | None, expected: int | None) -> None:
    fake = FakeNvml()
    fake.recovery_action = action
    assert source(fake).read().gpus[0].metrics["gpu_recovery_action"] == expected


def test_every_xid_is_listed_repeats_included_and_the_set_drained() -> None:
    fake = FakeNvml()
    nvml = source(fake)
    fake.xid_queue = [(0, 48), (1, 79), (0, 94), (0, 94)]
    hopper, volta = nvml.read().gpus
    assert hopper.xids == [48, 94, 94]
    assert hopper.metrics["xid_last"] == 94
    assert volta.xids == [79]
    assert fake.xid_queue == []
    again = nvml.read().gpus
    assert [g.xids for g in again] == [[], []]  # listed, and none since
    assert "xid_last" not in again[0].metrics


def test_a_storm_of_xids_is_drained_not_cut_at_a_small_bound() -> None:
    fake = FakeNvml()
    fake.xid_queue = [(0, 13)] * 5000
    (hopper, _) = source(fake).read().gpus
    assert hopper.xids == [13] * 5000


def test_without_an_event_set_xids_are_unknown_not_empty() -> None:
    fake = FakeNvml()

    def no_events() -> str:
        raise fake.NVMLError("Not Supported")

    fake.nvmlEventSetCreate = no_events  # type: ignore[method-assign]
    assert [g.xids for g in source(fake).read().gpus] == [None, None]


def test_a_lost_gpu_is_left_out_and_nvml_failing_at_start_is_a_source_error() -> None:
    fake = FakeNvml()
    nvml = source(fake)
    fake.lost.add(1)
    assert [g.uuid for g in nvml.read().gpus] == [UUIDS[0]]

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise self.NVMLError("Driver Not Loaded")

    with pytest.raises(SourceError, match="Driver Not Loaded"):
        NvmlSource(Broken())


def test_pcie_rate_from_the_byte_counters_between_reads() -> None:
    fake = FakeNvml()
    nvml = source(fake)
    fake.pcie_bytes[0] += 3_000_000
    fake.pcie_clock_us += 2_000_000  # the driver's timestamps, 2 s later
    m = nvml.read().gpus[0].metrics
    assert (m["pcie_tx_bytes_per_s"], m["pcie_rx_bytes_per_s"]) == (1_500_000, 750_000)
    assert nvml.read().gpus[1].metrics["pcie_tx_bytes_per_s"] is None  # the V100 has no counters


def test_32_bit_counters_wrap_and_the_total_keeps_counting() -> None:
    traffic = PcieTraffic()
    top = 2**32
    traffic.sample(0, "rx", top - 1000, 32, 1_000_000)
    assert traffic.poll_rate(0, "rx") is None  # one poll: no rate yet
    traffic.sample(0, "rx", 3000, 32, 1_500_000)  # wrapped: 4000 bytes moved
    traffic.sample(0, "rx", 2_000_000, 32, 2_000_000)
    traffic.sample(0, "rx", 2_000_000, 32, 2_000_000)  # the driver's cached value: ignored
    assert traffic.poll_rate(0, "rx") == round((4000 + 1_997_000) / 1.0)
    traffic.sample(0, "tx", 2**40, 64, 1_000_000)  # a 64-bit counter does not wrap at 4 GiB
    traffic.sample(0, "tx", 2**40 + 5, 64, 2_000_000)
    traffic.poll_rate(0, "tx")
    assert traffic.poll_rate(0, "tx") is None  # no new sample since the last poll


def test_the_sampling_period_follows_the_busiest_counter() -> None:
    traffic = PcieTraffic()
    assert traffic.period_s() == SLOWEST_S
    traffic.sample(0, "tx", 0, 32, 0)
    traffic.sample(0, "tx", 2**31, 32, 1_000_000)  # 2 GiB/s: half the range a second
    assert traffic.period_s() == pytest.approx(0.25)
    traffic.sample(1, "rx", 0, 32, 0)
    traffic.sample(1, "rx", 2**32 - 1, 32, 10_000)  # ~430 GB/s: as fast as allowed
    assert traffic.period_s() == FASTEST_S


def test_the_sampler_thread_keeps_the_counters_and_stops_on_close() -> None:
    fake = FakeNvml()
    nvml = NvmlSource(fake)
    sampler = nvml.sampler
    assert sampler is not None
    deadline = time.monotonic() + 10
    start = sampler.sweeps
    while sampler.sweeps < start + 1 and time.monotonic() < deadline:
        fake.pcie_bytes[0] += 1_000_000
        fake.pcie_clock_us += 100_000
        time.sleep(0.01)
    assert sampler.sweeps > start
    nvml.close()
    assert not sampler._thread.is_alive()
    assert fake.shut


def test_handles_compare_by_address_not_by_python_identity() -> None:
    target = ctypes.c_int(5)
    one, two = ctypes.pointer(target), ctypes.pointer(target)
    assert one != two  # what pynvml's event data and our handle list would be
    assert _handle_key(one) == _handle_key(two)
    assert _handle_key(3) == 3


@pytest.mark.parametrize(
    ("value_type", "member", "raw", "expected"),
    [
        (1, "uiVal", 71, 71),
        (1, "uiVal", 2**32 - 1, None),  # NVML_VALUE_NOT_AVAILABLE
        (3, "ullVal", 2**64 - 1, None),
        (3, "ullVal", 2**40, 2**40),
        (0, "dVal", 1.5, 1.5),
        (0, "dVal", float("nan"), None),
        (5, "siVal", -3, -3),
    ],
)
def test_field_numbers_come_from_the_member_their_type_names(
    value_type: int, member: str, raw: float, expected: float | None
) -> None:
    value = SimpleNamespace(valueType=value_type, value=SimpleNamespace(**{member: raw}))
    assert _field_number(value) == expected


def test_the_field_tables_name_each_sample_field_once() -> None:
    names = [name for name, _, _ in FAST_FIELDS + SLOW_FIELDS]
    assert len(names) == len(set(names))
    ids = [number for _, _, number in FAST_FIELDS + SLOW_FIELDS]
    assert len(ids) == len(set(ids))


def test_a_failing_sweep_does_not_end_the_sampler() -> None:
    from gpuhealth.gpu.pcie_counters import PcieSampler

    failures = [RuntimeError("driver hiccup")]

    def sweep() -> None:
        if failures:
            raise failures.pop()

    sampler = PcieSampler(PcieTraffic(), sweep)
    deadline = time.monotonic() + 10
    while sampler.sweeps < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    sampler.stop()
    assert sampler.sweeps >= 2
    assert failures == []
