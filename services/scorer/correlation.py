"""What several GPUs showed together, as the scorer judges it: a job's crash is the job's, not its GPUs'.

A job's crash (application XIDs on several GPUs of one job, shared.store.correlated_inputs)
is one finding: one alert, on the first of its GPUs, names the job, its GPUs and hosts;
the GPUs are not judged for those XIDs, so a crashed job neither degrades nor escalates
them. A fault of a host or rack (hardware XIDs or losses on several of its GPUs at once)
is one alert naming the place, beside each GPU's own verdict.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .features import GpuFeatures, XidCounts
from .rules_config import Rules

_SHOWN = 32  # GPUs and hosts listed in an alert's evidence

# scope -> (alert kind, severity, what it points at)
_KINDS = {
    "job": ("job_crash", "warning", "the job's fault, not the GPUs': restart or fix the job"),
    "node": ("node_fault", "critical", "a fault of the host: power, cooling, its PCIe or NVLink switch"),
    "rack": ("rack_fault", "critical", "a fault of the rack: power or cooling shared by its hosts"),
}


def job_owns(gpu: GpuFeatures, code: int, counts: XidCounts, as_of: datetime, rules: Rules) -> bool:
    """Whether every recent occurrence of this application XID on the GPU belongs to a job's crash."""
    crashes = [e for e in gpu.episodes if e.scope == "job" and code in e.codes]
    if not crashes:
        return False
    recent = as_of - timedelta(seconds=rules.xid_clear_s(code))
    times = []
    for text in counts.times:
        try:
            times.append(datetime.fromisoformat(text))
        except ValueError:
            return False
    return all(any(e.first <= t <= e.last for e in crashes) for t in times if t > recent)


def correlated_alerts(g: GpuFeatures) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(kind, severity, summary, evidence) of the alerts this GPU holds for what several GPUs showed:
    the first GPU of an episode holds its one alert."""
    out = []
    # oldest first: a GPU holds one alert per kind, so a job crashing again (or a second fault of
    # the place) within the reach shows its newest crash, whatever order the episodes were read in
    for e in sorted(g.episodes, key=lambda e: (e.last, e.first)):
        if g.gpu_uuid != min(e.gpus):
            continue
        kind, severity, meaning = _KINDS[e.scope]
        codes = ", ".join(str(c) for c in sorted(e.codes)) or "none"
        summary = f"{e.scope} {e.key}: {len(e.gpus)} GPUs on {len(e.hosts)} host(s), XIDs {codes}: {meaning}"
        evidence = {
            e.scope: e.key,
            "gpus": sorted(e.gpus)[:_SHOWN],
            "gpu_count": len(e.gpus),
            "hosts": sorted(e.hosts)[:_SHOWN],
            "xids": sorted(e.codes),
            "signals": e.signals,
            "first": _stamp(e.first),
            "last": _stamp(e.last),
        }
        out.append((kind, severity, summary[:500], evidence))
    return out


def _stamp(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")
