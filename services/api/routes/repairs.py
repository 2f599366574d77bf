"""A way back to healthy: an operator marks a GPU repaired or returned, or records a reset or reboot done by
hand; its marks and remedies, listed. Each write is recorded under the token's subject."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Query

from shared.store import remedies, repairs
from shared.store.remedies import Remedy as RemedyKind
from shared.store.repairs import RepairKind

from ..answers import problems
from ..answers.repairs import Remedies, Remedy, Repair, Repairs
from ..deps import Db, Operator
from ..parameters import GpuPath, NoQuery

router = APIRouter(tags=["gpus"])
Note = Annotated[str, Body(max_length=500, pattern=r"^[^\x00-\x1f\x7f]*$")]
MARKS_LISTED = 1000  # a GPU's marks are few: the newest this many, no paging
REFUSED = problems(
    {
        401: "no bearer token, or one refused",
        403: "the caller is not an operator",
        404: "no such GPU in the inventory",
    }
)


@router.post(
    "/gpus/{gpu_uuid}/repairs",
    status_code=201,
    responses=REFUSED,
)
async def mark_repaired(
    db: Db,
    gpu_uuid: GpuPath,
    query: Annotated[NoQuery, Query()],
    who: Operator,
    kind: Annotated[RepairKind, Body()] = "repaired",
    note: Note = "",
) -> Repair:
    """Mark a GPU repaired (in place) or returned (from repair), an operator's, recorded under the
    token's subject (a `by` in the body is ignored). From the next
    scoring cycle its findings resolve and its counts (XIDs, losses, error rates, pattern rules)
    start again; its verdict history stays as it was."""
    async with db.acknowledging() as conn:
        done = await repairs.mark(conn, gpu_uuid, kind=kind, by=who.subject, note=note)
    if done is None:
        raise HTTPException(404, f"no GPU {gpu_uuid}")
    return Repair.model_validate(done)


@router.get("/gpus/{gpu_uuid}/repairs")
async def repair_marks(db: Db, gpu_uuid: GpuPath, query: Annotated[NoQuery, Query()]) -> Repairs:
    """A GPU's repair marks, newest first (at most 1000): who marked it, when, what, why (the audit trail)."""
    async with db.reading() as conn:
        found = await repairs.listed(conn, gpu_uuid, limit=MARKS_LISTED)
    return Repairs.model_validate({"gpu_uuid": gpu_uuid, "repairs": found})


@router.post(
    "/gpus/{gpu_uuid}/remedies",
    status_code=201,
    responses=REFUSED,
)
async def record_remedy(
    db: Db,
    gpu_uuid: GpuPath,
    query: Annotated[NoQuery, Query()],
    who: Operator,
    remedy: Annotated[RemedyKind, Body()] = "reset_gpu",
    note: Note = "",
) -> Remedy:
    """Record a GPU reset (`reset_gpu`) or its node's reboot (`reboot_node`) done by hand, an operator's,
    recorded under the token's subject (a `by` in the body is ignored).
    It resolves what the remediator's own would: from the next scoring cycle the XIDs its rung covers
    (NVIDIA's catalogue) count only after it, and one seen again within a day escalates
    (recurred_after_remedy); the history keeps them."""
    async with db.acknowledging() as conn:
        done = await remedies.mark(conn, gpu_uuid, remedy=remedy, by=who.subject, note=note)
    if done is None:
        raise HTTPException(404, f"no GPU {gpu_uuid}")
    return Remedy.model_validate(done)


@router.get("/gpus/{gpu_uuid}/remedies")
async def remedies_of(db: Db, gpu_uuid: GpuPath, query: Annotated[NoQuery, Query()]) -> Remedies:
    """A GPU's remedies, newest first (at most 1000): the remediator's (its plan), an operator's by hand, the
    GPU's own (its NVML recovery action back to none)."""
    async with db.reading() as conn:
        found = await remedies.listed(conn, gpu_uuid, limit=MARKS_LISTED)
    return Remedies.model_validate({"gpu_uuid": gpu_uuid, "remedies": found})
