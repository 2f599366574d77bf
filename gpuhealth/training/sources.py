"""The library's only door into the collector: its NVML source, and nvidia-smi where NVML is absent.

Only the sources' public read interface is used (`NvmlSource(nvml)`,
`SmiSource(runner)`, `read()` -> `SourceReading`, `close()`), so the collector
can change how it queries the GPU without the library noticing.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any, Literal

from gpuhealth.gpu.nvml_source import NvmlSource
from gpuhealth.gpu.readings import GpuReading, GpuSource, SourceError, SourceReading
from gpuhealth.gpu.smi_source import Runner, SmiSource, run_nvidia_smi

__all__ = ["GpuReading", "GpuSource", "SourceError", "SourceKind", "SourceReading", "open_source"]

log = logging.getLogger(__name__)

SourceKind = Literal["auto", "nvml", "smi"]


def open_source(
    kind: SourceKind = "auto", *, nvml: Any | None = None, smi_runner: Runner | None = None
) -> GpuSource:
    """NVML (the `pynvml` module, or `nvml` when given), falling back to nvidia-smi under `auto`.

    Raises SourceError when neither can be used.
    """
    if kind not in ("auto", "nvml", "smi"):
        raise SourceError(f"unknown GPU source {kind!r}: use auto, nvml or smi")
    if kind in ("auto", "nvml"):
        try:
            return NvmlSource(nvml)
        except (SourceError, ImportError, OSError) as e:
            if kind == "nvml":
                raise SourceError(f"NVML is not usable: {e}") from e
            log.info("NVML is not usable (%s); falling back to nvidia-smi", e)
    if smi_runner is None and shutil.which("nvidia-smi") is None:
        raise SourceError("no GPU source: NVML is not usable and nvidia-smi is not on PATH")
    return SmiSource(smi_runner or run_nvidia_smi)
