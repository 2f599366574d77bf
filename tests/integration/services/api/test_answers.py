"""The answers built from whole rows (`SELECT *`) name every column of their table: none is dropped unseen.

An answer model leaves out keys it does not name (services.api.answers), so a
column a migration adds would not reach the API until a model names it; this
test says which, against the migrated schema.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from services.api.answers.alerts import AlertRow
from services.api.answers.gpus import Asset, LatestSample
from services.api.answers.lifecycle import InventoryProblem, InventoryRow, LifecycleDecisionRow, LifecycleRun
from services.api.answers.remediations import Control, PlanDetail
from services.api.answers.workload import GpuProcesses
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings

# model -> (table, the model's fields that are not the table's columns)
WHOLE_ROWS: dict[type[BaseModel], tuple[str, set[str]]] = {
    Asset: ("gpu_assets", set()),  # a GPU's detail
    LatestSample: ("gpu_latest", set()),  # a GPU's detail
    AlertRow: ("gpu_alerts", {"shared"}),  # the alert list, a GPU's open alerts, an acknowledged alert
    GpuProcesses: ("gpu_process_latest", {"processes"}),  # a GPU's process listing
    PlanDetail: ("remediations", {"events"}),  # one remediation plan
    Control: ("remediation_control", set()),  # the remediator's pause and breaker
    LifecycleDecisionRow: ("lifecycle_decisions", set()),  # the lifecycle ranking, a GPU's decisions
    LifecycleRun: ("lifecycle_runs", set()),  # the newest run
    InventoryRow: ("lifecycle_inventory", set()),  # the inventory
    InventoryProblem: ("lifecycle_inventory_problems", set()),
}


@pytest.mark.parametrize("model", list(WHOLE_ROWS), ids=lambda m: m.__name__)
def test_the_model_names_every_column_of_its_table(
    migrated: DatabaseSettings, model: type[BaseModel]
) -> None:
    table, own = WHOLE_ROWS[model]
    with connect(migrated) as conn:
        columns = [
            str(name)
            for (name,) in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
                (table,),
            )
        ]
    assert columns, table
    assert [f for f in model.model_fields if f not in own] == columns, (
        f"{model.__name__} is not {table}'s row"
    )
