"""The lifecycle tests' GPUs: one bought on a known day, and a busy H100 of a training job."""

from __future__ import annotations

from datetime import date, timedelta

from services.lifecycle.decide import GpuFacts
from services.lifecycle.inventory import InventoryEntry

TODAY = date(2026, 6, 1)


def bought(
    *, warranty_days: int, spares: int = 0, age_days: int = 365, price: float = 30_000
) -> InventoryEntry:
    return InventoryEntry(
        line=2,
        serial="1652922012345",
        gpu_uuid=None,
        purchase_date=TODAY - timedelta(days=age_days),
        purchase_price=price,
        warranty_end=TODAY + timedelta(days=warranty_days),
        rma_turnaround_days=21,
        spares_on_hand=spares,
    )


def busy(p30: float | None, inv: InventoryEntry | None, **kw: object) -> GpuFacts:
    base = dict(
        p_fail_30d=p30,
        utilisation=0.9,
        power_w=700.0,
        work="training",
        job_gpus=8,
        resets_30d=0,
        inventory=inv,
    )
    return GpuFacts("GPU-3f6e1b2a-9c1d-4e5f-8a7b-0c1d2e3f4a5b", **{**base, **kw})  # type: ignore[arg-type]
