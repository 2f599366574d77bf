"""NVLink XIDs from the kernel message: NVIDIA's 144-150 table (both driver generations), 74's registers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.scorer.rules_config import DEFAULT_RULES, load_rules
from shared.gpu.nvlink_decode import (
    COLUMNS,
    Generation,
    Nvlink5Row,
    decode_nvlink5,
    decode_nvlink74,
    generation_of,
    load_nvlink5_table,
    named_generation,
    parse_nvlink5_table,
)
from shared.plumbing.errors import ConfigError

FACTS = Path(__file__).resolve().parents[2] / "data" / "xid" / "nvlink-xid-144-150-facts.csv"
RULES = load_rules()
TABLE = RULES.nvlink5
TABLE_FILE = DEFAULT_RULES.parent / RULES.xid_catalog.nvlink5_file


def test_the_projects_table_is_nvidias_row_for_row() -> None:
    with FACTS.open(newline="", encoding="utf-8") as f:
        facts = list(csv.DictReader(f))
    with TABLE_FILE.open(newline="", encoding="utf-8") as f:
        mine = list(csv.DictReader(f))
    assert len(facts) == len(mine) == len(TABLE) == 95
    pairs = {
        "xid": "xid", "subcode": "subcode",
        "intrinfo_v1": "intrinfo_v1_lt_r575", "intrinfo_v2": "intrinfo_v2_ge_r575",
        "error_status": "error_status_hex", "nvidia_action": "recovery_action",
        "nvidia_investigation": "investigatory_action", "severity": "severity", "hw_sw": "hw_sw",
    }  # fmt: skip
    assert [{k: row[k] for k in pairs} for row in mine] == [
        {k: f[v] for k, v in pairs.items()} for f in facts
    ]
    assert {r.xid for r in TABLE} == set(range(144, 151))


def _word(pattern: str, fill: int) -> int:
    """A 32-bit intrInfo that matches `pattern`, its don't-care bits taken from `fill`."""
    bits = [c if c != "-" else str(fill >> (31 - i) & 1) for i, c in enumerate(pattern)]
    return int("".join(bits), 2)


def _message(row: Nvlink5Row, generation: Generation, fill: int, status: int) -> str:
    with TABLE_FILE.open(newline="", encoding="utf-8") as f:
        patterns = [r for r in csv.DictReader(f)]
    pattern = patterns[TABLE.index(row)]["intrinfo_" + generation]
    fatal = "Fatal" if "fatal" in row.severity.lower() and "non" not in row.severity.lower() else "Nonfatal"
    unit = row.subcode.split("/")[-1 if generation == "v2" else 0].split()[0]
    return (
        f"{unit} {fatal} XC0 i0 Link 07 (0x{_word(pattern, fill):08x} 0x{status:08x} 0x00000000 0x00000000)"
    )


@settings(max_examples=300)
@given(
    index=st.integers(min_value=0, max_value=94),
    generation=st.sampled_from(["v1", "v2"]),
    fill=st.integers(min_value=0, max_value=2**32 - 1),
    which=st.integers(min_value=0, max_value=3),
)
def test_every_row_decodes_in_its_generation_whatever_the_users_bits(
    index: int, generation: Generation, fill: int, which: int
) -> None:
    row = TABLE[index]
    statuses = sorted(row.error_status) if row.error_status is not None else [fill & 0xFFFF]
    status = statuses[which % len(statuses)]
    message = _message(row, generation, fill, status)
    decoded = decode_nvlink5(TABLE, row.xid, message, generation)
    assert decoded is not None, message
    assert row in decoded.rows
    assert decoded.message.link == 7
    # without the driver's version: the same row, or no guess at all
    unknown = decode_nvlink5(TABLE, row.xid, message, None)
    assert unknown is None or row in unknown.rows


@pytest.mark.parametrize(
    ("code", "message", "generation", "subcode", "action"),
    [  # kernel lines as drivers write them (before R575: sub-unit in intrInfo bits 9:5; from R575, 6:0)
        (149, "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 "
              "0x00000000 0x00000000)", "v1", "NETIR_LINK_EVT/NETIR_LINK_DOWN", "RESET_GPU"),
        (149, "NETIR_LINK_DOWN Fatal XC0 i0 Link 09 (0x02500011 0x00000000 0x00000000)", "v2",
         "NETIR_LINK_EVT/NETIR_LINK_DOWN", "RESET_GPU"),
        (145, "RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000 0x00000000 0x00000000 "
              "0x00000000)", "v1", "RLW_SRC_TRACK", "XID_154_EVAL"),
        (149, "NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x00082226 0x00000001 0x00000000)", "v1",
         "NETIR_BER_EVENT", "IGNORE"),
        (144, "pid=4, name=<unknown>, SAW_MVB Fatal XC0 i1 Link 00 (0x00000001 0x00000010)", "v2", "SAW_MVB",
         "RESET_GPU"),
    ],
)  # fmt: skip
def test_real_messages_of_both_generations(
    code: int, message: str, generation: str, subcode: str, action: str
) -> None:
    decoded = decode_nvlink5(TABLE, code, message, None)
    assert decoded is not None
    assert (decoded.generation, decoded.subcode, decoded.rows[0].nvidia_action) == (
        generation,
        subcode,
        action,
    )
    other = decode_nvlink5(TABLE, code, message, "v1" if generation == "v2" else "v2")
    if named_generation(TABLE, code, decoded.message.unit) == generation:
        # the sub-unit's name is the one only this generation writes: the message says who wrote it
        assert other == decoded
    else:
        assert other is None


