"""Keras callback: checks the GPUs every N seconds and stops through `model.stop_training`.

Imports Keras 3 (`keras`), else `tensorflow.keras`; importing this module
without either raises ImportError saying what to install.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from keras.callbacks import Callback
except ImportError:
    try:
        from tensorflow.keras.callbacks import Callback
    except ImportError as e:
        raise ImportError("gpuhealth.training.keras needs Keras: pip install keras") from e

from .session import Andon, andon_for

log = logging.getLogger(__name__)


class AndonCallback(Callback):  # type: ignore[misc]
    """`model.fit(..., callbacks=[AndonCallback(every_s=30, stop_on={"thermal"}, on_alert=...)])`."""

    def __init__(self, andon: Andon | None = None, **andon_options: Any) -> None:
        super().__init__()
        self.andon, self._owned = andon_for(andon, andon_options)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.andon.tick() and not self.model.stop_training:
            log.error("gpuhealth: asking Keras to stop: %s", self.andon.stop_alert)
            self.model.stop_training = True

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._owned:
            self.andon.close()
