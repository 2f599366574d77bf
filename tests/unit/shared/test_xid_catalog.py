"""The XID catalogue against NVIDIA's: every code present, its facts unchanged, each difference explained.

tests/data/xid/xid-catalog-facts.csv is a committed copy of the facts extracted from
NVIDIA's catalogue spreadsheet: updating it (or config/xid-catalog.csv) is a reviewed
diff, and this test says which rows no longer agree.
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scorer.rules import evaluate
from services.scorer.rules_config import DEFAULT_RULES, load_rules
from shared.contract.models_health import LADDER
from shared.gpu.xid_catalog import (
    CATALOG_MODELS,
    COLUMNS,
    agreement_of,
    agreement_table,
    catalog_family,
    check_against_mapping,
    load_catalog,
    parse_catalog,
)
from shared.plumbing.errors import ConfigError
from tests.helpers.scorer import HEALTHY, NOW

FACTS = Path(__file__).resolve().parents[2] / "data" / "xid" / "xid-catalog-facts.csv"
RULES = load_rules()
MAPPING = RULES.xid_catalog.mapping()
CATALOG_FILE = DEFAULT_RULES.parent / RULES.xid_catalog.file


def _one_line(text: str) -> str:
    """The reference keeps line breaks inside cells; the catalogue writes them as '; '."""
    return "; ".join(" ".join(part.split()) for part in text.splitlines() if part.strip())


def _facts() -> dict[int, dict[str, str]]:
    with FACTS.open(newline="", encoding="utf-8") as f:
        return {int(row["code"]): row for row in csv.DictReader(f)}


def test_every_code_of_nvidias_catalogue_is_present_and_its_facts_agree() -> None:
    facts = _facts()
    assert len(facts) == 172
    assert sorted(RULES.xid) == sorted(facts)  # 172 of 172, nothing extra
    disagreements = []
    for code, fact in facts.items():
        entry = RULES.xid[code]
        models = frozenset(m for m in CATALOG_MODELS if fact[m] == "YES")
        mine = (entry.mnemonic, entry.models, entry.nvidia_action, entry.nvidia_investigation)
        theirs = (
            " ".join(fact["mnemonic"].split()),
            models,
            fact["immediate_action"].strip(),
            _one_line(fact["investigatory_action"]),
        )
        if mine != theirs:
            disagreements.append((code, mine, theirs))
    assert disagreements == []


def test_each_action_is_nvidias_mapped_or_says_why() -> None:
    check_against_mapping(RULES.xid.values(), MAPPING)
    for entry in RULES.xid.values():
        kind = agreement_of(entry, MAPPING)
        if kind != "agrees":
            assert entry.reason, entry.code
        if kind == "workflow":
            assert entry.workflow is not None
        # a code NVIDIA lists for no current GPU is the "unused" class, whatever it once meant
        assert (entry.xid_class == "unused") == (not entry.models), entry.code
    table = agreement_table(RULES.xid.values(), MAPPING)
    assert sum(n for row in table.values() for n in row.values()) == 172
    # the differences are few and each is deliberate
    assert {e.code for e in RULES.xid.values() if agreement_of(e, MAPPING) == "differs"} == {157}


def test_the_codes_the_old_list_got_wrong_now_follow_nvidia() -> None:
    assert RULES.xid[63].action == "none"
    assert RULES.xid[63].severity == "info"
    assert RULES.xid[64].action == "reset_gpu"
    assert RULES.xid[109].action == "reset_gpu"
    assert RULES.xid[92].action == RULES.xid[43].action == "none"
    assert RULES.xid[79].action == "reboot_node"
    assert RULES.xid_clear_s(13) == 3600
    assert RULES.xid_clear_s(48) == RULES.windows.xid_s


def test_an_unknown_code_is_inspect_and_its_evidence_names_it() -> None:
    verdict = evaluate(replace(HEALTHY, xids={4242: (1, 1)}), RULES, NOW)["xid"]
    assert (verdict.state, verdict.rule, verdict.action) == ("degraded", "xid_4242", "inspect")
    assert verdict.evidence["xid"] == 4242
    assert verdict.evidence["in_catalogue"] is False
    assert "4242" in verdict.evidence["name"]


def test_a_known_codes_evidence_carries_nvidias_facts_beside_ours() -> None:
    h100 = replace(HEALTHY, xids={144: (1, 1)})  # an NVLink5 code NVIDIA lists only for Blackwell
    evidence = evaluate(h100, RULES, NOW)["xid"].evidence
    assert evidence["mnemonic"] == "NVLINK_SAW_ERROR"
    assert evidence["nvidia_action"] == "WORKFLOW_NVLINK5_ERR"
    assert evidence["listed_for_model"] is False
    assert evidence["differs_because"]
    assert (
        evaluate(replace(HEALTHY, xids={79: (1, 1)}), RULES, NOW)["xid"].evidence["listed_for_model"] is True
    )


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h100"),
        ("NVIDIA GH200 480GB", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b100"),
        ("NVIDIA GB200", "gb200"),
        ("Tesla V100-SXM2-32GB", None),
        ("", None),
    ],
)
def test_models_fall_under_the_catalogues_columns(model: str, family: str | None) -> None:
    assert catalog_family(model) == family


@settings(max_examples=200)
@given(code=st.integers(min_value=-(2**31), max_value=2**31), recent=st.integers(min_value=1, max_value=50))
def test_any_code_gets_a_verdict_no_weaker_than_its_catalogue_action(code: int, recent: int) -> None:
    verdict = evaluate(replace(HEALTHY, xids={code: (recent, recent)}), RULES, NOW)["xid"]
    entry = RULES.xid.get(code)
    if entry is None:
        assert (verdict.state, verdict.action) == ("degraded", "inspect")
        assert verdict.evidence["xid"] == code
    elif entry.severity == "info":
        assert verdict.state == "healthy"
    else:  # a workflow may judge more severely from what it sees (repeats, a failed remap), never less
        states = ("healthy", "degraded", "unhealthy")
        assert verdict.state == entry.severity or (
            entry.workflow and states.index(verdict.state) > states.index(entry.severity)
        )
        assert LADDER.index(verdict.action) >= LADDER.index(entry.action)


@given(model=st.text(max_size=80))
def test_any_model_name_falls_under_a_column_or_none(model: str) -> None:
    assert catalog_family(model) in (*CATALOG_MODELS, None)


def _catalogue_text() -> str:
    return CATALOG_FILE.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace(",CONTACT_SUPPORT,,reset_gpu,", ",CONTACT_SUPPORT,,none,", 1),
         "differs from NVIDIA's RESET_GPU"),
        (lambda t: t.replace("code,mnemonic", "xid,mnemonic", 1), "header"),
        (lambda t: t + t.splitlines()[5] + "\n", "listed twice"),
        (lambda t: t + "x1,A,hardware,,IGNORE,,,none,info,,,d\n", "not a whole number"),
        (lambda t: t + "900,A,hardware,,IGNORE,,,none,info,,,d,extra\n", "expected 12 fields"),
        (lambda t: t + "900,A,hardware,,IGNORE,,,pray,info,,,d\n", "action"),
        (lambda t: t + "900,A,hardware,h100 tpu,IGNORE,,,none,info,,,d\n", "models"),
        (lambda t: t + "900,A,hardware,,IGNORE,,,none,info,,,\x07bell\n", "description"),
        (lambda t: t + "900,A,hardware,,WORKFLOW_X,,,none,info,,,d\n", "name the workflow"),
        (lambda t: t + "900,A,hardware,,,,,none,info,,,d\n", "needs a reason"),
        (lambda t: t + "900,A,hardware,,REBOOT_MOON,,,none,info,,,d\n", "not in [xid_catalog"),
    ],
)  # fmt: skip
def test_a_broken_catalogue_is_refused_with_the_line_and_field(
    tmp_path: Path, edit: object, message: str
) -> None:
    broken = tmp_path / "xid-catalog.csv"
    broken.write_text(edit(_catalogue_text()))  # type: ignore[operator]
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_catalog(broken, MAPPING)


def test_the_rules_file_refuses_a_catalogue_that_breaks_the_mapping(tmp_path: Path) -> None:
    rules = tmp_path / "health-rules.toml"
    rules.write_text(
        DEFAULT_RULES.read_text().replace(
            'RESET_GPU = { action = "reset_gpu"', 'RESET_GPU = { action = "none"'
        )
    )
    (tmp_path / "predictor-weights.toml").write_text(
        (DEFAULT_RULES.parent / "predictor-weights.toml").read_text()
    )
    (tmp_path / "xid-catalog.csv").write_text(_catalogue_text())
    with pytest.raises(ConfigError, match="without a reason"):
        load_rules(rules)


@settings(max_examples=150)
@given(text=st.text(max_size=400))
def test_hostile_catalogue_text_is_refused_cleanly_or_read(text: str) -> None:
    header = ",".join(COLUMNS) + "\n"
    for candidate in (text, header + text):
        try:
            entries = parse_catalog(candidate)
        except ConfigError:
            continue
        assert all(1 <= code <= 100_000 for code in entries)