@pytest.mark.parametrize(
    ("message", "link", "generation", "action", "severity"),
    [  # GB200 drivers name no link for a GPU-wide NETIR event (leptonai/gpud pull 1174, NVIDIA's format)
        ("NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
         -1, "v1", "RESET_GPU", "Link Fatal"),
        ("NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x016415c6)", 0, "v1", "RESET_GPU", "Link Fatal"),
        ("NETIR_LINK_EVT/NETIR_LINK_DOWN Fatal XC0 i0 Link 00 (0x00000011 0x00000000 0x00000000 0x00000000)",
         0, "v2", "RESET_GPU", "Link Fatal"),
        ("RLW_RXPIPE Non-fatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 "
         "0x00000004)", 13, "v1", "IGNORE", "Non-fatal"),
    ],
)  # fmt: skip
def test_the_field_shapes_real_drivers_write(
    message: str, link: int, generation: str, action: str, severity: str
) -> None:
    """Link -1, few registers, the table's two names at once, `Non-fatal`: all NVIDIA's table reads."""
    code = 145 if message.startswith("RLW") else 149
    decoded = decode_nvlink5(TABLE, code, message, None)
    assert decoded is not None
    assert (decoded.message.link, decoded.generation) == (link, generation)
    assert (decoded.rows[0].nvidia_action, decoded.rows[0].severity) == (action, severity)


def test_a_promoted_error_takes_nvidias_second_action() -> None:
    plain = decode_nvlink5(TABLE, 145, "RLW_RXPIPE Nonfatal XC0 i0 Link 1 (0x000000c2 0x00000001)", "v1")
    promoted = decode_nvlink5(TABLE, 145, "RLW_RXPIPE Nonfatal XC0 i0 Link 1 (0x000004c2 0x00000001)", "v1")
    assert plain is not None
    assert not plain.promoted
    assert promoted is not None
    assert promoted.promoted
    assert promoted.rows[0].nvidia_action2 == "RESET_GPU"


def test_several_status_bits_decode_bit_by_bit_or_not_at_all() -> None:
    both = decode_nvlink5(TABLE, 145, "RLW_REMAP Nonfatal XC0 i0 Link 1 (0x00000204 0x00000041)", "v2")
    assert both is not None
    assert [r.nvidia_action for r in both.rows] == ["XID_154_EVAL", "RESET_GPU"]
    assert (
        decode_nvlink5(TABLE, 145, "RLW_REMAP Nonfatal XC0 i0 Link 1 (0x00000204 0x00001000)", "v2") is None
    )


@pytest.mark.parametrize(
    ("version", "generation"),
    [("580.159.04", "v2"), ("575.51.03", "v2"), ("570.86.15", "v1"), ("R565", "v1"), ("", None), (None, None),
     ("banana", None), ("5750000", None)],
)  # fmt: skip
def test_the_driver_version_says_the_generation(version: str | None, generation: str | None) -> None:
    assert generation_of(version) == generation


def test_xid_74_registers_by_nvidias_classes() -> None:
    found = decode_nvlink74("NVLink: fatal error detected on link 6(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
    assert found is not None
    assert (found.link, found.classes) == (6, {"mechanical": ["reg0.bit16"]})
    odd = decode_nvlink74(
        "NVLink: fatal error detected on link 2(0x800001, 0x0, 0x2000, 0x0, 0x100000, 0x0, 0x0)"
    )
    assert odd is not None
    assert odd.classes == {
        "ignorable": ["reg0.bit0", "reg0.bit23", "reg4.bit20"],
        "unexpected": ["reg2.bit13"],
    }
    assert decode_nvlink74("NVLink: fatal error detected on link 4") is None


@settings(max_examples=400)
@given(
    code=st.integers(min_value=140, max_value=155),
    text=st.text(max_size=600)
    | st.from_regex(r"[A-Z_]{1,12} (Fatal|Nonfatal) XC\d i\d Link \d{1,3} \((0x[0-9a-f]{0,9} ?){0,8}\)?"),
    generation=st.sampled_from([None, "v1", "v2"]),
)
def test_hostile_messages_never_crash_the_decoders(
    code: int, text: str, generation: Generation | None
) -> None:
    decoded = decode_nvlink5(TABLE, code, text, generation)
    assert decoded is None or all(r.xid == code for r in decoded.rows)
    decode_nvlink74(text)
    generation_of(text)


def test_a_broken_table_is_refused_with_its_line(tmp_path: Path) -> None:
    text = TABLE_FILE.read_text(encoding="utf-8")
    for broken, message in [
        (
            text.replace("------000000----------0000100001", "------000000----------000010000", 1),
            "32-bit pattern",
        ),
        (text.replace(",0x00000001,", ",0xZZ,", 1), "line 2"),
        (text.replace("xid,subcode", "code,subcode", 1), "header"),
        (text + "144,X\n", "expected 12 fields"),
    ]:
        path = tmp_path / "nvlink5.csv"
        path.write_text(broken)
        with pytest.raises(ConfigError, match=message):
            load_nvlink5_table(path)
    assert len(parse_nvlink5_table(",".join(COLUMNS) + "\n")) == 0
