"""The fleet summary counts a GPU missing after the rules' missing_after_s, as the scorer's verdict does."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from services.api.settings import ApiSection
from services.scorer.rules_config import load_rules
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from tests.helpers.identities import api_app, as_role
from tests.helpers.store_rows import T0, add_gpu, add_latest


def summary_missing(db: DatabaseSettings, api: ApiSection) -> int:
    with TestClient(
        headers=as_role("viewer"), app=api_app(db, api.model_copy(update={"cache_max_age_s": 0}))
    ) as client:
        missing: int = client.get("/api/v1/fleet/summary").json()["missing"]
        return missing


def test_a_gpu_silent_longer_than_the_rule_allows_is_missing(
    migrated: DatabaseSettings, tmp_path: Path
) -> None:
    rule_s = load_rules().availability.missing_after_s
    with connect(migrated) as conn:
        for i, behind_s in enumerate([0, rule_s - 1, rule_s + 1, rule_s + 30]):
            add_gpu(conn, i, host=f"node-{i}")
            add_latest(conn, i, at=T0 - timedelta(seconds=behind_s))
        conn.commit()
    assert summary_missing(migrated, ApiSection()) == 2
    lenient = tmp_path / "rules.toml"
    lenient.write_text(f"[availability]\nmissing_after_s = {rule_s + 60}\n")
    assert summary_missing(migrated, ApiSection(rules_file=lenient)) == 0
