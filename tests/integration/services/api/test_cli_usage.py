"""`gpuhealth usage` against the API over the hand-worked fleet (usage_fleet.hand_fleet), as text."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from services.api import cli
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import VIEWER, token_args
from tests.helpers.usage_fleet import T0, hand_fleet, store

WINDOW = ["--from", T0.isoformat(), "--to", T0.replace(hour=2).isoformat()]


@pytest.fixture
def api(served_api: str, migrated: DatabaseSettings) -> str:
    with connect(migrated) as conn:
        store(conn, hand_fleet())
    return served_api


def run(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    code = cli.main([*token_args("viewer"), "--url", url, "usage", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_usage_by_namespace_prints_each_group_and_the_total(
    api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, api, *WINDOW)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "GPU usage by namespace, 2026-05-04 00:00 – 2026-05-04 02:00 UTC"
    assert lines[1].split() == [
        "namespace",
        "GPUs",
        "GPU-hours",
        "busy",
        "idle",
        "alloc",
        "util",
        "energy",
        "kWh",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["ml"] == ["1", "1.0", "100.0", "%", "0.0", "%", "50.0", "%", "0.30"]
    assert rows["web"] == ["1", "0.5", "0.0", "%", "100.0", "%", "0.0", "%", "0.05"]
    assert rows["(no"][:3] == ["namespace)", "1", "0.5"]
    assert rows["total"] == ["2", "2.0", "75.0", "%", "25.0", "%", "37.5", "%", "0.45"]


def test_filters_steps_and_llm(api: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, api, *WINDOW, "--by", "user", "--where", "class=inference")
    assert code == 0
    assert [line.split()[:3] for line in out.splitlines()[2:]] == [["bob", "1", "0.5"], ["total", "1", "0.5"]]
    code, out, _ = run(capsys, api, *WINDOW, "--by", "class", "--step", "1h")
    assert code == 0
    assert "2026-05-04 01:00" in out.splitlines()
    code, out, _ = run(capsys, api, *WINDOW, "--llm")
    assert code == 0
    assert out.splitlines()[-1] == "no LLM requests in the window"


def test_export_writes_the_apis_rows(api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "week.parquet"
    code, _, err = run(capsys, api, *WINDOW, "--by", "class", "--export", str(target))
    assert code == 0, err
    table = pq.read_table(target).to_pylist()
    body = VIEWER.get(
        api + "/api/v1/usage", params={"from": WINDOW[1], "to": WINDOW[3], "by": "class"}
    ).json()
    assert [(r["key"], r["gpu_hours"]) for r in table] == [
        *((g["key"], g["gpu_hours"]) for g in body["groups"]),
        (None, body["total"]["gpu_hours"]),
    ]
    code, out, _ = run(capsys, api, *WINDOW, "--export", "-")
    assert code == 0
    assert out.startswith("from,to,by,period,kind,key,")


def test_a_refused_or_malformed_question_says_why(api: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, api, "--from", "2026-01-01T00:00:00Z", "--to", "2026-05-01T00:00:00Z")
    assert code == 2
    assert "400 Bad Request: the range may span at most 31 days" in err
    with pytest.raises(SystemExit) as bad:
        cli.main([*token_args("viewer"), "--url", api, "usage", "--where", "team=x"])
    assert bad.value.code == 2
    assert "DIMENSION=VALUE" in capsys.readouterr().err
