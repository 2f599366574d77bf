"""The operator's inventory: good rows load, each bad row is refused with its line and why, nothing lost."""

from __future__ import annotations

import csv
import io
from datetime import date
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.lifecycle.inventory import COLUMNS, InventoryError, load_inventory, parse_inventory
from tests.paths import REPO

TODAY = date(2026, 6, 1)
HEADER = ",".join(COLUMNS)
GOOD = "1652922012345,,2024-03-01,30000,2027-03-01,21,2,rack a1"
UUID = "GPU-3f6e1b2a-9c1d-4e5f-8a7b-0c1d2e3f4a5b"


def parse(*rows: str, header: str = HEADER) -> tuple[list[int], dict[int, str]]:
    inv = parse_inventory("\n".join([header, *rows]).encode(), today=TODAY)
    return [e.line for e in inv.entries], {p.line: p.problem for p in inv.problems}


def test_a_good_row_loads_with_every_value() -> None:
    inv = parse_inventory(f"{HEADER}\n{GOOD}\n".encode(), today=TODAY)
    assert inv.problems == ()
    (e,) = inv.entries
    assert (e.serial, e.gpu_uuid, e.purchase_date, e.purchase_price) == (
        "1652922012345",
        None,
        date(2024, 3, 1),
        30000.0,
    )
    assert (e.warranty_end, e.rma_turnaround_days, e.spares_on_hand, e.note) == (
        date(2027, 3, 1),
        21,
        2,
        "rack a1",
    )
    assert inv.lookup(serial="1652922012345", gpu_uuid=UUID) is e


def test_a_gpu_is_found_by_serial_first_then_by_uuid() -> None:
    inv = parse_inventory(f"serial,gpu_uuid,spares_on_hand\nS1,,1\n,{UUID},2\n".encode(), today=TODAY)
    assert inv.lookup(serial="S1", gpu_uuid=UUID).spares_on_hand == 1  # type: ignore[union-attr]
    assert inv.lookup(serial="S9", gpu_uuid=UUID).spares_on_hand == 2  # type: ignore[union-attr]
    assert inv.lookup(serial=None, gpu_uuid="GPU-none") is None


def test_empty_cells_are_missing_not_zero_and_comments_blank_lines_bom_crlf_are_fine() -> None:
    text = f"\ufeff# the fleet\r\n{HEADER}\r\n\r\n  # a comment\r\n,{UUID},,,,,,\r\n"
    inv = parse_inventory(text.encode(), today=TODAY)
    (e,) = inv.entries
    assert (e.line, e.purchase_price, e.spares_on_hand, e.warranty_end) == (5, None, None, None)


@pytest.mark.parametrize(
    ("row", "said"),
    [
        (",,2024-03-01,30000,2027-03-01,21,2,", "no serial and no gpu_uuid"),
        ("S1,,2026-06-02,30000,,,,", "purchase_date 2026-06-02 is in the future (today is 2026-06-01)"),
        ("S1,,1970-01-01,30000,,,,", "purchase_date 1970-01-01 is before 2000-01-01"),
        ("S1,,2024-03-01,30000,2024-02-01,,,", "warranty_end 2024-02-01 is before purchase_date 2024-03-01"),
        ("S1,,2024-03-01,30000,2099-01-01,,,", "warranty_end 2099-01-01 is more than 10 years after"),
        ("S1,,,-1,,,,", "purchase_price -1: negative"),
        ("S1,,,$30000,,,,", "purchase_price '$30000': a plain number"),
        ("S1,,,1e400,,,,", "purchase_price 1e400: more than"),
        ("S1,,,nan,,,,", "purchase_price 'nan': a plain number"),
        ("S1,,,,,-3,,", "rma_turnaround_days -3: negative"),
        ("S1,,,,,,1.5,", "spares_on_hand '1.5': a whole number"),
        ("S1,,03/01/2024,,,,,", "purchase_date '03/01/2024': not a date as YYYY-MM-DD"),
        ("S1,,2024-02-30,,,,,", "purchase_date '2024-02-30': not a date"),
        ("S 1,,,,,,,", "serial 'S 1': 1-64 letters"),
        (",GPU-nope,,,,,,", "gpu_uuid 'GPU-nope': not a GPU UUID"),
        ("S1,,,,,,,,extra", "9 cells, the header names 8"),
        ('S1,,,,,,,"open quote', "not CSV"),
    ],
)
def test_each_bad_row_is_refused_with_its_line_and_the_good_ones_still_load(row: str, said: str) -> None:
    loaded, problems = parse(GOOD, row, f",{UUID},,,,,,")
    assert loaded == [2, 4]
    assert said in problems[3], problems


def test_a_row_says_every_reason_at_once() -> None:
    _, problems = parse("S1,,2030-01-01,-5,,,-1,")
    assert problems[2].count(";") == 2, problems[2]


def test_a_gpu_named_twice_is_refused_on_every_line_naming_the_others() -> None:
    loaded, problems = parse(
        GOOD, f"S2,{UUID},,,,,,", GOOD.replace("30000", "31000"), f",{UUID},,,,,,", "S3,,,,,,,"
    )
    assert loaded == [6]
    assert "serial 1652922012345 is also on line(s) 4" in problems[2]
    assert "also on line(s) 2" in problems[4]
    assert f"gpu_uuid {UUID} is also on line(s) 5" in problems[3]
    assert "also on line(s) 3" in problems[5]


