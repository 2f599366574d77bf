"""Identity (fake NVML, recorded nvidia-smi output, recorded /proc), describe, snapshot and diff."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.verifier import __main__ as cli
from services.verifier.describe import KEYS, describe
from services.verifier.snapshot import Snapshot, diff, parse_snapshot, take_snapshot
from shared.contract.models_verify import parse_system, record_json
from shared.gpu import gpu_identity
from shared.gpu.gpu_identity import (
    GpuUnavailableError,
    NvmlReader,
    SmiReader,
    open_reader,
    pcie_bandwidth_gbps,
)
from shared.gpu.hostinfo import host_identity
from shared.plumbing.errors import ContractError
from tests.helpers.verifier_fakes import UUIDS, FakeNvml

CPUINFO = "".join(
    f"processor\t: {i}\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
    f"physical id\t: {i // 4}\ncore id\t\t: {i % 2}\n\n"
    for i in range(8)
)  # two sockets, two cores each, two threads a core


def test_nvml_identity_has_every_field_and_nulls_for_the_unsupported() -> None:
    identity = NvmlReader(FakeNvml()).identity("node-1", "collector-1")
    assert (identity.source, identity.driver_version, identity.cuda_driver_version) == (
        "nvml",
        "550.90.07",
        "12.4",
    )
    gpu0, gpu1 = identity.gpus
    assert (gpu0.uuid, gpu0.model, gpu0.serial, gpu0.pci_bus_id) == (
        UUIDS[0],
        "NVIDIA H100 80GB HBM3",
        "1650123456789",
        "00000000:18:00.0",
    )
    assert gpu1.serial is None  # not supported: an explicit null, never a guess
    assert (gpu0.max_sm_clock_mhz, gpu0.max_mem_clock_mhz, gpu0.memory_total_mib) == (1980, 2619, 81559)
    assert (gpu0.pcie_gen_max, gpu0.pcie_width_max, gpu0.pcie_bandwidth_max_gbps) == (5, 16, 63.01)
    assert gpu0.compute_capability == "9.0"
    assert gpu0.vbios_version == "96.00.74.00.01"
    assert gpu0.nvlinks is not None
    assert [link.link for link in gpu0.nvlinks] == [0, 1, 2, 3]
    assert identity.p2p == [["self", "ok"], ["ok", "self"]]
    assert parse_system(json.dumps(record_json(identity))) == identity


def test_nvml_without_nvlink_reports_null_links() -> None:
    identity = NvmlReader(FakeNvml(no_nvlink=True, gpus=1)).identity("node-1")
    assert identity.gpus[0].nvlinks is None
    assert identity.p2p == [["self"]]


def test_identity_hash_ignores_the_idling_pcie_link_but_not_the_driver() -> None:
    nvml = FakeNvml()
    base = NvmlReader(nvml).identity("n").identity_sha256
    nvml.pcie_gen_current = 1
    assert NvmlReader(nvml).identity("n").identity_sha256 == base
    nvml.driver = "555.42.02"
    assert NvmlReader(nvml).identity("n").identity_sha256 != base


@pytest.mark.parametrize(
    ("gen", "width", "gbps"), [(3, 16, 15.76), (4, 8, 15.75), (1, 1, 0.25), (9, 16, None)]
)
def test_pcie_bandwidth_follows_generation_and_width(gen: int, width: int, gbps: float | None) -> None:
    assert pcie_bandwidth_gbps(gen, width) == gbps


SMI_ROWS = (
    "0, GPU-11111111-2222-3333-4444-555555555555, NVIDIA A100-SXM4-80GB, 1324321000001, 00000000:07:00.0, "
    "92.00.36.00.02, 535.104.05, 1410, 1593, 81920, 4, 4, 16, 16\n"
    "1, GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, NVIDIA A100-SXM4-80GB, [N/A], 00000000:0F:00.0, "
    "92.00.36.00.02, 535.104.05, 1410, 1593, 81920, [Not Supported], 4, 16, 16\n"
)


def smi(args: list[str]) -> str:
    if not args:
        return "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |"
    if args == ["-L"]:
        return "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1111...)"
    if args[0].startswith("--query-gpu=index,uuid,memory.used"):
        return f"0, {UUIDS[0]}, 1200, 95.5\n1, {UUIDS[1]}, [N/A], [N/A]\n"
    return SMI_ROWS


def test_nvidia_smi_fallback_reads_identity_and_load() -> None:
    reader = SmiReader(smi)
    identity = reader.identity("node-2")
    assert identity.source == "smi"
    assert identity.cuda_driver_version == "12.2"
    assert identity.driver_version == "535.104.05"
    assert identity.p2p is None
    a, b = identity.gpus
    assert (a.serial, b.serial, b.pcie_gen_current, b.pcie_gen_max) == ("1324321000001", None, None, 4)
    assert a.nvlinks is None
    assert a.pcie_bandwidth_max_gbps == 31.5
    loads = reader.loads()
    assert (loads[0].memory_used_mib, loads[0].power_w, loads[1].power_w) == (1200, 95.5, None)


def test_open_reader_falls_back_to_smi_then_fails_with_both_reasons() -> None:
    assert isinstance(open_reader(nvml=FakeNvml(broken=True), run=smi), SmiReader)

    def no_smi(args: list[str]) -> str:
        raise GpuUnavailableError("nvidia-smi failed: not found")

    with pytest.raises(GpuUnavailableError, match=r"Driver Not Loaded.*nvidia-smi failed"):
        open_reader(nvml=FakeNvml(broken=True), run=no_smi)


def test_host_identity_from_recorded_files(tmp_path: Path) -> None:
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(CPUINFO)
    (tmp_path / "proc/meminfo").write_text("MemTotal:       2113344756 kB\nMemFree: 1 kB\n")
    (tmp_path / "proc/sys/kernel/osrelease").write_text("5.15.0-105-generic\n")
    (tmp_path / "etc/os-release").write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
    host = host_identity(tmp_path)
    assert (host.cpu_model, host.cpu_sockets, host.cpu_cores, host.cpu_threads) == (
        "AMD EPYC 9654 96-Core Processor",
        2,
        4,
        8,
    )
    assert host.memory_total_bytes == 2113344756 * 1024
    assert host.os_name == "Ubuntu 22.04.4 LTS"
    assert host.kernel == "5.15.0-105-generic"


def test_host_identity_with_nothing_readable_is_all_null(tmp_path: Path) -> None:
    host = host_identity(tmp_path)
    assert record_json(host) == dict.fromkeys(record_json(host))


# ---------------------------------------------------------------- describe


def test_describe_fills_what_the_machine_knows_and_lists_the_rest() -> None:
    identity = NvmlReader(FakeNvml()).identity("node-1")
    description, left = describe(identity, {"system_name": "dgx-h100", "division": "closed"})
    assert list(description) == list(KEYS)
    assert description["accelerator_model_name"] == "NVIDIA H100 80GB HBM3"
    assert description["accelerators_per_node"] == 2
    assert description["accelerator_memory_capacity"] == "80 GB"
    assert description["accelerator_host_interconnect"] == "PCIe Gen5 x16"
    assert description["accelerator_interconnect"] == "NVLink 4, 4 links per GPU"
    assert description["accelerator_frequency"] == "1980 MHz"
    assert description["system_name"] == "dgx-h100"
    assert "NVIDIA driver 550.90.07" in description["other_software_stack"]
    assert {"submitter", "status", "host_storage_type", "cooling", "framework"} <= set(left)
    assert not {"system_name", "division", "accelerator_model_name"} & set(left)
    with pytest.raises(KeyError, match="not a key"):
        describe(identity, {"favourite_colour": "green"})


def test_describe_leaves_unknown_interconnects_empty() -> None:
    description, left = describe(NvmlReader(FakeNvml(no_nvlink=True)).identity("n"))
    assert description["accelerator_interconnect"] == ""
    assert "accelerator_interconnect" in left


# ---------------------------------------------------------------- snapshot and diff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def snap(nvml: FakeNvml, watts: float = 70.0) -> Snapshot:
    clock = Clock()
    reader = NvmlReader(nvml)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        nvml.energy_mj = [int(e + watts * seconds * 1000) for e in nvml.energy_mj]

    return take_snapshot(reader, "node-1", window_s=1.0, interval_s=0.25, clock=clock, sleep=sleep)


def test_snapshot_averages_power_from_the_energy_counter() -> None:
    s = snap(FakeNvml(), watts=300.0)
    assert [g.avg_power_w for g in s.gpus] == [300.0, 300.0]
    assert s.gpus[0].memory_used_mib == 512
    assert parse_snapshot(json.dumps(s.model_dump(mode="json"))) == s


def test_diff_of_a_quiet_run_is_trusted() -> None:
    nvml = FakeNvml()
    report = diff(snap(nvml, 70.0), snap(nvml, 75.0))
    assert report.trusted, report.render()
    assert "the run can be trusted" in report.render()


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        (lambda n: setattr(n, "driver", "555.1"), "identity changed: driver_version"),
        (lambda n: setattr(n, "vbios", ["96.00.99.00.01", "96.00.74.00.01"]), "vbios_version"),
        (lambda n: setattr(n, "gpus", 1), f"GPU {UUIDS[1]} is gone"),
        (lambda n: setattr(n, "memory_used_mib", [9000, 512]), "memory used: 512 -> 9000 MiB"),
        (lambda n: setattr(n, "processes", [0, 2]), "compute processes: 0 -> 2"),
    ],
)
def test_diff_distrusts_a_changed_or_busy_machine(change: Any, finding: str) -> None:
    nvml = FakeNvml()
    before = snap(nvml)
    change(nvml)
    report = diff(before, snap(nvml))
    assert not report.trusted
    assert any(finding in f.what and not f.trusted for f in report.findings), report.render()


def test_diff_distrusts_power_beyond_the_threshold_and_the_threshold_is_configurable() -> None:
    nvml = FakeNvml()
    before, after = snap(nvml, 70.0), snap(nvml, 250.0)
    assert not diff(before, after).trusted
    assert "something still draws power" in diff(before, after).render()
    assert diff(before, after, max_power_delta_w=500).trusted


def test_power_falling_after_earlier_work_is_reported_but_trusted() -> None:
    """As measured on an H100: 115.7 W just after compute runs, 80.7 W a few seconds later."""
    nvml = FakeNvml()
    report = diff(snap(nvml, 115.7), snap(nvml, 80.7))
    assert report.trusted, report.render()
    assert "cooling down" in report.render()


def test_cli_snapshot_and_diff_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setattr(cli, "open_reader", lambda: NvmlReader(nvml))
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(snap(nvml).model_dump(mode="json")))
    after.write_text(json.dumps(snap(nvml).model_dump(mode="json")))
    assert cli.main(["diff", str(before), str(after)]) == 0
    nvml.memory_used_mib = [20_000, 512]
    assert cli.main(["snapshot", "--out", str(after), "--window-s", "0"]) == 0
    assert cli.main(["diff", str(before), str(after)]) == 1
    after.write_text("{not json")
    assert cli.main(["diff", str(before), str(after)]) == 2
    assert cli.main(["describe", "--identity", str(before), "--out", str(tmp_path / "d.json")]) == 0
    assert json.loads((tmp_path / "d.json").read_text())["accelerators_per_node"] == 2
    (tmp_path / "forged.json").write_text(json.dumps({**json.loads(before.read_text()), "window_s": -1}))
    assert cli.main(["describe", "--identity", str(tmp_path / "forged.json")]) == 2
    assert cli.main(["diff", str(before), str(tmp_path / "missing.json")]) == 2


def test_a_snapshot_with_a_forged_identity_hash_is_refused() -> None:
    value = snap(FakeNvml()).model_dump(mode="json")
    value["identity"]["driver_version"] = "999.0"  # hash left as it was
    with pytest.raises(ContractError, match="identity_sha256 does not match"):
        parse_snapshot(json.dumps(value))


KEYS_SEEN = st.sampled_from(["identity", "gpus", "time", "window_s", "uuid", "schema_version", "x"])
HOSTILE = st.recursive(
    st.none() | st.integers() | st.floats() | st.text(max_size=20),
    lambda x: st.lists(x, max_size=3) | st.dictionaries(KEYS_SEEN, x, max_size=5),
    max_leaves=15,
)


@given(HOSTILE)
@settings(max_examples=150)
def test_hostile_snapshot_files_are_refused_with_a_reason(value: Any) -> None:
    try:
        raw = json.dumps(value)
    except ValueError:
        return
    with pytest.raises(ContractError):
        parse_snapshot(raw)


def test_no_gpu_identity_keeps_host_facts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unavailable() -> Any:
        raise GpuUnavailableError("NVML is not usable here")

    monkeypatch.setattr(cli, "open_reader", unavailable)
    assert cli.main(["identity"]) == 1
    out = capsys.readouterr()
    assert json.loads(out.out)["gpus"] == []
    assert "no GPU could be read" in out.err
    assert gpu_identity.no_gpu_identity("n").source == "none"
