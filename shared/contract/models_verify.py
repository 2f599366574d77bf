"""The contracts of `gpu-verifications` (chained check records) and `gpu-systems` (node identity).

Pydantic models are the source of truth; ``python -m shared.contract.topic_registry``
writes their JSON Schemas under ``schema/json/`` (a test keeps them in step).
Times are UTC with milliseconds, written as every topic writes them
(:mod:`gpuhealth.contract.wire_time`: ``2026-11-22T18:00:00.123000Z``). A value
the machine cannot report is ``null``, never a guess. Validation is strict in
the same way as :mod:`shared.contract.models`: wrong types, NaN/inf, unknown fields and
unknown schema versions are refused with the field named; a record's size and
nesting are bounded (gpuhealth.contract.jsonlimits) before it is parsed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from gpuhealth.contract.base import (
    SCHEMA_VERSION,
    GpuUuid,
    Label,
    StrictModel,
    TopicMessage,
    UtcTime,
    error_reason,
)
from gpuhealth.contract.jsonlimits import check_bounds
from shared.contract.chain import canonical_bytes, link_of, parse_canonical_input
from shared.plumbing.errors import ContractError

Time = UtcTime  # UTC, milliseconds, written by gpuhealth.contract.wire_time like every topic's times
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, Field(max_length=2000, pattern=r"^[^\x00]*$")]
Finite = Annotated[float, Field(ge=-1e300, le=1e300)]
Millis = Annotated[float | None, Field(ge=0, le=86_400_000)]
Dim = Annotated[int, Field(ge=0, le=2**40)]


class RecordKind(StrEnum):
    COMPUTE_CHECK = "compute_check"  # a matrix product checked against the CPU
    OPERATION = "operation"  # a user operation logged through log_operation()


class Outcome(StrEnum):
    PASS = "pass"  # noqa: S105 (a verdict, not a password)
    WRONG_RESULT = "wrong_result"
    TOO_SLOW = "too_slow"
    ERROR = "error"
    RECORDED = "recorded"  # an operation that ran; it has no reference to be judged against


class ResultSummary(StrictModel):
    """What came out, without the data: enough to compare runs and spot NaN/garbage."""

    shape: list[Dim] = Field(max_length=16)
    dtype: Label
    finite: bool
    sum: Finite | None = None
    mean: Finite | None = None
    min: Finite | None = None
    max: Finite | None = None
    sha256: Sha256 | None = None  # of the result's bytes as the device produced them


class VerificationRecord(TopicMessage):
    """One check or operation on one GPU, chained to that GPU's previous record."""

    kind: RecordKind
    time: Time
    gpu_uuid: GpuUuid
    seq: int = Field(ge=0, le=2**62)
    prev_sha256: Sha256
    hostname: Label
    verifier_id: Label
    gpu_index: int | None = Field(default=None, ge=0, le=255)
    gpu_model: Label | None = None
    name: Label
    backend: Label | None = None
    device: Label
    input_shape: list[Dim] = Field(default_factory=list, max_length=16)
    dtype: Label | None = None
    outcome: Outcome
    reason: Text | None = None
    # timing (milliseconds, median of `repeats` after `warmup` unmeasured runs)
    device_ms: Millis = None
    cpu_ms: Millis = None
    speedup: Annotated[float | None, Field(ge=0, le=1e9)] = None
    repeats: int | None = Field(default=None, ge=1, le=100_000)
    warmup: int | None = Field(default=None, ge=0, le=100_000)
    # the judgement's terms
    rtol: Annotated[float | None, Field(ge=0, le=1)] = None
    max_rel_err: Annotated[float | None, Field(ge=0)] = None
    min_speedup: Annotated[float | None, Field(ge=0, le=1e6)] = None
    result: ResultSummary | None = None


class NvLink(StrictModel):
    link: int = Field(ge=0, le=63)
    active: bool | None = None
    version: int | None = Field(default=None, ge=0, le=100)
    remote_pci_bus_id: Label | None = None


