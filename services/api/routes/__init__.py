"""The REST endpoints under /api/v1, one module per resource; `router` holds them all.

Every endpoint declares what it answers (services.api.answers) and reads its query
string into one model (services.api.parameters); a refusal is a `Problem`. Each needs a
caller with at least the viewer role; a write asks for its own (services.api.deps).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..answers import problems
from ..deps import caller
from . import (
    alerts,
    fleet,
    gpus,
    history,
    lifecycle,
    reference,
    remediations,
    repairs,
    usage,
    verification,
    workload,
)

# What any endpoint may answer besides its own: refusals of its parameters, and the database being down.
REFUSALS = problems(
    {
        400: "a value the handler refuses: a reversed or too long range, a cursor it did not return",
        401: "no bearer token, or one refused (expired, another issuer or audience, a bad signature)",
        403: "the caller's role does not allow it (reading needs a viewer, writing an operator or admin)",
        429: "too many refused requests from this address",
        422: "a parameter missing, malformed, out of bounds, or one the endpoint does not take",
        503: "the database is not reachable",
    }
)

# every endpoint needs a verified caller (services.api.guard checked the token; this says so again)
router = APIRouter(prefix="/api/v1", responses=REFUSALS, dependencies=[Depends(caller)])
RESOURCES = (
    fleet,
    gpus,
    history,
    alerts,
    repairs,
    verification,
    workload,
    usage,
    lifecycle,
    reference,
    remediations,
)
for resource in RESOURCES:
    router.include_router(resource.router)
