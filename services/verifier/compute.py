"""The compute check: a matrix product on a GPU against the CPU's, judged on correctness and speed.

Verdict rules (every threshold is a parameter):

- **wrong_result**: the GPU's product differs from the CPU reference by more
  than ``rtol`` relative to the reference's largest magnitude, i.e.
  ``max|gpu - cpu| > rtol * max|cpu|``, or it holds NaN/inf. The inputs are
  uniform in [-1, 1), rounded to the checked dtype before both products, so
  the two sides multiply the same numbers. Default ``rtol`` by dtype:
  float64 1e-9, float32 1e-4, float16 1e-2, bfloat16 5e-2 (a broken GPU or
  kernel is off by orders of magnitude more; float32 accumulation over 2000
  terms stays near 1e-6).
- **too_slow**: correct, but the CPU's median time divided by the GPU's
  median time is below ``min_speedup`` (2 by default).
- **pass**: correct and fast enough. **error**: the backend raised.

Timings are medians of ``repeats`` runs after ``warmup`` unmeasured ones. The
CPU reference is numpy's product in float32 (float64 for float64 checks).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared.contract.models_verify import Outcome, ResultSummary

from .backends import Backend, Device

DEFAULT_RTOL = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass(frozen=True, slots=True)
class MatmulSpec:
    m: int = 2000
    k: int = 2000
    n: int = 2000
    dtype: str = "float32"
    warmup: int = 3
    repeats: int = 10
    min_speedup: float = 2.0
    rtol: float | None = None  # None: the dtype's default
    seed: int = 0

    @property
    def tolerance(self) -> float:
        return self.rtol if self.rtol is not None else DEFAULT_RTOL[self.dtype]


@dataclass(frozen=True, slots=True)
class Reference:
    a: np.ndarray
    b: np.ndarray
    product: np.ndarray
    cpu_ms: float


@dataclass(frozen=True, slots=True)
class CheckResult:
    device: Device
    backend: str
    outcome: Outcome
    reason: str | None
    device_ms: float | None
    cpu_ms: float
    speedup: float | None
    max_rel_err: float | None
    result: ResultSummary | None


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` rounded to `dtype` and held in float32 (float64 stays float64)."""
    if dtype == "float64":
        return values.astype(np.float64)
    if dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    x = values.astype(np.float32)
    if dtype == "bfloat16":  # round to nearest even on the top 16 bits
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(
            0xFFFF0000
        )
        return rounded.astype(np.uint32).view(np.float32)
    return x


def reference(spec: MatmulSpec) -> Reference:
    """The inputs and the CPU's product, timed the same way as the GPU's."""
    rng = np.random.default_rng(spec.seed)
    a = round_to(rng.uniform(-1, 1, (spec.m, spec.k)), spec.dtype)
    b = round_to(rng.uniform(-1, 1, (spec.k, spec.n)), spec.dtype)
    product = a @ b
    for _ in range(max(0, spec.warmup - 1)):
        product = a @ b
    times = []
    for _ in range(spec.repeats):
        started = time.perf_counter()
        product = a @ b
        times.append((time.perf_counter() - started) * 1000)
    return Reference(a=a, b=b, product=product, cpu_ms=statistics.median(times))


def _bounded(value: float) -> float | None:
    return value if np.isfinite(value) and abs(value) <= 1e300 else None


def summarize(values: Any) -> ResultSummary:
    """Shape, dtype, finiteness, simple statistics and a digest of a host array."""
    array = np.asarray(values)
    finite = bool(np.isfinite(array).all()) if array.dtype.kind in "fc" else True
    numeric = array.dtype.kind in "biuf" and array.size > 0
    stats: dict[str, float | None] = {"sum": None, "mean": None, "min": None, "max": None}
    if numeric and finite:
        wide = array.astype(np.float64)
        stats = {
            "sum": _bounded(float(wide.sum())),
            "mean": _bounded(float(wide.mean())),
            "min": _bounded(float(wide.min())),
            "max": _bounded(float(wide.max())),
        }
    return ResultSummary(
        shape=[int(d) for d in array.shape],
        dtype=str(array.dtype),
        finite=finite,
        sha256=hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest(),
        **stats,
    )


def judge(
    product: np.ndarray, ref: Reference, spec: MatmulSpec, device_ms: float
) -> tuple[Outcome, str | None, float | None, float]:
    """(outcome, reason, max relative error, speedup) of one GPU product."""
    speedup = ref.cpu_ms / device_ms if device_ms > 0 else float("inf")
    if product.shape != ref.product.shape:
        return Outcome.WRONG_RESULT, f"result shape {product.shape} is not {ref.product.shape}", None, speedup
    if not np.isfinite(product).all():
        return Outcome.WRONG_RESULT, "the GPU's result holds NaN or infinity", None, speedup
    scale = float(np.abs(ref.product).max()) or 1.0
    err = float(np.abs(product.astype(np.float64) - ref.product).max()) / scale
    if err > spec.tolerance:
        return (
            Outcome.WRONG_RESULT,
            f"max relative error {err:.3g} exceeds the tolerance {spec.tolerance:g}",
            err,
            speedup,
        )
    if speedup < spec.min_speedup:
        return (
            Outcome.TOO_SLOW,
            f"{speedup:.2f}x the CPU's speed ({device_ms:.3f} ms vs {ref.cpu_ms:.3f} ms); "
            f"at least {spec.min_speedup:g}x is required",
            err,
            speedup,
        )
    return Outcome.PASS, None, err, speedup


def check_device(backend: Backend, device: Device, ref: Reference, spec: MatmulSpec) -> CheckResult:
    """Run the product on one GPU and judge it; a backend failure is an `error` verdict."""
    try:
        timed = backend.matmul(
            device.index, ref.a, ref.b, dtype=spec.dtype, warmup=spec.warmup, repeats=spec.repeats
        )
    except Exception as e:  # whatever the GPU stack raises is the verdict, not a crash
        return CheckResult(
            device,
            backend.name,
            Outcome.ERROR,
            f"{type(e).__name__}: {e}"[:2000],
            None,
            ref.cpu_ms,
            None,
            None,
            None,
        )
    device_ms = statistics.median(timed.times_ms) if timed.times_ms else 0.0
    outcome, reason, err, speedup = judge(np.asarray(timed.result), ref, spec, device_ms)
    return CheckResult(
        device=device,
        backend=backend.name,
        outcome=outcome,
        reason=reason,
        device_ms=device_ms,
        cpu_ms=ref.cpu_ms,
        speedup=speedup if np.isfinite(speedup) else None,
        max_rel_err=err,
        result=summarize(timed.result),
    )
