"""The verifier's records: each GPU's chained verifications, each node's announced identity and its history.

`/gpus/{uuid}/verifications` also checks the links between the records it
returns (each record's prev_sha256 against the stored hash of the record
before it), so a gap or a forged record in the stored chain shows in the
answer; `python -m services.verifier audit` checks the whole topic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from shared.store import verifications

from ..answers import problems
from ..answers.verification import SystemHistory, SystemIdentity, Systems, Verifications
from ..deps import Db
from ..paging import decode_cursor, page
from ..parameters import GpuPath, HostPath, NoQuery, PageQuery, SystemsQuery, VerificationsQuery

router = APIRouter(tags=["verification"])


def chain_breaks(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Links that do not hold between the returned records of consecutive seqs.

    A seq held by several records (a fork or a forgery) is one break; a record after it
    links if its prev_sha256 is the hash of any of them, whatever order they came in.
    """
    by_seq: dict[int, list[Mapping[str, Any]]] = {}
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


@router.get("/gpus/{gpu_uuid}/verifications")
async def gpu_verifications(
    db: Db, gpu_uuid: GpuPath, query: Annotated[VerificationsQuery, Query()]
) -> Verifications:
    """The GPU's newest verification records (compute checks, logged operations), newest first."""
    after = decode_cursor(query.cursor, [int, datetime]) if query.cursor else [None, None]
    kind, outcome = query.kind, query.outcome
    async with db.reading() as conn:
        found = await verifications.verifications_page(
            conn, gpu_uuid, kind=kind, outcome=outcome, limit=query.limit + 1, after=(after[0], after[1])
        )
        total = await verifications.verifications_count(conn, gpu_uuid, kind=kind, outcome=outcome)
    listed = page("verifications", found, total=total, limit=query.limit, key=lambda r: (r["seq"], r["time"]))
    ordered = sorted(listed["verifications"], key=lambda r: (r["seq"], r["time"]))
    breaks = chain_breaks(ordered) if kind is None and outcome is None else []
    return Verifications.model_validate({"gpu_uuid": gpu_uuid, **listed, "chain_breaks": breaks})


@router.get("/systems")
async def systems(db: Db, query: Annotated[SystemsQuery, Query()]) -> Systems:
    """Every node's latest announced identity, in brief."""
    (after,) = decode_cursor(query.cursor, [str]) if query.cursor else [None]
    async with db.reading() as conn:
        found = await verifications.systems_page(conn, limit=query.limit + 1, after=after)
        total = await verifications.systems_count(conn)
    return Systems.model_validate(
        page("systems", found, total=total, limit=query.limit, key=lambda r: (r["hostname"],))
    )


@router.get("/systems/{hostname}", responses=problems({404: "the node never announced its identity"}))
async def system_detail(db: Db, hostname: HostPath, query: Annotated[NoQuery, Query()]) -> SystemIdentity:
    """A node's latest identity, as its collector announced it (gpu-systems)."""
    async with db.reading() as conn:
        found = await verifications.system_latest(conn, hostname)
    if found is None:
        raise HTTPException(404, f"no system {hostname}")
    return SystemIdentity.model_validate({"hostname": hostname, **found})


@router.get("/systems/{hostname}/history", responses=problems({404: "the node never announced its identity"}))
async def system_history(db: Db, hostname: HostPath, query: Annotated[PageQuery, Query()]) -> SystemHistory:
    """Every identity the node announced, newest first: when its hardware or driver changed."""
    after = decode_cursor(query.cursor, [datetime, str]) if query.cursor else [None, None]
    async with db.reading() as conn:
        total = await verifications.system_history_count(conn, hostname)
        if not total:
            raise HTTPException(404, f"no system {hostname}")
        found = await verifications.system_history_page(
            conn, hostname, limit=query.limit + 1, after=(after[0], after[1])
        )
    listed = page(
        "history", found, total=total, limit=query.limit, key=lambda r: (r["time"], r["identity_sha256"])
    )
    return SystemHistory.model_validate({"hostname": hostname, **listed})
