"""`python -m services.remediator`: act on verdicts per the policy; dry-run unless told otherwise.

Exit status: 0 after SIGTERM/SIGINT (what was in hand finished and recorded),
1 when it cannot start (the /metrics port, the database), 2 for invalid
settings, policy, node map or kubeconfig.
"""

from __future__ import annotations

import logging
import sys

from shared.plumbing.running import run_service

from .build import RemediatorService
from .settings import RemediatorSettings

log = logging.getLogger("services.remediator")


def main() -> int:
    return run_service(RemediatorSettings, "remediator", RemediatorService, log=log)


if __name__ == "__main__":
    sys.exit(main())