class GpuIdentity(StrictModel):
    """What a GPU is (not how it is doing): fixed for the life of a node's configuration."""

    index: int = Field(ge=0, le=255)
    uuid: GpuUuid
    model: Label | None = None
    serial: Label | None = None
    pci_bus_id: Label | None = None
    vbios_version: Label | None = None
    compute_capability: Label | None = None
    max_sm_clock_mhz: int | None = Field(default=None, ge=0, le=20_000)
    max_mem_clock_mhz: int | None = Field(default=None, ge=0, le=50_000)
    memory_total_mib: int | None = Field(default=None, ge=0, le=100_000_000)
    pcie_gen_max: int | None = Field(default=None, ge=1, le=10)
    pcie_width_max: int | None = Field(default=None, ge=1, le=64)
    pcie_bandwidth_max_gbps: float | None = Field(default=None, ge=0, le=10_000)
    # The current link generation drops at idle to save power: it is reported, but
    # not part of the identity that must match before and after a run.
    pcie_gen_current: int | None = Field(default=None, ge=1, le=10)
    pcie_width_current: int | None = Field(default=None, ge=1, le=64)
    pcie_bandwidth_current_gbps: float | None = Field(default=None, ge=0, le=10_000)
    nvlinks: list[NvLink] | None = Field(default=None, max_length=64)


class HostIdentity(StrictModel):
    cpu_model: Label | None = None
    cpu_sockets: int | None = Field(default=None, ge=1, le=1024)
    cpu_cores: int | None = Field(default=None, ge=1, le=1_000_000)  # physical
    cpu_threads: int | None = Field(default=None, ge=1, le=1_000_000)  # logical
    memory_total_bytes: int | None = Field(default=None, ge=0, le=2**60)
    os_name: Label | None = None
    kernel: Label | None = None
    architecture: Label | None = None


# Fields that change at run time without the machine changing: left out of the identity hash.
DYNAMIC_GPU_FIELDS = frozenset({"pcie_gen_current", "pcie_bandwidth_current_gbps"})


class SystemIdentity(TopicMessage):
    """A node's hardware and driver identity (gpu-systems, keyed by hostname)."""

    time: Time
    hostname: Label
    source: Literal["nvml", "smi", "none"]
    collector_id: Label | None = None
    host: HostIdentity
    driver_version: Label | None = None
    cuda_driver_version: Label | None = None
    nvml_version: Label | None = None
    gpus: list[GpuIdentity] = Field(default_factory=list, max_length=256)
    # p2p[i][j]: can GPU i read GPU j's memory ("ok", or NVML's reason it cannot); null if unknown
    p2p: list[list[Label | None]] | None = Field(default=None, max_length=256)
    identity_sha256: Sha256

    @staticmethod
    def identity_digest(fields: dict[str, Any]) -> str:
        """The hash of what must not change: everything but time, collector and dynamic fields."""
        kept = {k: v for k, v in fields.items() if k not in {"time", "collector_id", "identity_sha256"}}
        kept["gpus"] = [
            {k: v for k, v in gpu.items() if k not in DYNAMIC_GPU_FIELDS} for gpu in kept.get("gpus", [])
        ]
        return link_of(kept)


def record_json(model: BaseModel) -> dict[str, Any]:
    """The message value: JSON-ready, every field present (nulls kept)."""
    return model.model_dump(mode="json")


def record_bytes(model: BaseModel) -> bytes:
    """The canonical bytes a producer writes (see shared.contract.chain)."""
    return canonical_bytes(record_json(model))


def _validate(model: type[StrictModel], raw: bytes | str) -> Any:
    check_bounds(raw)  # size and nesting, before any parser recurses into it
    value = parse_canonical_input(raw)
    if value.get("schema_version") != SCHEMA_VERSION or isinstance(value.get("schema_version"), bool):
        raise ContractError(f"unknown schema_version {value.get('schema_version')!r}")
    try:
        return model.model_validate_json(canonical_bytes(value))
    except ValidationError as e:
        raise ContractError(error_reason(e)) from e


def parse_verification(raw: bytes | str) -> VerificationRecord:
    """Validate one gpu-verifications message; ContractError says why it is refused."""
    record: VerificationRecord = _validate(VerificationRecord, raw)
    return record


def parse_system(raw: bytes | str) -> SystemIdentity:
    """Validate one gpu-systems message, including its identity hash."""
    system: SystemIdentity = _validate(SystemIdentity, raw)
    if SystemIdentity.identity_digest(record_json(system)) != system.identity_sha256:
        raise ContractError("identity_sha256 does not match the identity it describes")
    return system
