"""A node's GPU identity and load, read through NVML, or nvidia-smi where NVML is not there.

Used by the verifier (identity, snapshot) and the collector (gpu-systems). It
reads through its own NVML session (gpuhealth.gpu.nvml), whose queries turn an
NVML error (not supported, no permission) into None, so a value the GPU cannot
give is an explicit null. The NVML module and the command runner are injected,
so tests run on fakes with no GPU.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpuhealth.gpu.nvml import NvmlSession
from gpuhealth.gpu.readings import SourceError
from shared.contract.models_verify import GpuIdentity, HostIdentity, NvLink, SystemIdentity
from shared.gpu.hostinfo import host_identity
from shared.plumbing.errors import GpuHealthError

# GB/s per lane and direction after line encoding (8b/10b up to gen 2, 128b/130b from gen 3,
# FLIT mode from gen 6): the bandwidth a link of that generation implies.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}


class GpuUnavailableError(GpuHealthError):
    """Neither NVML nor nvidia-smi can read this machine's GPUs."""


@dataclass(frozen=True, slots=True)
class GpuLoad:
    """What a GPU is doing right now (snapshot): nothing here is identity."""

    uuid: str
    index: int
    memory_used_mib: int | None
    power_w: float | None
    energy_mj: int | None  # NVML's total energy counter since the driver loaded
    processes: int | None


class GpuReader(Protocol):
    source: str

    def identity(self, hostname: str, collector_id: str | None = None) -> SystemIdentity: ...
    def loads(self) -> list[GpuLoad]: ...
    def close(self) -> None: ...


def pcie_bandwidth_gbps(gen: int | None, width: int | None) -> float | None:
    if gen is None or width is None or gen not in PCIE_GBPS_PER_LANE:
        return None
    return round(PCIE_GBPS_PER_LANE[gen] * width, 2)


def build_system(
    *,
    hostname: str,
    source: str,
    host: HostIdentity,
    gpus: list[GpuIdentity],
    collector_id: str | None = None,
    driver_version: str | None = None,
    cuda_driver_version: str | None = None,
    nvml_version: str | None = None,
    p2p: list[list[str | None]] | None = None,
) -> SystemIdentity:
    """A SystemIdentity with its identity hash computed."""
    fields: dict[str, Any] = {
        "schema_version": 1,
        "time": datetime.now(UTC),
        "hostname": hostname,
        "source": source,
        "collector_id": collector_id,
        "host": host,
        "driver_version": driver_version,
        "cuda_driver_version": cuda_driver_version,
        "nvml_version": nvml_version,
        "gpus": gpus,
        "p2p": p2p,
        "identity_sha256": "0" * 64,
    }
    draft = SystemIdentity.model_validate(fields)
    digest = SystemIdentity.identity_digest(draft.model_dump(mode="json"))
    return draft.model_copy(update={"identity_sha256": digest})


def _text(value: Any) -> str | None:
    if value is None:
        return None
    text = (value.decode(errors="replace") if isinstance(value, bytes) else str(value)).strip()
    return text[:253] or None