def test_bytes_that_are_not_utf8_and_nul_spoil_their_own_line_only() -> None:
    raw = f"{HEADER}\n{GOOD}\n".encode() + b"S2,,,\xff\xfe,,,,\nS3,,,,,,,bad\x00note\nS4,,,,,,,\n"
    inv = parse_inventory(raw, today=TODAY)
    assert [e.line for e in inv.entries] == [2, 5]
    assert {p.line for p in inv.problems} == {3, 4}
    assert all("not UTF-8" in p.problem for p in inv.problems)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("serial,waranty_end\n", "unknown column(s) 'waranty_end'"),
        ("purchase_date,note\n", "no `serial` or `gpu_uuid` column"),
        ("serial,serial\n", "serial named twice"),
        ("# only a comment\n", "no header line"),
        ("", "no header line"),
    ],
)
def test_what_spoils_the_whole_file_is_one_clear_error(text: str, said: str) -> None:
    with pytest.raises(InventoryError, match=None) as caught:
        parse_inventory(text.encode(), today=TODAY)
    assert said in str(caught.value)


def test_a_file_that_cannot_be_read_names_itself(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"inventory .*nowhere\.csv"):
        load_inventory(tmp_path / "nowhere.csv", today=TODAY)


def test_the_stacks_inventory_loads_clean_and_names_the_mock_fleet() -> None:
    from services.mock_dcgm.clock import SimClock
    from services.mock_dcgm.fleet import Fleet, FleetSpec

    inv = load_inventory(REPO / "deploy" / "inventory-economics.csv", today=date.today())
    assert inv.problems == ()
    fleet = Fleet(FleetSpec(nodes=4, gpus_per_node=8), SimClock(start_s=0))
    uuids = {g.uuid for n in fleet.nodes for g in n.gpus}
    assert {e.gpu_uuid for e in inv.entries} == uuids


# --- hostile rows among good ones ---------------------------------------------------------------------

_serials = st.from_regex(r"[A-Z0-9]{6,13}", fullmatch=True)
_good_row = st.fixed_dictionaries(
    {
        "purchase_date": st.dates(date(2000, 1, 1), TODAY).map(str),
        "purchase_price": st.integers(0, 100_000).map(str),
        "rma_turnaround_days": st.integers(0, 365).map(str) | st.just(""),
        "spares_on_hand": st.integers(0, 50).map(str) | st.just(""),
        "note": st.text(st.characters(categories=["L", "N"]), max_size=20),
    }
)
_hostile_cell = st.text(st.characters(codec="utf-8"), max_size=30) | st.sampled_from(
    ["-1", "1e999", "2999-01-01", "1900-01-01", "\x00", "=cmd|' /C calc'!A0", '"', "0x10", "٣"]
)


@settings(max_examples=150, deadline=None)
@given(
    good=st.lists(st.tuples(_serials, _good_row), max_size=12, unique_by=lambda t: t[0]),
    hostile=st.lists(st.lists(_hostile_cell, min_size=1, max_size=10), max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_hostile_rows_never_cost_a_good_one(
    good: list[tuple[str, dict[str, str]]], hostile: list[list[str]], order: object
) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    lines: list[tuple[str, list[str]]] = [
        (
            "good",
            [
                s,
                "",
                r["purchase_date"],
                r["purchase_price"],
                "",
                r["rma_turnaround_days"],
                r["spares_on_hand"],
                r["note"],
            ],
        )
        for s, r in good
    ]
    # a hostile row never borrows a good row's serial (that would make both duplicates, rightly refused)
    serials = {s for s, _ in good}
    lines += [("hostile", ["H-" + c[0][:8] if c[0] in serials else c[0], *c[1:]]) for c in hostile]
    order.shuffle(lines)  # type: ignore[attr-defined]
    for _, cells in lines:
        writer.writerow(cells)
    inv = parse_inventory(out.getvalue().encode(), today=TODAY)
    loaded = {e.serial for e in inv.entries}
    assert serials <= loaded, "a good row was lost"
    # every line is accounted for: loaded, refused with a reason, or blank / a comment
    accounted = {e.line for e in inv.entries} | {p.line for p in inv.problems}
    assert len(accounted) == len(inv.entries) + len(inv.problems)
    assert all(p.problem for p in inv.problems)


@settings(max_examples=150, deadline=None)
@given(
    serials=st.lists(_serials, min_size=1, max_size=10, unique=True),
    twice=st.lists(st.integers(0, 9), max_size=4, unique=True),
)
def test_exactly_the_gpus_named_twice_are_refused_and_every_other_row_loads(
    serials: list[str], twice: list[int]
) -> None:
    doubled = [serials[i] for i in twice if i < len(serials)]
    rows = [f"{s},,2024-03-01,30000,2027-03-01,21,2," for s in [*serials, *doubled]]
    inv = parse_inventory("\n".join([HEADER, *rows]).encode(), today=TODAY)
    assert {e.serial for e in inv.entries} == set(serials) - set(doubled)
    assert len(inv.problems) == 2 * len(doubled)
    for p in inv.problems:
        serial = rows[p.line - 2].split(",")[0]
        others = [i + 2 for i, r in enumerate(rows) if r.split(",")[0] == serial and i + 2 != p.line]
        assert f"serial {serial} is also on line(s) {others[0]}" in p.problem, p.problem


@settings(max_examples=200, deadline=None)
@given(bought=st.dates(date(1990, 1, 1), date(2040, 1, 1)), price=st.integers(-(10**6), 10**6))
def test_a_purchase_date_loads_from_2000_to_today_and_a_price_from_zero(bought: date, price: int) -> None:
    loaded, problems = parse(f"S1,,{bought},{price},,,,")
    good = date(2000, 1, 1) <= bought <= TODAY and price >= 0
    assert loaded == ([2] if good else [])
    if bought > TODAY:
        assert f"purchase_date {bought} is in the future" in problems[2]
    if bought < date(2000, 1, 1):
        assert f"purchase_date {bought} is before 2000-01-01" in problems[2]
    if price < 0:
        assert f"purchase_price {price}: negative" in problems[2]
