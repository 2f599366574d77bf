"""Andon for training jobs: watch the job's GPUs from the training script, alert, and stop on request.

    from gpuhealth.training import Andon, AndonChecker, GpuMonitor, sparkline
    from gpuhealth.training.lightning import AndonCallback      # or .transformers, .keras

The framework modules are imported only when asked for, so this package needs
none of the frameworks.
"""

from __future__ import annotations

from .andon import Alert, AlertKind, AndonChecker, CheckResult
from .exporter import AndonExporter
from .monitor import GpuMonitor, GpuStatus
from .publish import AlertPublisher, job_from_env
from .session import Andon
from .sources import SourceError, open_source
from .sparkline import sparkline
from .thresholds import AndonThresholds

__all__ = [
    "Alert",
    "AlertKind",
    "AlertPublisher",
    "Andon",
    "AndonChecker",
    "AndonExporter",
    "AndonThresholds",
    "CheckResult",
    "GpuMonitor",
    "GpuStatus",
    "SourceError",
    "job_from_env",
    "open_source",
    "sparkline",
]
