"""`snapshot` and `diff`: can a benchmark run taken between two snapshots be trusted?

A snapshot is the node's identity plus, per GPU, the memory in use, the
average power over a short window (from NVML's energy counter where the GPU
has one, else the mean of power readings) and the number of compute
processes. The diff says the run cannot be trusted when:

- any identity field differs (driver, VBIOS, clocks, PCIe maximum link,
  GPUs added or gone, host facts): the machine described is not the one
  measured. The current PCIe link generation is not identity (it drops at
  idle) and is shown only for information;
- memory in use after differs from before by more than ``max_memory_delta_mib``
  (either way: memory held at one end and not the other is another job's), or
  average power after is more than ``max_power_delta_w`` above before, or more
  compute processes run after than before: something else was using the GPU.

Power is judged one way on purpose. On an H100 the power of an idle GPU falls
from ~115 W to ~80 W over the seconds after a load ends, so a BEFORE taken
just after earlier work reads high; a fall is reported, not held against the
run. Thresholds are parameters (defaults 512 MiB and 30 W: above the idle
noise of data-centre GPUs, far below what another job adds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.contract.chain import parse_canonical_input
from shared.contract.models import GpuUuid, Version
from shared.contract.models_verify import DYNAMIC_GPU_FIELDS, SystemIdentity, Time, parse_system, record_json
from shared.gpu.gpu_identity import GpuLoad, GpuReader
from shared.plumbing.errors import ContractError


class GpuState(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    uuid: GpuUuid
    index: int = Field(ge=0, le=255)
    memory_used_mib: int | None = Field(default=None, ge=0, le=100_000_000)
    avg_power_w: Annotated[float | None, Field(ge=0, le=100_000)] = None
    energy_mj: int | None = Field(default=None, ge=0, le=2**63)
    processes: int | None = Field(default=None, ge=0, le=100_000)


class Snapshot(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    schema_version: Version = 1
    time: Time
    window_s: float = Field(ge=0, le=3600)
    identity: SystemIdentity
    gpus: list[GpuState] = Field(max_length=256)


def take_snapshot(
    reader: GpuReader,
    hostname: str,
    *,
    window_s: float = 2.0,
    interval_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Snapshot:
    """Identity, then the GPUs' load averaged over `window_s`."""
    from datetime import UTC, datetime

    identity = reader.identity(hostname)
    started = clock()
    first = reader.loads()
    samples: list[list[GpuLoad]] = [first]
    while clock() - started < window_s:
        sleep(interval_s)
        samples.append(reader.loads())
    elapsed = max(clock() - started, 1e-9)
    states = []
    for i, gpu in enumerate(first):
        series = [s[i] for s in samples if i < len(s)]
        last = series[-1]
        readings = [s.power_w for s in series if s.power_w is not None]
        power = sum(readings) / len(readings) if readings else None
        if gpu.energy_mj is not None and last.energy_mj is not None and last.energy_mj > gpu.energy_mj:
            # the energy counter integrates between readings, which instantaneous samples miss
            power = (last.energy_mj - gpu.energy_mj) / 1000 / elapsed
        used = [s.memory_used_mib for s in series if s.memory_used_mib is not None]
        procs = [s.processes for s in series if s.processes is not None]
        states.append(
            GpuState(
                uuid=gpu.uuid,
                index=gpu.index,
                memory_used_mib=max(used) if used else None,
                avg_power_w=round(power, 3) if power is not None and power >= 0 else None,
                energy_mj=last.energy_mj,
                processes=max(procs) if procs else None,
            )
        )
    return Snapshot(time=datetime.now(UTC), window_s=round(elapsed, 3), identity=identity, gpus=states)


def parse_snapshot(raw: bytes | str) -> Snapshot:
    """A snapshot file, strictly validated; ContractError says what is wrong with it."""
    value = parse_canonical_input(raw)
    if "identity" in value:
        parse_system(_json_bytes(value["identity"]))  # the identity hash must hold too
    try:
        return Snapshot.model_validate_json(_json_bytes(value))
    except ValidationError as e:
        first = e.errors()[0]
        raise ContractError(f"{'.'.join(str(p) for p in first['loc']) or 'snapshot'}: {first['msg']}") from e


def _json_bytes(value: object) -> bytes:
    from shared.contract.chain import canonical_bytes

    return canonical_bytes(value)


@dataclass(frozen=True, slots=True)
class Finding:
    trusted: bool  # False: this alone makes the run untrustworthy
    what: str


