"""REST endpoints for the verifier's records: each GPU's chained verifications, each node's identity.

`/gpus/{uuid}/verifications` also checks the links between the records it
returns (each record's prev_sha256 against the stored hash of the record
before it), so a gap or a forged record in the stored chain shows in the
answer; `python -m services.verifier audit` checks the whole topic.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request

from shared.models_verify import Outcome, RecordKind
from shared.store import verifications

from .paging import Cursor, decode_cursor, page, wire
from .routes import GPU_UUID, LABEL, connection, only

router = APIRouter(prefix="/api/v1")

GpuPath = Annotated[str, Path(pattern=GPU_UUID)]
HostPath = Annotated[str, Path(pattern=LABEL, max_length=253)]


def chain_breaks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Links that do not hold between the returned records of consecutive seqs.

    A seq held by several records (a fork or a forgery) is one break; a record after it
    links if its prev_sha256 is the hash of any of them, whatever order they came in.
    """
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_seq.setdefault(record["seq"], []).append(record)
    breaks = []
    for seq in sorted(by_seq):
        if len(by_seq[seq]) > 1:
            breaks.append({"seq": seq, "reason": "two records with the same seq (a fork or a forgery)"})
        before = {r["sha256"] for r in by_seq.get(seq - 1, [])}
        if before and any(r["prev_sha256"] not in before for r in by_seq[seq]):
            breaks.append({"seq": seq, "reason": "prev_sha256 does not match the previous record"})
    return breaks


@router.get("/gpus/{gpu_uuid}/verifications", dependencies=[only("kind", "outcome", "limit", "cursor")])
async def gpu_verifications(
    request: Request,
    gpu_uuid: GpuPath,
    kind: Literal[tuple(k.value for k in RecordKind)] | None = None,  # type: ignore[valid-type]
    outcome: Literal[tuple(o.value for o in Outcome)] | None = None,  # type: ignore[valid-type]
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """The GPU's newest verification records (compute checks, logged operations), newest first."""
    after = decode_cursor(cursor, [int, datetime]) if cursor else [None, None]
    async with connection(request.app.state.pool) as conn:
        found = await verifications.verifications_page(
            conn, gpu_uuid, kind=kind, outcome=outcome, limit=limit + 1, after=(after[0], after[1])
        )
        total = await verifications.verifications_count(conn, gpu_uuid, kind=kind, outcome=outcome)
    listed = page("verifications", wire(found), total=total, limit=limit, key=lambda r: (r["seq"], r["time"]))
    ordered = sorted(listed["verifications"], key=lambda r: (r["seq"], r["time"]))
    breaks = chain_breaks(ordered) if kind is None and outcome is None else []
    return {"gpu_uuid": gpu_uuid, **listed, "chain_breaks": breaks}


@router.get("/systems", dependencies=[only("limit", "cursor")])
async def systems(
    request: Request, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000, cursor: Cursor = None
) -> dict[str, Any]:
    """Every node's latest announced identity, in brief."""
    (after,) = decode_cursor(cursor, [str]) if cursor else [None]
    async with connection(request.app.state.pool) as conn:
        found = await verifications.systems_page(conn, limit=limit + 1, after=after)
        total = await verifications.systems_count(conn)
    return page("systems", wire(found), total=total, limit=limit, key=lambda r: (r["hostname"],))


@router.get("/systems/{hostname}", dependencies=[only()])
async def system_detail(request: Request, hostname: HostPath) -> dict[str, Any]:
    """A node's latest identity, as its collector announced it (gpu-systems)."""
    async with connection(request.app.state.pool) as conn:
        found = await verifications.system_latest(conn, hostname)
    if found is None:
        raise HTTPException(404, f"no system {hostname}")
    return {"hostname": hostname, **wire(found)}


@router.get("/systems/{hostname}/history", dependencies=[only("limit", "cursor")])
async def system_history(
    request: Request,
    hostname: HostPath,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> dict[str, Any]:
    """Every identity the node announced, newest first: when its hardware or driver changed."""
    after = decode_cursor(cursor, [datetime, str]) if cursor else [None, None]
    async with connection(request.app.state.pool) as conn:
        total = await verifications.system_history_count(conn, hostname)
        if not total:
            raise HTTPException(404, f"no system {hostname}")
        found = await verifications.system_history_page(
            conn, hostname, limit=limit + 1, after=(after[0], after[1])
        )
    return {"hostname": hostname, **page("history", wire(found), total=total, limit=limit,
                                         key=lambda r: (r["time"], r["identity_sha256"]))}  # fmt: skip
