"""The evaluation's report shows the XID catalogue's agreement with NVIDIA's actions, per class."""

from __future__ import annotations

from evaluation.__main__ import agreement_lines
from services.scorer.rules_config import load_rules


def test_the_report_counts_every_catalogue_code_once_by_class() -> None:
    lines = agreement_lines(load_rules())
    rows = {line.split()[0]: [int(n) for n in line.split()[1:]] for line in lines[2:]}
    assert set(rows) == {"application", "hardware", "driver", "unused"}
    assert sum(row[-1] for row in rows.values()) == 172
    assert all(sum(row[:-1]) == row[-1] for row in rows.values())
