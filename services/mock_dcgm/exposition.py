"""Renders a node in dcgm-exporter's Prometheus text format.

Same shape as the real exporter: `# HELP` and `# TYPE` per field, one line per
GPU, labels in its order (gpu, UUID, pci_bus_id, device, modelName, Hostname,
DCGM_FI_DRIVER_VERSION, then container/namespace/pod when workload mapping is
on), integers for DCGM's int64 fields and six decimals for fp64 ones. A field
the model does not support carries DCGM's not-supported sentinel, as DCGM
reports it. Only with an accelerated clock does a line carry a timestamp (ms
of simulated time); the real exporter never writes one.
"""

from __future__ import annotations

from shared.gpu.dcgm import FIELDS, ValueKind

from .simulation import GpuSim, NodeSim

_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})

# HELP/TYPE headers never change: built once.
_HEADERS = {f.name: f"# HELP {f.name} {f.help}\n# TYPE {f.name} {f.prom_type.value}\n" for f in FIELDS}


def label_value(value: str) -> str:
    return value.translate(_ESCAPES)


def gpu_labels(gpu: GpuSim, hostname: str, driver_version: str, *, workload: bool) -> str:
    parts = [
        f'gpu="{gpu.index}"',
        f'UUID="{gpu.uuid}"',
        f'pci_bus_id="{gpu.pci_bus_id}"',
        f'device="nvidia{gpu.index}"',
        f'modelName="{label_value(gpu.model.name)}"',
        f'Hostname="{label_value(hostname)}"',
        f'DCGM_FI_DRIVER_VERSION="{label_value(driver_version)}"',
    ]
    if workload:
        job = gpu.job
        parts += [
            f'container="{label_value(job.container) if job else ""}"',
            f'namespace="{label_value(job.namespace) if job else ""}"',
            f'pod="{label_value(job.pod) if job else ""}"',
        ]
    return "{" + ",".join(parts) + "}"


def render_node(
    node: NodeSim,
    *,
    driver_version: str,
    workload_labels: bool = True,
    timestamp_ms: int | None = None,
) -> str:
    """The node's exposition at its GPUs' current state (advance them first)."""
    suffix = f" {timestamp_ms}\n" if timestamp_ms is not None else "\n"
    rows = []
    for gpu in node.gpus:
        if not gpu.present:
            continue  # fallen off the bus: its series disappear
        rows.append(
            (
                gpu_labels(gpu, node.hostname, driver_version, workload=workload_labels),
                gpu.values(),
                gpu.model.unsupported,
            )
        )
    out: list[str] = []
    for field in FIELDS:
        out.append(_HEADERS[field.name])
        is_int = field.kind is ValueKind.INT64
        for labels, values, unsupported in rows:
            value = values.get(field.sample_field)
            if value is None or field.name in unsupported:
                text = str(field.not_supported()) if is_int else f"{field.not_supported():f}"
            elif is_int:
                text = str(int(value))
            else:
                text = f"{value:f}"
            out.append(f"{field.name}{labels} {text}{suffix}")
    return "".join(out)
