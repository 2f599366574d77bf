"""The nvidia-smi source on what an H100 (driver 580.159.04) answered: query CSV and `-q -x`."""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth.gpu.readings import SourceError
from gpuhealth.gpu.smi_source import QUERY_FIELDS, SmiSource, _value
from gpuhealth.gpu.smi_xml import parse_smi_xml, recovery_action_code
from shared.contract.models import METRIC_FIELDS
from tests.paths import DATA

H100 = DATA / "h100"
UUID = "GPU-cdb3c1cd-34cf-0d45-2eeb-157c34f44a90"
# nvidia-smi's other names for two fields of the recording
ALIASES = {"clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory"}
# What the same GPU's `nvidia-smi -q` (nvidia-smi-q.txt) says for the fields the CSV recording
# did not ask for: the query would give these.
FROM_Q_TEXT = {
    "memory.free": "81079", "memory.reserved": "480",
    "ecc.errors.corrected.aggregate.total": "0", "ecc.errors.uncorrected.aggregate.total": "0",
    "retired_pages.single_bit_ecc.count": "[N/A]", "retired_pages.double_bit.count": "[N/A]",
    "pcie.link.gen.max": "5", "pcie.link.width.max": "16",
    "clocks_event_reasons_counters.sw_power_cap": "0",
    "clocks_event_reasons_counters.sw_thermal_slowdown": "0",
    "gpu_recovery_action": "None",
}  # fmt: skip


def recorded_table() -> dict[str, str]:
    """The recorded query row, by field name, units stripped as `nounits` would."""
    with (H100 / "smi-query.csv").open() as handle:
        header, row = list(csv.reader(handle, skipinitialspace=True))
    table = {}
    for name, value in zip(header, row, strict=True):
        field, _, unit = name.partition(" [")
        unit = unit.rstrip("]")
        table[field] = value.removesuffix(f" {unit}") if unit else value
    return {**table, **FROM_Q_TEXT}


def replay(table: dict[str, str], calls: list[list[str]] | None = None) -> object:
    """A runner that answers as this driver's nvidia-smi would, from the recorded values."""
    xml = (H100 / "nvidia-smi-q.xml").read_text()

    def run(args: list[str]) -> str:
        if calls is not None:
            calls.append(args)
        if args[:2] == ["-q", "-x"]:
            return xml
        fields = args[0].removeprefix("--query-gpu=").split(",")
        for field in fields:
            if ALIASES.get(field, field) not in table:
                raise SourceError(f'Field "{field}" is not a valid field to query.')
        return ", ".join(table[ALIASES.get(f, f)] for f in fields) + "\n"

    return run


def test_every_contract_field_this_driver_offers_is_queried_and_mapped() -> None:
    calls: list[list[str]] = []
    (gpu,) = SmiSource(replay(recorded_table(), calls)).read().gpus  # type: ignore[arg-type]
    queried = calls[0][0].removeprefix("--query-gpu=").split(",")
    assert set(queried) == set(QUERY_FIELDS)  # nothing refused by this driver
    assert (gpu.uuid, gpu.model, gpu.pci_bus_id) == (UUID, "NVIDIA H100 80GB HBM3", "00000000:00:06.0")
    m = gpu.metrics
    # remapped rows: the memory rules' input on a host without NVML
    assert (m["remapped_rows_correctable"], m["remapped_rows_uncorrectable"]) == (0, 0)
    assert (m["row_remap_pending"], m["row_remap_failure"]) == (0, 0)
    assert (m["pcie_link_gen"], m["pcie_link_width"], m["pcie_link_gen_max"], m["pcie_link_width_max"]) == (
        5, 16, 5, 16,
    )  # fmt: skip
    assert (m["power_violation_us"], m["thermal_violation_us"]) == (0, 0)
    assert m["gpu_recovery_action"] == 0  # "None": nothing to do, not unknown
    # the T.Limit form of the XML: NVML's own 89 / 95 on this GPU
    assert (m["slowdown_temp_c"], m["shutdown_temp_c"]) == (89, 95)
    assert (m["fb_used_mib"], m["fb_reserved_mib"], m["fb_free_mib"]) == (0, 480, 81079)
    assert m["retired_pages_pending"] is None  # [N/A] on Hopper
    assert set(m) <= set(METRIC_FIELDS)
    assert [c[:2] for c in calls].count(["-q", "-x"]) == 3  # thresholds read at the first poll only


