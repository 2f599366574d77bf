"""Transformers Trainer callback: checks the GPUs every N seconds, stops via `control.should_training_stop`.

Importing this module without `transformers` installed raises ImportError
saying what to install.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as e:
    raise ImportError("gpuhealth.training.transformers needs Transformers: pip install transformers") from e

from .session import Andon, andon_for

log = logging.getLogger(__name__)


class AndonCallback(TrainerCallback):
    """`Trainer(..., callbacks=[AndonCallback(every_s=30, stop_on={"thermal"}, on_alert=...)])`."""

    def __init__(self, andon: Andon | None = None, **andon_options: Any) -> None:
        self.andon, self._owned = andon_for(andon, andon_options)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.andon.tick() and not control.should_training_stop:
            log.error("gpuhealth: asking the Trainer to stop: %s", self.andon.stop_alert)
            control.should_training_stop = True
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._owned:
            self.andon.close()
