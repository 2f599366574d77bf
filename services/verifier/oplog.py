"""`log_operation(name, input_shape, fn)`: run any user operation and record it in the GPU's chain.

The record says where the result lives (device), how long the operation took
(device synchronised before and after, so queued GPU work is counted), and a
summary of the result (shape, dtype, finiteness, statistics, digest). A result
that comes back on the CPU when a GPU was expected is recorded as an `error`:
it did not run where it was meant to. An exception in `fn` is recorded and
raised again.

    from services.verifier.oplog import OperationLog
    oplog = OperationLog.to_kafka()            # or OperationLog(MemoryChain(), ...)
    y = oplog.log_operation("attention", (8, 512, 64), lambda: attn(q, k, v))
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from shared.contract.models_verify import Outcome, RecordKind, ResultSummary, VerificationRecord

from .backends import Device, find_backend
from .chainlog import Chain
from .compute import summarize

T = TypeVar("T")


def _first_array(value: Any) -> Any:
    """The first tensor-like thing in a result (models return tuples and dicts)."""
    if isinstance(value, dict):
        value = next(iter(value.values()), None)
    if isinstance(value, list | tuple) and value and not isinstance(value[0], int | float):
        return _first_array(value[0])
    return value


def where_is(value: Any) -> tuple[str, int | None]:
    """(device kind, index) of a result: ("cuda", 0) for a GPU tensor, ("cpu", None) otherwise."""
    value = _first_array(value)
    device = getattr(value, "device", None)
    kind = getattr(device, "type", None)
    if kind is not None:  # torch
        return str(kind), getattr(device, "index", None)
    if device is not None and hasattr(device, "id"):  # cupy
        return "cuda", int(device.id)
    return "cpu", None


def to_host(value: Any) -> np.ndarray:
    value = _first_array(value)
    if hasattr(value, "detach"):  # torch: half types widened, numpy has no bfloat16
        tensor = value.detach()
        if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
            tensor = tensor.float()
        return np.asarray(tensor.cpu().numpy())
    if hasattr(value, "get") and hasattr(value, "device"):  # cupy
        return np.asarray(value.get())
    return np.asarray(value)


class OperationLog:
    def __init__(
        self,
        chain: Chain,
        *,
        devices: Sequence[Device],
        hostname: str | None = None,
        verifier_id: str | None = None,
        synchronize: Callable[[], None] = lambda: None,
        backend: str | None = None,
    ) -> None:
        self.chain, self.devices = chain, list(devices)
        self.hostname = hostname or socket.gethostname()
        self.verifier_id = verifier_id or self.hostname
        self.synchronize, self.backend = synchronize, backend

    @classmethod
    def to_kafka(cls, topic: str | None = None, backend: str = "auto") -> OperationLog:
        """A log on the configured broker (GPUHEALTH_KAFKA__*) for this host's GPUs, on `topic` (by
        default GPUHEALTH_TOPICS__VERIFICATIONS)."""
        from .build import kafka_chain
        from .settings import load_verifier_settings

        found, reasons = find_backend(backend)
        if found is None:
            raise RuntimeError(f"no GPU backend: {'; '.join(reasons)}")
        sync = getattr(getattr(found, "torch", None), "cuda", None)
        return cls(
            kafka_chain(load_verifier_settings(), topic),
            devices=found.devices(),
            synchronize=sync.synchronize if sync is not None else lambda: None,
            backend=found.name,
        )

    def _device(self, index: int | None) -> Device:
        for device in self.devices:
            if device.index == (index or 0):
                return device
        raise LookupError(f"no GPU {index} among {[d.index for d in self.devices]}")

    def log_operation(
        self, name: str, input_shape: Sequence[int], fn: Callable[[], T], *, gpu: int | None = None
    ) -> T:
        """Run `fn`, record it on the GPU it ran on (or `gpu`), and return its result."""
        self.synchronize()
        started = time.perf_counter()
        try:
            result = fn()
            self.synchronize()
        except Exception as e:
            elapsed = (time.perf_counter() - started) * 1000
            self._record(
                name,
                input_shape,
                self._device(gpu),
                "cuda",
                elapsed,
                Outcome.ERROR,
                f"{type(e).__name__}: {e}"[:2000],
                None,
            )
            raise
        elapsed = (time.perf_counter() - started) * 1000
        kind, index = where_is(result)
        device = self._device(index if gpu is None else gpu)
        summary = summarize(to_host(result))
        if kind == "cpu":
            self._record(
                name,
                input_shape,
                device,
                "cpu",
                elapsed,
                Outcome.ERROR,
                "the result is on the CPU: the operation did not run on the GPU",
                summary,
            )
        else:
            self._record(
                name, input_shape, device, f"{kind}:{device.index}", elapsed, Outcome.RECORDED, None, summary
            )
        return result

    def _record(
        self,
        name: str,
        input_shape: Sequence[int],
        device: Device,
        where: str,
        elapsed_ms: float,
        outcome: Outcome,
        reason: str | None,
        summary: ResultSummary | None,
    ) -> VerificationRecord:
        return self.chain.append(
            {
                "kind": RecordKind.OPERATION,
                "gpu_uuid": device.uuid,
                "hostname": self.hostname,
                "verifier_id": self.verifier_id,
                "gpu_index": device.index,
                "gpu_model": device.name or None,
                "name": name,
                "backend": self.backend,
                "device": where,
                "input_shape": list(input_shape),
                "dtype": summary.dtype if summary else None,
                "outcome": outcome,
                "reason": reason,
                "device_ms": elapsed_ms,
                "repeats": 1,
                "warmup": 0,
                "result": summary,
            }
        )


_default: OperationLog | None = None


def log_operation(name: str, input_shape: Sequence[int], fn: Callable[[], T], *, gpu: int | None = None) -> T:
    """`OperationLog.log_operation` on a log to the configured broker, opened on first use."""
    global _default
    if _default is None:
        _default = OperationLog.to_kafka()
    return _default.log_operation(name, input_shape, fn, gpu=gpu)
