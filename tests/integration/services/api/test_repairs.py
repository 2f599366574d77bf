"""A way back to healthy through the API and the CLI: a repair mark needs the key, is kept, and is listed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services.api import cli
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.config import DatabaseSettings
from shared.fakes.samples import gpu_uuid, sample

KEY = "test-key-123"  # the served_api fixture's


@pytest.fixture
def gpu(migrated: DatabaseSettings) -> str:
    writer = BatchWriter(migrated, group="itest-32-repairs", connections=1)
    try:
        writer.write(Batch(rows=[stage_row(json.dumps(sample(0, gpus=1)))], next_offsets={("t", 0): 1}))
    finally:
        writer.close()
    return gpu_uuid(0)


def test_marking_a_gpu_needs_the_key_and_is_kept_as_an_audit_trail(served_api: str, gpu: str) -> None:
    url = f"{served_api}/api/v1/gpus/{gpu}/repairs"
    assert httpx.post(url, json={"by": "oncall"}).status_code == 401
    assert httpx.post(url, json={"by": "oncall"}, headers={"X-API-Key": "wrong"}).status_code == 401
    first = httpx.post(url, json={"by": "oncall", "note": "reseated the riser"}, headers={"X-API-Key": KEY})
    assert first.status_code == 201, first.text
    assert {k: first.json()[k] for k in ("gpu_uuid", "kind", "marked_by", "note")} == {
        "gpu_uuid": gpu, "kind": "repaired", "marked_by": "oncall", "note": "reseated the riser"}  # fmt: skip
    back = httpx.post(url, json={"by": "rma-desk", "kind": "returned"}, headers={"X-API-Key": KEY})
    assert back.status_code == 201
    listed = httpx.get(url).json()["repairs"]
    assert [(m["kind"], m["marked_by"]) for m in listed] == [("returned", "rma-desk"), ("repaired", "oncall")]
    unknown = "GPU-00000000-0000-0000-0000-00000000dead"
    assert (
        httpx.post(f"{served_api}/api/v1/gpus/{unknown}/repairs", headers={"X-API-Key": KEY}).status_code
        == 404
    )
    for hostile in ({"kind": "blessed"}, {"by": "a b"}, {"note": "line\nbreak"}, {"note": "x" * 501}):
        refused = httpx.post(url, json=hostile, headers={"X-API-Key": KEY})
        assert refused.status_code == 422, (hostile, refused.text)
    assert len(httpx.get(url).json()["repairs"]) == 2


def test_the_cli_marks_and_lists(served_api: str, gpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--url", served_api, "repaired", gpu, "--by", "oncall"]) == 2  # no key
    assert "401" in capsys.readouterr().err
    assert (
        cli.main(["--url", served_api, "repaired", gpu, "--key", KEY, "--by", "oncall", "--note", "new HBM"])
        == 0
    )
    out: Any = capsys.readouterr().out
    assert f"{gpu} marked repaired by oncall" in out
    assert cli.main(["--url", served_api, "repairs", gpu]) == 0
    assert "repaired  by oncall: new HBM" in capsys.readouterr().out


def test_a_reset_done_by_hand_needs_the_key_is_kept_and_listed(
    served_api: str, gpu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{served_api}/api/v1/gpus/{gpu}/remedies"
    assert httpx.post(url, json={"by": "oncall"}).status_code == 401
    done = httpx.post(url, json={"by": "oncall", "note": "nvidia-smi -r"}, headers={"X-API-Key": KEY})
    assert done.status_code == 201, done.text
    assert {k: done.json()[k] for k in ("gpu_uuid", "remedy", "source", "plan_id", "actor", "note")} == {
        "gpu_uuid": gpu, "remedy": "reset_gpu", "source": "operator", "plan_id": None, "actor": "oncall",
        "note": "nvidia-smi -r",
    }  # fmt: skip
    for hostile in (
        {"remedy": "prayer"},
        {"remedy": "reboot"},
        {"by": "a;b"},
        {"note": "\x00"},
        {"note": "x" * 501},
    ):
        refused = httpx.post(url, json=hostile, headers={"X-API-Key": KEY})
        assert refused.status_code == 422, (hostile, refused.text)
    unknown = "GPU-00000000-0000-0000-0000-00000000dead"
    assert httpx.post(url.replace(gpu, unknown), headers={"X-API-Key": KEY}).status_code == 404
    reboot = ["--url", served_api, "remedied", gpu, "--reboot", "--key", KEY, "--by", "dc-tech"]
    assert cli.main(reboot) == 0
    assert f"{gpu}: reboot_node by dc-tech at " in capsys.readouterr().out
    assert [(r["remedy"], r["actor"]) for r in httpx.get(url).json()["remedies"]] == [
        ("reboot_node", "dc-tech"), ("reset_gpu", "oncall"),
    ]  # fmt: skip
    assert cli.main(["--url", served_api, "remedies", gpu]) == 0
    assert "reset_gpu    by operator oncall: nvidia-smi -r" in capsys.readouterr().out
