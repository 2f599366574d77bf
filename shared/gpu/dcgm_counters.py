"""dcgm-exporter's counters file for `docker compose --profile gpu`, written from shared/gpu/dcgm.py.

dcgm-exporter's default list leaves out fields the scorer's rules read (volatile
ECC, retired pages, NVLink errors, clock-event reasons, power limit, slowdown
temperature). The compose file mounts this file instead, so a real node exports
every field the collector maps. Regenerate after changing ``shared.gpu.dcgm.FIELDS``:

    python -m shared.gpu.dcgm_counters
"""

from __future__ import annotations

import sys
from pathlib import Path

from shared.gpu.dcgm import FIELDS

COUNTERS_CSV = Path(__file__).resolve().parents[2] / "deploy" / "dcgm-exporter" / "gpu-health-counters.csv"


def render() -> str:
    """The counters file: one `DCGM field, Prometheus type, help` line per field."""
    lines = [
        "# Written by `python -m shared.gpu.dcgm_counters` from shared/gpu/dcgm.py: every DCGM field",
        "# gpu-health maps into a sample. Format: DCGM field, Prometheus metric type, help.",
    ]
    # The help text is the last field: a comma in it would make a fourth one.
    lines += [f"{f.name}, {f.prom_type.value}, {f.help.replace(',', ';')}" for f in FIELDS]
    return "\n".join(lines) + "\n"


def main() -> int:
    COUNTERS_CSV.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
