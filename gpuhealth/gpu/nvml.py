"""One NVML session for each reader of it: init, the GPUs' handles, queries that answer None, shutdown.

The collector's metric source, its process listing and the identity reader
(verifier, gpu-systems) each hold one. As in nvitop, a query the GPU or driver
cannot answer (not supported, no permission, GPU lost, or a binding too old to
have the function) gives None instead of raising, so a value the GPU cannot
give is an explicit null and one missing value never fails a whole read. NVML
counts its inits: a session shuts down once, balancing its own init and never
another reader's. The module (`pynvml`, from nvidia-ml-py) is injected, so
tests run on a fake with no GPU.
"""

from __future__ import annotations

from typing import Any

from .readings import SourceError


class NvmlSession:
    def __init__(self, module: Any | None = None) -> None:
        """Init NVML and take every GPU's handle; SourceError where NVML cannot be used."""
        if module is None:
            try:
                import pynvml  # only hosts with the NVIDIA driver need it
            except ImportError as e:
                raise SourceError("the pynvml module (nvidia-ml-py) is not installed") from e
            module = pynvml
        self.module = module
        self.error: type[Exception] = module.NVMLError
        try:
            module.nvmlInit()
        except self.error as e:
            raise SourceError(f"NVML is not usable here: {e}") from e
        self._open = True
        try:
            self.handles = [module.nvmlDeviceGetHandleByIndex(i) for i in range(module.nvmlDeviceGetCount())]
        except self.error as e:
            self.close()
            raise SourceError(f"NVML is not usable here: {e}") from e

    def query(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """`module.<name>(*args, **kwargs)`; None when the GPU, the driver or the binding cannot answer."""
        fn = getattr(self.module, name, None)
        if fn is None:
            return None
        try:
            return fn(*args, **kwargs)
        except self.error:
            return None

    def close(self) -> None:
        """Shut NVML down, once however often it is called."""
        if self._open:
            self._open = False
            self.query("nvmlShutdown")