class NvmlReader:
    source = "nvml"

    def __init__(self, nvml: Any | None = None) -> None:
        try:
            self.session = NvmlSession(nvml)
        except SourceError as e:
            raise GpuUnavailableError(str(e)) from e
        self.nvml, self.handles, self._q = self.session.module, self.session.handles, self.session.query

    def _int(self, name: str, *args: Any) -> int | None:
        value = self._q(name, *args)
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    def _nvlinks(self, handle: Any) -> list[NvLink] | None:
        links: list[NvLink] = []
        for link in range(int(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self._q("nvmlDeviceGetNvLinkState", handle, link)
            if state is None:
                continue
            remote = self._q("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, link)
            links.append(
                NvLink(
                    link=link,
                    active=bool(state),
                    version=self._int("nvmlDeviceGetNvLinkVersion", handle, link),
                    remote_pci_bus_id=_text(getattr(remote, "busId", None)) if state else None,
                )
            )
        return links or None

    def _gpu(self, index: int, handle: Any) -> GpuIdentity:
        nvml = self.nvml
        memory = self._q("nvmlDeviceGetMemoryInfo", handle)
        pci = self._q("nvmlDeviceGetPciInfo", handle)
        cc = self._q("nvmlDeviceGetCudaComputeCapability", handle)
        gen_cur = self._int("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        gen_max = self._int("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        width_cur = self._int("nvmlDeviceGetCurrPcieLinkWidth", handle)
        width_max = self._int("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return GpuIdentity(
            index=index,
            uuid=_text(self._q("nvmlDeviceGetUUID", handle)) or f"GPU-unknown-index-{index}",
            model=_text(self._q("nvmlDeviceGetName", handle)),
            serial=_text(self._q("nvmlDeviceGetSerial", handle)),
            pci_bus_id=_text(getattr(pci, "busId", None)),
            vbios_version=_text(self._q("nvmlDeviceGetVbiosVersion", handle)),
            compute_capability=f"{cc[0]}.{cc[1]}" if isinstance(cc, tuple) and len(cc) == 2 else None,
            max_sm_clock_mhz=self._int("nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
            max_mem_clock_mhz=self._int("nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM),
            memory_total_mib=int(memory.total) // 2**20 if memory is not None else None,
            pcie_gen_max=gen_max,
            pcie_width_max=width_max,
            pcie_bandwidth_max_gbps=pcie_bandwidth_gbps(gen_max, width_max),
            pcie_gen_current=gen_cur,
            pcie_width_current=width_cur,
            pcie_bandwidth_current_gbps=pcie_bandwidth_gbps(gen_cur, width_cur),
            nvlinks=self._nvlinks(handle),
        )

    def _p2p(self) -> list[list[str | None]] | None:
        if getattr(self.nvml, "nvmlDeviceGetP2PStatus", None) is None:
            return None
        read = getattr(self.nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
        matrix: list[list[str | None]] = []
        for i, a in enumerate(self.handles):
            row: list[str | None] = []
            for j, b in enumerate(self.handles):
                status = None if i == j else self._q("nvmlDeviceGetP2PStatus", a, b, read)
                row.append(
                    "self" if i == j else P2P_STATUS.get(status, "unknown") if status is not None else None
                )
            matrix.append(row)
        return matrix

    def identity(self, hostname: str, collector_id: str | None = None) -> SystemIdentity:
        cuda = self._int("nvmlSystemGetCudaDriverVersion")
        return build_system(
            hostname=hostname,
            source="nvml",
            collector_id=collector_id,
            host=host_identity(),
            gpus=[self._gpu(i, h) for i, h in enumerate(self.handles)],
            driver_version=_text(self._q("nvmlSystemGetDriverVersion")),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            nvml_version=_text(self._q("nvmlSystemGetNVMLVersion")),
            p2p=self._p2p(),
        )

    def loads(self) -> list[GpuLoad]:
        out = []
        for i, handle in enumerate(self.handles):
            memory = self._q("nvmlDeviceGetMemoryInfo", handle)
            power_mw = self._int("nvmlDeviceGetPowerUsage", handle)
            procs = self._q("nvmlDeviceGetComputeRunningProcesses", handle)
            out.append(
                GpuLoad(
                    uuid=_text(self._q("nvmlDeviceGetUUID", handle)) or f"GPU-unknown-index-{i}",
                    index=i,
                    memory_used_mib=int(memory.used) // 2**20 if memory is not None else None,
                    power_w=power_mw / 1000 if power_mw is not None else None,
                    energy_mj=self._int("nvmlDeviceGetTotalEnergyConsumption", handle),
                    processes=len(procs) if procs is not None else None,
                )
            )
        return out

    def close(self) -> None:
        self.session.close()


SMI_IDENTITY = (
    "index,uuid,name,serial,pci.bus_id,vbios_version,driver_version,clocks.max.sm,clocks.max.memory,"
    "memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
)
SMI_LOAD = "index,uuid,memory.used,power.draw"


def _smi_value(cell: str) -> str | None:
    cell = cell.strip()
    return None if not cell or cell.strip("[]").lower() in {"n/a", "not supported", "unknown error"} else cell


def _smi_int(cell: str) -> int | None:
    value = _smi_value(cell)
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def _run_smi(args: list[str]) -> str:
    try:
        done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise GpuUnavailableError(f"nvidia-smi failed: {e}") from e
    return done.stdout


class SmiReader:
    """nvidia-smi's CSV queries: no NVLink, P2P or energy counter there, so those are null."""

    source = "smi"

    def __init__(self, run: Callable[[list[str]], str] = _run_smi) -> None:
        self.run = run
        self.run(["-L"])  # fails clearly when there is no nvidia-smi or no driver

    def _rows(self, fields: str) -> list[list[str]]:
        text = self.run([f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
        return [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if row]

    def identity(self, hostname: str, collector_id: str | None = None) -> SystemIdentity:
        gpus: list[GpuIdentity] = []
        driver: str | None = None
        for row in self._rows(SMI_IDENTITY):
            if len(row) != 14:
                raise GpuUnavailableError(f"nvidia-smi answered {len(row)} fields, expected 14")
            gen_cur, gen_max, width_cur, width_max = (_smi_int(c) for c in row[10:14])
            driver = driver or _smi_value(row[6])
            gpus.append(
                GpuIdentity(
                    index=_smi_int(row[0]) or 0,
                    uuid=_smi_value(row[1]) or f"GPU-unknown-index-{len(gpus)}",
                    model=_smi_value(row[2]),
                    serial=_smi_value(row[3]),
                    pci_bus_id=_smi_value(row[4]),
                    vbios_version=_smi_value(row[5]),
                    max_sm_clock_mhz=_smi_int(row[7]),
                    max_mem_clock_mhz=_smi_int(row[8]),
                    memory_total_mib=_smi_int(row[9]),
                    pcie_gen_current=gen_cur,
                    pcie_gen_max=gen_max,
                    pcie_width_current=width_cur,
                    pcie_width_max=width_max,
                    pcie_bandwidth_max_gbps=pcie_bandwidth_gbps(gen_max, width_max),
                    pcie_bandwidth_current_gbps=pcie_bandwidth_gbps(gen_cur, width_cur),
                )
            )
        cuda = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", self.run([]))
        return build_system(
            hostname=hostname,
            source="smi",
            collector_id=collector_id,
            host=host_identity(),
            gpus=gpus,
            driver_version=driver,
            cuda_driver_version=cuda.group(1) if cuda else None,
        )

    def loads(self) -> list[GpuLoad]:
        out: list[GpuLoad] = []
        for row in self._rows(SMI_LOAD):
            power = _smi_value(row[3]) if len(row) == 4 else None
            try:
                power_w = float(power) if power is not None else None
            except ValueError:
                power_w = None
            out.append(
                GpuLoad(
                    uuid=_smi_value(row[1]) or f"GPU-unknown-index-{len(out)}",
                    index=_smi_int(row[0]) or 0,
                    memory_used_mib=_smi_int(row[2]),
                    power_w=power_w,
                    energy_mj=None,
                    processes=None,
                )
            )
        return out

    def close(self) -> None:
        return None


def open_reader(*, nvml: Any | None = None, run: Callable[[list[str]], str] | None = None) -> GpuReader:
    """NVML if it works here, else nvidia-smi; GpuUnavailableError naming both reasons otherwise."""
    try:
        return NvmlReader(nvml)
    except GpuUnavailableError as nvml_error:
        try:
            return SmiReader(run or _run_smi)
        except GpuUnavailableError as smi_error:
            raise GpuUnavailableError(f"no GPU can be read: {nvml_error}; {smi_error}") from smi_error


def no_gpu_identity(hostname: str, collector_id: str | None = None) -> SystemIdentity:
    """The identity of a host without readable GPUs: host facts only."""
    return build_system(
        hostname=hostname, source="none", collector_id=collector_id, host=host_identity(), gpus=[]
    )
