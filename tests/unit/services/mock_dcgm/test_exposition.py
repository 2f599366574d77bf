"""The mock's exposition: dcgm-exporter's form, label order, sentinels, counters, determinism."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from services.mock_dcgm.fleet import Fleet
from shared.gpu.dcgm import BY_NAME, FIELDS, INT64_NOT_SUPPORTED, is_blank
from tests.helpers.mock_fleet import make_fleet

LABEL_ORDER = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "container",
    "namespace",
    "pod",
]


def scrape(fleet: Fleet, node: int = 0, *, timestamps: bool = False) -> str:
    return fleet.scrape(node, timestamps=timestamps)[0]


def test_every_field_has_help_type_and_one_line_per_gpu() -> None:
    fleet, _ = make_fleet()
    families = {f.name: f for f in text_string_to_metric_families(scrape(fleet))}
    for field in FIELDS:
        # prometheus_client strips a counter's _total suffix from the family name.
        family = families.get(field.name) or families[field.name.removesuffix("_TOTAL")]
        assert family.type == field.prom_type.value
        assert family.documentation
        assert len(family.samples) == 8, field.name


def test_labels_come_in_dcgm_exporters_order() -> None:
    fleet, _ = make_fleet()
    for line in scrape(fleet).splitlines():
        if line.startswith("#"):
            continue
        labels = re.findall(r'([A-Za-z_]+)="', line[line.index("{") : line.index("}")])
        assert labels == LABEL_ORDER, line


def test_unsupported_fields_carry_dcgms_sentinel_by_model() -> None:
    fleet, _ = make_fleet()
    h100, v100 = scrape(fleet, 0), scrape(fleet, 3)
    retired = re.findall(r"^DCGM_FI_DEV_RETIRED_SBE\{.*\} (\S+)$", h100, re.M)
    assert retired == [str(INT64_NOT_SUPPORTED)] * 8
    remap = re.findall(r"^DCGM_FI_DEV_ROW_REMAP_FAILURE\{.*\} (\S+)$", v100, re.M)
    assert remap == [str(INT64_NOT_SUPPORTED)] * 8
    assert re.findall(r"^DCGM_FI_DEV_RETIRED_SBE\{.*\} (\S+)$", v100, re.M) == ["0"] * 8
    assert is_blank(float(retired[0]), BY_NAME["DCGM_FI_DEV_RETIRED_SBE"].kind)
    assert not is_blank(0.0, BY_NAME["DCGM_FI_DEV_RETIRED_SBE"].kind)


def values(text: str, name: str) -> dict[str, float]:
    """{UUID: value} for one metric."""
    return {m[0]: float(m[1]) for m in re.findall(rf'^{name}\{{.*?UUID="([^"]+)".*\}} (\S+)', text, re.M)}


def test_counters_only_grow_through_a_day_of_load_and_faults() -> None:
    fleet, hand = make_fleet(nodes=2)
    gpu = fleet.nodes[0].gpus[1]
    for kind in ("sbe_storm", "pcie_replay_storm", "nvlink_errors"):
        fleet.inject({"kind": kind, "node": 0, "gpu": 1, "after_s": 600})
    counters = [f.name for f in FIELDS if f.prom_type.value == "counter"]
    last: dict[str, dict[str, float]] = {}
    for step in range(300):
        hand.t = step * 290.0  # uneven steps across ~24 h
        text = scrape(fleet)
        for name in counters:
            now = values(text, name)
            for uuid, value in now.items():
                assert value >= last.get(name, {}).get(uuid, 0.0), (name, uuid, step)
            last[name] = now
    assert last["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"][gpu.uuid] > 1000
    assert last["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][gpu.uuid] > 0


def test_power_and_temperature_follow_load() -> None:
    fleet, hand = make_fleet(nodes=1)
    busy: list[tuple[float, float]] = []
    idle: list[tuple[float, float]] = []
    for step in range(2000):
        hand.t = step * 30.0
        text = scrape(fleet)
        util, power, temp = (
            values(text, n)
            for n in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP")
        )
        for uuid in util:
            (busy if util[uuid] >= 80 else idle if util[uuid] <= 3 else []).append((power[uuid], temp[uuid]))
    assert len(busy) > 100
    assert len(idle) > 100

    def mean(xs: list[tuple[float, float]], i: int) -> float:
        return sum(x[i] for x in xs) / len(xs)

    assert mean(busy, 0) > 3 * mean(idle, 0)
    assert mean(busy, 1) > mean(idle, 1) + 15
    assert max(p for p, _ in busy) <= 700.0  # never above the H100's power limit


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    outputs = []
    for seed in (7, 7, 8):
        fleet, hand = make_fleet(seed=seed, nodes=1)
        fleet.inject({"kind": "sbe_storm", "node": 0, "gpu": 2, "after_s": 60})
        text = ""
        for step in range(50):
            hand.t = step * 97.0
            text = scrape(fleet)
        outputs.append(text)
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_timestamps_only_with_an_accelerated_clock() -> None:
    fleet, hand = make_fleet(nodes=1)
    hand.t = 10
    plain = scrape(fleet)
    samples = [line.rsplit("} ", 1)[1] for line in plain.splitlines() if not line.startswith("#")]
    assert all(" " not in value for value in samples)
    stamped = scrape(fleet, timestamps=True)
    stamps = {
        line.rsplit("} ", 1)[1].split(" ")[1] for line in stamped.splitlines() if not line.startswith("#")
    }
    assert stamps == {str(int(fleet.clock.now() * 1000))}


def test_promtool_finds_no_error_and_only_dcgm_exporters_own_naming_remarks(promtool: Path) -> None:
    fleet, hand = make_fleet()
    fleet.inject({"kind": "xid", "node": 0, "gpu": 0, "params": {"code": 79}})
    hand.t = 3600
    for node in range(4):
        out = subprocess.run(
            [str(promtool), "check", "metrics"],
            input=scrape(fleet, node),
            capture_output=True,
            text=True,
            check=False,
        )
        remarks = {
            re.sub(r"^DCGM_FI_[A-Z0-9_]+ ", "", line)
            for line in (out.stdout + out.stderr).splitlines()
            if line.strip()
        }
        assert remarks <= {
            "label names should be written in 'snake_case' not 'camelCase'",
            'counter metrics should have "_total" suffix',
            "metric name should not include type 'counter'",
        }, remarks
        assert "parsing error" not in out.stdout + out.stderr
