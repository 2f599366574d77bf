"""`python -m services.collector`: poll this node's GPUs and publish to Kafka until SIGTERM.

Source choice (GPUHEALTH_COLLECTOR__SOURCE): `dcgm` scrapes dcgm-exporter at
each of `dcgm_urls`; `mock` is the same against the mock fleet (samples say
source=mock); `nvml` and `smi` read the local GPUs; `auto` tries a reachable
dcgm-exporter, then NVML, then nvidia-smi, in that order.

GPUHEALTH_COLLECTOR__KERNEL_LOG (`off`, `auto`, `kmsg`, `journal`, `mock`; default
`off`) adds the kernel log as a second place XIDs come from, beside any source:
it must be this host's log, so it suits nvml/smi/a local dcgm-exporter, not a
collector scraping other nodes (`mock`: each mock fleet node's own, as `make up`
reads them). Where it cannot be read the collector says so and runs without it.
"""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import CollectorService
from .settings import CollectorSettings

__all__ = ["CollectorSettings", "main"]  # the settings stay importable from here (compose checks)

log = logging.getLogger("services.collector")


def main() -> int:
    return run_service(CollectorSettings, "collector", CollectorService, log=log)


if __name__ == "__main__":
    sys.exit(main())
