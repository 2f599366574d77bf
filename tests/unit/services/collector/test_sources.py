"""Sources on recorded output: a dcgm-exporter page, nvidia-smi CSV (NVML: test_collector_nvml)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuhealth.gpu.readings import SourceError
from gpuhealth.gpu.smi_source import QUERY_FIELDS, SmiSource
from services.collector.dcgm_source import parse_exposition
from tests.paths import DATA

DATA = DATA
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def test_real_format_page_with_mig_extra_labels_and_sentinels() -> None:
    gpus = parse_exposition((DATA / "dcgm_exporter_mig.prom").read_text(), scraped_at=NOW)
    assert [g.uuid for g in gpus] == [
        "GPU-0a1b2c3d-1111-2222-3333-444455556666",
        "GPU-7099682b-a20d-2bcc-74ab-b9060454d81e",
    ]
    full, mig = gpus
    assert (full.index, full.model, full.hostname) == (0, "NVIDIA A100-SXM4-40GB", "dgx-a-07")
    assert (full.pci_bus_id, full.driver_version, full.time) == (
        "00000000:07:00.0",
        "535.104.12",
        NOW,
    )
    assert full.workload == {"pod": "bert-0", "namespace": "ml", "container": "trainer"}
    assert full.metrics["sm_clock_mhz"] == 1410
    assert full.metrics["gpu_temp_c"] == 61  # labels in another order on this line
    assert full.metrics["power_usage_w"] == pytest.approx(287.341)
    assert full.metrics["clocks_event_reasons"] == 4  # the pre-3.3 field name
    # DCGM sentinels are null, never huge numbers
    assert full.metrics["memory_temp_c"] is None
    assert full.metrics["retired_pages_sbe"] is None
    assert mig.metrics["memory_temp_c"] is None  # the int32 blank
    assert mig.metrics["power_usage_w"] is None  # the fp64 blank
    assert mig.metrics["ecc_dbe_volatile_total"] == 2
    assert mig.workload == {}
    assert "fb_used_mib" not in mig.metrics  # only MIG instances reported it
    assert mig.mig == [
        {
            "profile": "3g.20gb",
            "instance_id": 1,
            "fb_used_mib": 4384,
            "prof_gr_engine_active_ratio": 0.812345,
        },
        {"profile": "1g.5gb", "instance_id": 8, "fb_used_mib": 6},
    ]


def test_exposition_timestamps_are_the_readings_time() -> None:
    page = (
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0a1b2c3d-1111-2222-3333-444455556666",Hostname="n"}'
        " 50 1800000000123\n"
    )
    (gpu,) = parse_exposition(page, scraped_at=NOW)
    assert gpu.time == datetime.fromtimestamp(1_800_000_000.123, UTC)
    assert gpu.hostname == "n"


@pytest.mark.parametrize(
    "page",
    [
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="x"} not-a-number\n',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0" 1\n',
        "\x00\x01",
    ],
)
def test_a_broken_page_is_a_source_error(page: str) -> None:
    with pytest.raises(SourceError, match="does not parse"):
        parse_exposition(page, scraped_at=NOW)


def test_lines_without_a_uuid_or_unknown_metrics_are_ignored() -> None:
    page = 'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 50\nsome_other_metric{UUID="GPU-0a1b2c3d-1111"} 1\n'
    assert parse_exposition(page, scraped_at=NOW) == []


# The recording's 25 columns, then the fields added since (issue 17) as this older driver
# would answer them: not available.
_NEWER = len(QUERY_FIELDS) - 25
SMI_OUT = "".join(
    line + ", [N/A]" * _NEWER + "\n" for line in (DATA / "nvidia_smi.csv").read_text().splitlines()
)
NO_XML = "<nvidia_smi_log/>"


def test_nvidia_smi_csv_with_na_values() -> None:
    calls: list[list[str]] = []

    def runner(args: list[str]) -> str:
        calls.append(args)
        return NO_XML if args[0] == "-q" else SMI_OUT

    busy, idle = SmiSource(runner).read().gpus
    assert calls[0][0].startswith("--query-gpu=index,uuid,name,pci.bus_id,driver_version,clocks.sm")
    assert calls[0][1] == "--format=csv,noheader,nounits"
    assert (busy.uuid, busy.index, busy.model) == (
        "GPU-5fd4f087-86f3-7a43-b711-4771313afc50",
        0,
        "NVIDIA H100 80GB HBM3",
    )
    assert busy.metrics["power_usage_w"] == pytest.approx(655.21)
    assert busy.metrics["clocks_event_reasons"] == 4
    assert busy.metrics["ecc_sbe_volatile_total"] == 3
    assert busy.metrics["retired_pages_sbe"] is None
    assert idle.metrics["gpu_util_pct"] == 0


def test_an_old_driver_loses_one_column_not_the_source() -> None:
    calls: list[str] = []

    def runner(args: list[str]) -> str:
        if args[0] == "-q":
            return NO_XML
        calls.append(args[0])
        if "clocks_event_reasons.active" in args[0]:
            raise SourceError('Field "clocks_event_reasons.active" is not a valid field to query.')
        if "memory.reserved" in args[0]:
            raise SourceError('Field "memory.reserved" is not a valid field to query.')
        return SMI_OUT.replace(", 579,", ",")

    (gpu, _) = SmiSource(runner).read().gpus
    assert "clocks_throttle_reasons.active" in calls[-1]
    assert "memory.reserved" not in calls[-1]
    assert gpu.metrics["clocks_event_reasons"] == 4
    assert "fb_reserved_mib" not in gpu.metrics


def test_nvidia_smi_failure_and_garbage_are_source_errors() -> None:
    with pytest.raises(SourceError, match="No devices"):
        SmiSource(lambda args: (_ for _ in ()).throw(SourceError("No devices were found"))).read()
    with pytest.raises(SourceError, match="columns"):
        SmiSource(lambda args: "1, 2, 3\n").read()