def test_thresholds_are_read_once_per_gpu() -> None:
    calls: list[list[str]] = []
    source = SmiSource(replay(recorded_table(), calls))  # type: ignore[arg-type]
    source.read()
    source.read()
    assert [c[:2] for c in calls].count(["-q", "-x"]) == 3
    assert source.read().gpus[0].metrics["slowdown_temp_c"] == 89


def test_an_older_driver_drops_the_fields_it_does_not_know_and_keeps_the_rest() -> None:
    table = recorded_table()
    for gone in ("remapped_rows.pending", "gpu_recovery_action", "pcie.link.gen.max",
                 "clocks_event_reasons_counters.sw_power_cap"):  # fmt: skip
        del table[gone]
    source = SmiSource(replay(table))  # type: ignore[arg-type]
    (gpu,) = source.read().gpus
    assert "gpu_recovery_action" not in source.fields
    assert "remapped_rows.pending" not in source.fields
    assert "row_remap_pending" not in gpu.metrics
    assert "gpu_recovery_action" not in gpu.metrics
    assert gpu.metrics["remapped_rows_correctable"] == 0
    assert gpu.metrics["pcie_link_width_max"] == 16


def test_no_xml_report_costs_the_thresholds_not_the_source() -> None:
    table = recorded_table()
    inner = replay(table)

    def run(args: list[str]) -> str:
        if args[:2] == ["-q", "-x"]:
            raise SourceError("nvidia-smi failed (9): Unable to determine the device handle")
        return inner(args)  # type: ignore[operator, no-any-return]

    (gpu,) = SmiSource(run).read().gpus
    assert (gpu.metrics["slowdown_temp_c"], gpu.metrics["shutdown_temp_c"]) == (None, None)
    assert gpu.metrics["gpu_temp_c"] == 32


def test_xml_thresholds_in_both_forms() -> None:
    recorded = parse_smi_xml((H100 / "nvidia-smi-q.xml").read_text())
    assert recorded == {UUID: {"slowdown_temp_c": 89.0, "shutdown_temp_c": 95.0}}
    older = (
        "<nvidia_smi_log><gpu id='0'><uuid>GPU-1</uuid><temperature><gpu_temp>40 C</gpu_temp>"
        "<gpu_temp_max_threshold>92 C</gpu_temp_max_threshold>"
        "<gpu_temp_slow_threshold>87 C</gpu_temp_slow_threshold></temperature></gpu></nvidia_smi_log>"
    )
    assert parse_smi_xml(older) == {"GPU-1": {"slowdown_temp_c": 87.0, "shutdown_temp_c": 92.0}}
    unsupported = "<nvidia_smi_log><gpu><uuid>GPU-2</uuid><temperature/></gpu></nvidia_smi_log>"
    assert parse_smi_xml(unsupported) == {"GPU-2": {"slowdown_temp_c": None, "shutdown_temp_c": None}}


@pytest.mark.parametrize("text", ["", "not xml", "<other/>", "<nvidia_smi_log><gpu>"])
def test_a_broken_xml_report_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not an"):
        parse_smi_xml(text)


@pytest.mark.parametrize(
    ("text", "code"),
    [("None", 0), ("GPU Reset", 1), ("Node Reboot", 2), ("Drain P2P", 3), ("Drain and Reset", 4),
     ("2", 2), ("[N/A]", None), ("Something New", None), ("999", None)],
)  # fmt: skip
def test_recovery_action_words(text: str, code: int | None) -> None:
    assert recovery_action_code(text) == code


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_cell_is_a_number_or_null(text: str) -> None:
    value = _value(text)
    assert value is None or isinstance(value, int | float)
    assert recovery_action_code(text) in (None, *range(256))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\r"), max_size=30), max_size=60))
def test_any_query_answer_is_readings_or_a_source_error(cells: list[str]) -> None:
    """Whatever nvidia-smi prints, the source gives readings or a SourceError, nothing else."""
    answer = ", ".join(cells)

    def run(args: list[str]) -> str:
        return "<nvidia_smi_log/>" if args[:2] == ["-q", "-x"] else answer

    try:
        reading = SmiSource(run).read()
    except SourceError:
        return
    for gpu in reading.gpus:
        assert all(v is None or isinstance(v, int | float) for v in gpu.metrics.values())