@dataclass(slots=True)
class DiffReport:
    findings: list[Finding] = field(default_factory=list)

    @property
    def trusted(self) -> bool:
        return all(f.trusted for f in self.findings)

    def render(self) -> str:
        lines = [f"{'ok  ' if f.trusted else 'FAIL'} {f.what}" for f in self.findings]
        verdict = "the run can be trusted" if self.trusted else "the run CANNOT be trusted"
        failed = sum(not f.trusted for f in self.findings)
        return "\n".join([*lines, f"verdict: {verdict} ({failed} problem(s))"])


def _identity_changes(before: SystemIdentity, after: SystemIdentity) -> list[str]:
    a, b = record_json(before), record_json(after)
    changes = []
    for key in ("hostname", "driver_version", "cuda_driver_version", "nvml_version", "p2p"):
        if a[key] != b[key]:
            changes.append(f"{key}: {a[key]!r} -> {b[key]!r}")
    for key, old in a["host"].items():
        if b["host"].get(key) != old:
            changes.append(f"host.{key}: {old!r} -> {b['host'].get(key)!r}")
    old_gpus = {g["uuid"]: g for g in a["gpus"]}
    new_gpus = {g["uuid"]: g for g in b["gpus"]}
    for uuid in sorted(old_gpus.keys() - new_gpus.keys()):
        changes.append(f"GPU {uuid} is gone")
    for uuid in sorted(new_gpus.keys() - old_gpus.keys()):
        changes.append(f"GPU {uuid} appeared")
    for uuid in sorted(old_gpus.keys() & new_gpus.keys()):
        for key, old in old_gpus[uuid].items():
            new = new_gpus[uuid].get(key)
            if key not in DYNAMIC_GPU_FIELDS and new != old:
                changes.append(f"GPU {uuid} {key}: {old!r} -> {new!r}")
    return changes


def diff(
    before: Snapshot, after: Snapshot, *, max_memory_delta_mib: float = 512, max_power_delta_w: float = 30
) -> DiffReport:
    report = DiffReport()
    changes = _identity_changes(before.identity, after.identity)
    report.findings += [Finding(False, f"identity changed: {c}") for c in changes]
    if not changes:
        report.findings.append(
            Finding(
                True,
                f"identity unchanged ({len(after.identity.gpus)} GPU(s), "
                f"sha256 {after.identity.identity_sha256[:16]}…)",
            )
        )
    gap_s = (after.time - before.time).total_seconds()
    old = {g.uuid: g for g in before.gpus}
    for gpu in after.gpus:
        prev = old.get(gpu.uuid)
        if prev is None:
            continue  # already reported as an identity change
        name = f"GPU {gpu.index} ({gpu.uuid})"
        report.findings.append(
            _delta(
                name, "memory used", prev.memory_used_mib, gpu.memory_used_mib, max_memory_delta_mib, "MiB"
            )
        )
        report.findings.append(_power(name, prev.avg_power_w, gpu.avg_power_w, max_power_delta_w))
        if prev.processes is not None and gpu.processes is not None:
            more = gpu.processes > prev.processes
            report.findings.append(
                Finding(not more, f"{name} compute processes: {prev.processes} -> {gpu.processes}")
            )
        if prev.energy_mj is not None and gpu.energy_mj is not None and gap_s > 0:
            used = (gpu.energy_mj - prev.energy_mj) / 1000
            report.findings.append(
                Finding(
                    True,
                    f"{name} used {used:.0f} J between the snapshots "
                    f"({gap_s:.1f} s, {used / gap_s:.1f} W on average)",
                )
            )
    return report


def _delta(name: str, what: str, old: float | None, new: float | None, limit: float, unit: str) -> Finding:
    if old is None or new is None:
        return Finding(True, f"{name} {what}: not reported ({old} -> {new}), not compared")
    change = new - old
    ok = abs(change) <= limit
    return Finding(ok, f"{name} {what}: {old:g} -> {new:g} {unit} ({change:+g} {unit}; limit ±{limit:g})")


def _power(name: str, old: float | None, new: float | None, limit: float) -> Finding:
    if old is None or new is None:
        return Finding(True, f"{name} average power: not reported ({old} -> {new}), not compared")
    change = new - old
    what = f"{name} average power: {old:g} -> {new:g} W ({change:+g} W; limit +{limit:g})"
    if change > limit:
        return Finding(False, f"{what}: something still draws power after the run")
    if change < -limit:
        return Finding(True, f"{what}: fell, the GPU was still cooling down from earlier work at BEFORE")
    return Finding(True, what)
