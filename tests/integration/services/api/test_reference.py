"""The action ladder as the API, the page and the CLI give it: one table, the same everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from services.api import cli
from services.api.settings import ApiSection
from shared.contract.models_health import ACTION_REASONS, LADDER
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import VIEWER, api_app, as_role, token_args


@pytest.fixture
def client(migrated: DatabaseSettings) -> Iterator[TestClient]:
    with TestClient(headers=as_role("viewer"), app=api_app(migrated, ApiSection())) as c:
        yield c


def test_the_api_answers_the_ladder_in_order_with_reasons(client: TestClient) -> None:
    answer = client.get("/api/v1/reference/actions")
    assert answer.status_code == 200
    rungs = answer.json()["actions"]
    assert [r["action"] for r in rungs] == list(LADDER)
    assert [r["rank"] for r in rungs] == list(range(len(LADDER)))
    assert all(r["why"] == ACTION_REASONS[r["action"]] for r in rungs)
    assert client.get("/api/v1/reference/actions?x=1").status_code == 422  # a name it does not take
    schema = client.get("/openapi.json").json()["components"]["schemas"]["LadderRung"]
    assert schema["properties"]["action"]["enum"] == list(LADDER)


def test_the_page_lists_the_ladder_for_its_script(client: TestClient) -> None:
    page = client.get("/").text
    for action in LADDER:
        assert f'<li data-action="{action}"' in page
    assert page.index('data-action="inspect"') < page.index('data-action="send_for_repair"')
    assert "#ladder li[data-action=" in client.get("/static/fleet.js").text


def test_the_cli_prints_the_ladder_and_why_a_gpus_action(
    served_api: str, scored: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*token_args("viewer"), "--url", served_api, "actions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "recommended actions, cheapest first:"
    assert [line.split()[1] for line in lines[1:]] == list(LADDER)
    assert cli.main([*token_args("viewer"), "--url", served_api, "gpu", scored["sick"]]) == 0
    action = VIEWER.get(f"{served_api}/api/v1/gpus/{scored['sick']}").json()["status"]["action"]
    assert (
        f"action {action} (rung {LADDER.index(action)}: {ACTION_REASONS[action]})" in capsys.readouterr().out
    )
