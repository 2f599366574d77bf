"""Real kernel lines, judged as NVIDIA does (tests/data/xid/corpus/kernel-lines.csv).

Each row is a line as a public source printed it (driver bug reports, peers' published
fixtures and changelogs, an operator's fleet report), with the source beside it, and
the reading NVIDIA's catalogue gives that one line: the XID, the GPU's PCI address, and
NVIDIA's action (`nvidia`: a resolution bucket of the catalogue or of the NVLink decode
table; `-` where one line does not settle it, e.g. an XID 45 whose cause's line is
elsewhere, or an XID 74 whose bits count only when repeated). `why` says which row of
the catalogue decides. A `\\n` in a line is a newline inside one kernel record.

The test reads every line as the collector does (the kernel log feed's parser) and
judges it as the scorer does (one occurrence on a GPU with nothing else). The action
must be NVIDIA's, through this project's one mapping of NVIDIA's buckets
(`[xid_catalog.nvidia_actions]`), or differ where the catalogue row says why (its
reviewed `reason`).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from services.collector.kernel_log import parse_xid_line
from services.scorer.features import XidCounts, XidEvent
from services.scorer.rules import evaluate
from tests.helpers.scorer import HEALTHY, NOW, RULES
from tests.paths import DATA

CORPUS = DATA / "xid" / "corpus" / "kernel-lines.csv"
AT = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Line:
    source: str
    line: str
    code: int
    pci: str
    nvidia: str
    why: str


def corpus() -> list[Line]:
    with CORPUS.open(newline="", encoding="utf-8") as f:
        return [
            Line(r["source"], r["line"].replace("\\n", "\n"), int(r["code"]), r["pci"], r["nvidia"], r["why"])
            for r in csv.DictReader(f)
        ]


LINES = corpus()


def judged(line: Line) -> tuple[str, str | None, dict[str, Any]]:
    """The scorer's xid verdict for this one line's XID on a GPU with nothing else, and its rule."""
    read = parse_xid_line(line.line, AT)
    assert read is not None
    stamp = NOW.isoformat()
    gpu = replace(
        HEALTHY,
        model="NVIDIA GB200" if read.xid >= 144 else HEALTHY.model,
        driver_version=None,  # the corpus does not say which driver wrote a line
        xids={read.xid: XidCounts(1, 1, 1, (stamp,))},
        xid_events={read.xid: (XidEvent(NOW, "kmsg", read.message),)}
        if read.xid in RULES.xid and RULES.xid[read.xid].workflow
        else {},
    )
    verdict = evaluate(gpu, RULES, NOW)["xid"]
    return verdict.action, verdict.rule, verdict.evidence


def test_the_corpus_is_real_lines_from_several_sources() -> None:
    assert len(LINES) >= 60
    assert len({x.source for x in LINES}) >= 12  # documents: issues, pull requests, files
    repositories = {x.source.removeprefix("https://github.com/").split()[0] for x in LINES}
    assert len({"/".join(r.split("/")[:2]) for r in repositories}) >= 5
    assert all(x.source.startswith("https://github.com/") or len(x.source.split()) == 2 for x in LINES)
    assert len({x.line for x in LINES}) == len(LINES)
    # both NVLink5 message generations, prefixes, odd spacing, truncation, a record of several lines
    assert any("Link -1" in x.line for x in LINES)
    assert any(x.line.startswith(("kernel:", "Dec ")) for x in LINES)
    assert any(x.line.startswith("[") for x in LINES)
    assert any("  Fatal   " in x.line for x in LINES)
    assert any("\n" in x.line for x in LINES)
    assert any(x.line.rstrip().endswith(("): 46", "154 (")) for x in LINES)


@pytest.mark.parametrize("line", LINES, ids=[f"{k}-{x.code}" for k, x in enumerate(LINES)])
def test_every_line_is_read_as_the_xid_and_gpu_it_names(line: Line) -> None:
    read = parse_xid_line(line.line, AT)
    assert read is not None, line.line
    assert (read.xid, read.pci_bus_id) == (line.code, line.pci)
    assert read.inferred == ("Xid" not in line.line)  # the driver's own fell-off-the-bus line


def agreement(line: Line) -> str:
    """`agrees`, `differs: reviewed` (the catalogue says why), or `unsettled` (one line does not decide)."""
    if line.nvidia == "-":
        return "unsettled"
    action, _, _ = judged(line)
    mapped = RULES.xid_catalog.mapping().get(line.nvidia)
    if action == mapped:
        return "agrees"
    entry = RULES.xid[line.code]
    assert entry.reason, (
        f"{line.line!r}: {action} is not NVIDIA's {line.nvidia} ({mapped}) and no reason says why"
    )
    return "differs: reviewed"


@pytest.mark.parametrize("line", LINES, ids=[f"{k}-{x.code}" for k, x in enumerate(LINES)])
def test_every_line_takes_nvidias_action_or_a_reviewed_difference(line: Line) -> None:
    agreement(line)


def test_agreement_with_nvidia_per_class() -> None:
    """The figures the closing note reports: per catalogue class, how many settled lines agree."""
    table: dict[str, Counter[str]] = {}
    differing: set[int] = set()
    for line in LINES:
        entry = RULES.xid[line.code]
        kind = "nvlink5" if entry.workflow == "nvlink5" else entry.xid_class
        found = agreement(line)
        table.setdefault(kind, Counter())[found] += 1
        if found == "differs: reviewed":
            differing.add(line.code)
    print({kind: dict(counts) for kind, counts in sorted(table.items())})
    # the one reviewed difference: a lone XID 45 restarts the job, not NVIDIA's fabric manager
    assert differing <= {45}
    assert all(counts["agrees"] for counts in table.values())


def test_a_45_that_names_its_cause_follows_it_not_the_job() -> None:
    for line in (x for x in LINES if "caused by previous Xid" in x.line):
        action, rule, evidence = judged(line)
        assert rule == "xid_45"
        causes = evidence.get("caused_by")
        assert isinstance(causes, list)
        assert causes
        assert "solo" not in evidence, evidence
        cause = RULES.xid[int(causes[0])]
        assert action == cause.action  # its line is not here: the cause's catalogue action
