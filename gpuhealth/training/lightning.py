"""PyTorch Lightning callback: checks the GPUs every N seconds and stops through `trainer.should_stop`.

Imports `lightning.pytorch` (or the older `pytorch_lightning`); importing this
module without either installed raises ImportError saying what to install.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as e:
        raise ImportError(
            "gpuhealth.training.lightning needs PyTorch Lightning: pip install lightning"
        ) from e

from .session import Andon, andon_for

log = logging.getLogger(__name__)


class AndonCallback(Callback):  # type: ignore[misc]
    """`AndonCallback(every_s=30, stop_on={"thermal"}, on_alert=...)` or `AndonCallback(andon)`."""

    def __init__(self, andon: Andon | None = None, **andon_options: Any) -> None:
        super().__init__()
        self.andon, self._owned = andon_for(andon, andon_options)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stop = self.andon.tick()
        if getattr(trainer, "world_size", 1) > 1:
            # every rank must stop at the same step, or the others wait for it forever
            stop = bool(trainer.strategy.reduce_boolean_decision(stop, all=False))
        if stop and not trainer.should_stop:
            log.error("gpuhealth: asking Lightning to stop: %s", self.andon.stop_alert)
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._owned:
            self.andon.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self._owned:
            self.andon.close()
