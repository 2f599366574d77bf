"""A way back to healthy through the API and the CLI: a repair mark needs an operator, is kept
under the token's subject, and is listed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services.api import cli
from services.sink.rows import stage_row
from services.sink.writer import Batch, BatchWriter
from shared.fakes.samples import gpu_uuid, sample
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import ADMIN, OPERATOR, VIEWER, identities, token_args


@pytest.fixture
def gpu(migrated: DatabaseSettings) -> str:
    writer = BatchWriter(migrated, group="itest-32-repairs", connections=1)
    try:
        writer.write(Batch(rows=[stage_row(json.dumps(sample(0, gpus=1)))], next_offsets={("t", 0): 1}))
    finally:
        writer.close()
    return gpu_uuid(0)


def test_marking_a_gpu_needs_an_operator_and_is_kept_as_an_audit_trail(served_api: str, gpu: str) -> None:
    url = f"{served_api}/api/v1/gpus/{gpu}/repairs"
    assert httpx.post(url, json={"by": "oncall"}).status_code == 401
    assert httpx.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert VIEWER.post(url).status_code == 403
    # the mark is the token's subject's: a `by` in the body is ignored
    first = OPERATOR.post(url, json={"by": "oncall", "note": "reseated the riser"})
    assert first.status_code == 201, first.text
    assert {k: first.json()[k] for k in ("gpu_uuid", "kind", "marked_by", "note")} == {
        "gpu_uuid": gpu,
        "kind": "repaired",
        "marked_by": "local-operator",
        "note": "reseated the riser",
    }
    rma_desk = identities().issue("rma-desk@example", "operator")
    back = httpx.post(url, json={"kind": "returned"}, headers={"Authorization": f"Bearer {rma_desk}"})
    assert back.status_code == 201
    listed = VIEWER.get(url).json()["repairs"]
    assert [(m["kind"], m["marked_by"]) for m in listed] == [
        ("returned", "rma-desk@example"), ("repaired", "local-operator")]  # fmt: skip
    unknown = "GPU-00000000-0000-0000-0000-00000000dead"
    assert ADMIN.post(f"{served_api}/api/v1/gpus/{unknown}/repairs").status_code == 404
    for hostile in ({"kind": "blessed"}, {"note": "line\nbreak"}, {"note": "x" * 501}):
        refused = OPERATOR.post(url, json=hostile)
        assert refused.status_code == 422, (hostile, refused.text)
    assert len(VIEWER.get(url).json()["repairs"]) == 2


def test_the_cli_marks_and_lists(served_api: str, gpu: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*token_args("viewer"), "--url", served_api, "repaired", gpu]) == 2  # a viewer may not
    assert "403" in capsys.readouterr().err
    assert cli.main([*token_args("operator"), "--url", served_api, "repaired", gpu, "--note", "new HBM"]) == 0
    out: Any = capsys.readouterr().out
    assert f"{gpu} marked repaired by local-operator" in out
    assert cli.main([*token_args("viewer"), "--url", served_api, "repairs", gpu]) == 0
    assert "repaired  by local-operator: new HBM" in capsys.readouterr().out


def test_a_reset_done_by_hand_needs_an_operator_is_kept_and_listed(
    served_api: str, gpu: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{served_api}/api/v1/gpus/{gpu}/remedies"
    assert httpx.post(url, json={"by": "oncall"}).status_code == 401
    assert VIEWER.post(url).status_code == 403
    done = OPERATOR.post(url, json={"by": "oncall", "note": "nvidia-smi -r"})  # the body's `by` is ignored
    assert done.status_code == 201, done.text
    assert {k: done.json()[k] for k in ("gpu_uuid", "remedy", "source", "plan_id", "actor", "note")} == {
        "gpu_uuid": gpu, "remedy": "reset_gpu", "source": "operator", "plan_id": None,
        "actor": "local-operator", "note": "nvidia-smi -r",
    }  # fmt: skip
    for hostile in ({"remedy": "prayer"}, {"remedy": "reboot"}, {"note": "\x00"}, {"note": "x" * 501}):
        refused = OPERATOR.post(url, json=hostile)
        assert refused.status_code == 422, (hostile, refused.text)
    unknown = "GPU-00000000-0000-0000-0000-00000000dead"
    assert OPERATOR.post(url.replace(gpu, unknown)).status_code == 404
    dc_tech = identities().issue("dc-tech", "operator")
    token_file = identities().directory / "dc-tech.token"
    token_file.write_text(dc_tech)
    reboot = ["--token-file", str(token_file), "--url", served_api, "remedied", gpu, "--reboot"]
    assert cli.main(reboot) == 0
    assert f"{gpu}: reboot_node by dc-tech at " in capsys.readouterr().out
    assert [(r["remedy"], r["actor"]) for r in VIEWER.get(url).json()["remedies"]] == [
        ("reboot_node", "dc-tech"), ("reset_gpu", "local-operator"),
    ]  # fmt: skip
    assert cli.main([*token_args("viewer"), "--url", served_api, "remedies", gpu]) == 0
    assert "reset_gpu    by operator local-operator: nvidia-smi -r" in capsys.readouterr().out
