"""`describe`: an MLPerf Inference system description (`systems/<name>.json`) filled from identity.

Every key the submission checker asks for is present. What the machine can
tell (accelerator model, count, memory and frequency, PCIe link, NVLink,
CPU model, sockets, cores, host memory, OS, driver and CUDA) is filled from
the identity; what it cannot (submitter, division, status, storage,
networking, cooling, memory configuration, notes…) is left as an empty
string, as the checker's own templates do, and listed for the user.
"""

from __future__ import annotations

from typing import Any

from shared.contract.models_verify import SystemIdentity

# The keys of systems/<name>.json, in the order submissions usually write them.
KEYS = (
    "submitter",
    "division",
    "status",
    "system_name",
    "system_type",
    "system_type_detail",
    "number_of_nodes",
    "host_processor_model_name",
    "host_processors_per_node",
    "host_processor_core_count",
    "host_processor_vcpu_count",
    "host_processor_frequency",
    "host_processor_caches",
    "host_processor_interconnect",
    "host_memory_capacity",
    "host_memory_configuration",
    "host_storage_type",
    "host_storage_capacity",
    "host_networking",
    "host_networking_card_count",
    "host_networking_topology",
    "accelerators_per_node",
    "accelerator_model_name",
    "accelerator_frequency",
    "accelerator_host_interconnect",
    "accelerator_interconnect",
    "accelerator_interconnect_topology",
    "accelerator_memory_capacity",
    "accelerator_memory_configuration",
    "accelerator_on-chip_memories",
    "cooling",
    "hw_notes",
    "framework",
    "operating_system",
    "other_software_stack",
    "sw_notes",
)


def _one(values: list[Any]) -> Any:
    """The common value of all GPUs; None when they differ or none is known."""
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 and None not in values else None


def _nvlink(identity: SystemIdentity) -> str:
    per_gpu = [g.nvlinks for g in identity.gpus]
    if not per_gpu or any(links is None for links in per_gpu):
        return ""
    active = [[link for link in links or [] if link.active] for links in per_gpu]
    counts = {len(a) for a in active}
    if counts == {0}:
        return "N/A (no active NVLink)"
    versions = sorted({link.version for a in active for link in a if link.version is not None})
    gen = f" {'/'.join(str(v) for v in versions)}" if versions else ""
    links = f"{counts.pop()} links per GPU" if len(counts) == 1 else "links per GPU differ"
    return f"NVLink{gen}, {links}"


def describe(
    identity: SystemIdentity, given: dict[str, str | int] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The system description and the keys left for the user to fill in."""
    host, gpus = identity.host, identity.gpus
    models = [g.model for g in gpus]
    model = _one(models) if gpus else None
    memory = _one([g.memory_total_mib for g in gpus])
    clock = _one([g.max_sm_clock_mhz for g in gpus])
    gen, width = _one([g.pcie_gen_max for g in gpus]), _one([g.pcie_width_max for g in gpus])
    per_socket = host.cpu_cores // host.cpu_sockets if host.cpu_cores and host.cpu_sockets else None
    software = [f"NVIDIA driver {identity.driver_version}"] if identity.driver_version else []
    if identity.cuda_driver_version:
        software.append(f"CUDA {identity.cuda_driver_version} (driver API)")
    known: dict[str, Any] = {
        "number_of_nodes": 1,
        "host_processor_model_name": host.cpu_model or "",
        "host_processors_per_node": host.cpu_sockets or "",
        "host_processor_core_count": per_socket or "",
        "host_processor_vcpu_count": host.cpu_threads or "",
        "host_memory_capacity": f"{round(host.memory_total_bytes / 2**30)} GB"
        if host.memory_total_bytes
        else "",
        "accelerators_per_node": len(gpus),
        "accelerator_model_name": model or (" + ".join(sorted({m for m in models if m})) if gpus else ""),
        "accelerator_frequency": f"{clock} MHz" if clock else "",
        "accelerator_host_interconnect": f"PCIe Gen{gen} x{width}" if gen and width else "",
        "accelerator_interconnect": _nvlink(identity),
        "accelerator_memory_capacity": f"{round(memory / 1024)} GB" if memory else "",
        "operating_system": (
            f"{host.os_name} (kernel {host.kernel})" if host.os_name and host.kernel else host.os_name or ""
        ),
        "other_software_stack": ", ".join(software),
    }
    description = {key: known.get(key, "") for key in KEYS}
    for key, value in (given or {}).items():
        if key not in description:
            raise KeyError(f"{key!r} is not a key of an MLPerf system description")
        description[key] = value
    left = [key for key in KEYS if description[key] == ""]
    return description, left
