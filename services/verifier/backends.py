"""GPU compute backends found at run time (PyTorch, CuPy); neither is a dependency of the project.

A backend runs a matrix product on one GPU and times it with the device's own
events after warm-up runs, so host-side launch overhead and the first call's
setup (context, kernels, autotuning) are not measured; the inputs are on the
device before timing starts and the result is copied back only afterwards.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Device:
    index: int  # the backend's own device number (CUDA order)
    uuid: str | None  # "GPU-…", as NVML writes it
    name: str


@dataclass(frozen=True, slots=True)
class Timed:
    result: np.ndarray  # on the host, float32 for half-precision products
    times_ms: list[float]  # one per measured repeat


class Backend(Protocol):
    name: str

    def devices(self) -> list[Device]: ...
    def matmul(
        self, device: int, a: np.ndarray, b: np.ndarray, *, dtype: str, warmup: int, repeats: int
    ) -> Timed: ...


def _uuid_text(raw: Any) -> str | None:
    """NVML's 'GPU-xxxxxxxx-…' form from a backend's UUID (text or 16 bytes)."""
    if raw is None:
        return None
    if isinstance(raw, bytes | bytearray):
        if len(raw) != 16:
            return None
        h = raw.hex()
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    else:
        text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


class TorchBackend:
    name = "torch"

    def __init__(self) -> None:
        self.torch = importlib.import_module("torch")

    def devices(self) -> list[Device]:
        torch = self.torch
        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            out.append(Device(i, _uuid_text(getattr(props, "uuid", None)), str(props.name)))
        return out

    def matmul(
        self, device: int, a: np.ndarray, b: np.ndarray, *, dtype: str, warmup: int, repeats: int
    ) -> Timed:
        torch = self.torch
        dev = torch.device("cuda", device)
        kind = getattr(torch, dtype)
        # TF32 would trade float32 accuracy for speed; the check is of float32 itself.
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            with torch.cuda.device(dev):
                x = torch.from_numpy(a).to(dev).to(kind)
                y = torch.from_numpy(b).to(dev).to(kind)
                out = x @ y
                for _ in range(warmup):
                    out = x @ y
                torch.cuda.synchronize(dev)
                events = [
                    (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                    for _ in range(repeats)
                ]
                for start, end in events:
                    start.record()
                    out = x @ y
                    end.record()
                torch.cuda.synchronize(dev)
                times = [float(start.elapsed_time(end)) for start, end in events]
                host = out.float().cpu().numpy() if dtype in ("float16", "bfloat16") else out.cpu().numpy()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        return Timed(result=host, times_ms=times)


class CupyBackend:
    name = "cupy"

    def __init__(self) -> None:
        self.cp = importlib.import_module("cupy")

    def devices(self) -> list[Device]:
        cp = self.cp
        try:
            count = int(cp.cuda.runtime.getDeviceCount())
        except cp.cuda.runtime.CUDARuntimeError:
            return []
        out = []
        for i in range(count):
            props = cp.cuda.runtime.getDeviceProperties(i)
            name = props.get("name", b"")
            out.append(
                Device(
                    i, _uuid_text(props.get("uuid")), name.decode() if isinstance(name, bytes) else str(name)
                )
            )
        return out

    def matmul(
        self, device: int, a: np.ndarray, b: np.ndarray, *, dtype: str, warmup: int, repeats: int
    ) -> Timed:
        cp = self.cp
        if dtype == "bfloat16":
            raise ValueError("CuPy has no bfloat16")
        with cp.cuda.Device(device):
            x = cp.asarray(a).astype(dtype)
            y = cp.asarray(b).astype(dtype)
            out = x @ y
            for _ in range(warmup):
                out = x @ y
            cp.cuda.Device(device).synchronize()
            events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeats)]
            for start, end in events:
                start.record()
                out = x @ y
                end.record()
            cp.cuda.Device(device).synchronize()
            times = [float(cp.cuda.get_elapsed_time(start, end)) for start, end in events]
            host = cp.asnumpy(out.astype("float32") if dtype == "float16" else out)
        return Timed(result=host, times_ms=times)


BACKENDS: dict[str, type[TorchBackend] | type[CupyBackend]] = {"torch": TorchBackend, "cupy": CupyBackend}


def find_backend(preferred: str = "auto") -> tuple[Backend | None, list[str]]:
    """The first backend that imports and sees a GPU; otherwise None and why each was passed over."""
    names = list(BACKENDS) if preferred == "auto" else [preferred]
    reasons: list[str] = []
    for name in names:
        cls = BACKENDS.get(name)
        if cls is None:
            reasons.append(f"{name}: unknown backend (choose from {', '.join(BACKENDS)})")
            continue
        try:
            backend = cls()
            if backend.devices():
                return backend, reasons
            reasons.append(f"{name}: installed, but it sees no GPU")
        except ImportError:
            reasons.append(f"{name}: not installed")
        except Exception as e:  # a broken CUDA install raises all kinds of things
            reasons.append(f"{name}: {type(e).__name__}: {e}")
    return None, reasons
