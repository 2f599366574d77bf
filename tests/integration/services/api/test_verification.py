"""The verifier's API routes (#18) against hostile paths and parameters: a 4xx with a message, never a 5xx.

The tables hold records first (two GPU chains, one with a fork, and a node's
identity history), so the routes' success paths run too, not only their refusals.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from services.verifier.chainlog import MemoryChain
from shared.contract.chain import link_of
from shared.contract.models_verify import Outcome, RecordKind, record_json
from shared.gpu.gpu_identity import NvmlReader
from shared.plumbing.db import connect
from shared.settings.common import DatabaseSettings
from shared.store.verifications import LATEST_SQL, SYSTEM_SQL, VERIFICATION_SQL
from tests.helpers.identities import as_role
from tests.helpers.verifier_fakes import UUIDS, FakeNvml

ROUTES = ["/api/v1/gpus/{}/verifications", "/api/v1/systems/{}", "/api/v1/systems/{}/history"]
PARAMS = ["limit", "kind", "outcome", "", "limit[]", "LIMIT", "\x00", "é"]
ANY_TEXT = st.text(st.characters(codec=None), max_size=40)
VALUES = (
    st.sampled_from(["0", "-1", "1", "1000", "1001", "10000", "10001", "1e3", "NaN", "pass", "operation", ""])
    | st.integers(-(2**70), 2**70).map(str)
    | ANY_TEXT
)


@pytest.fixture
def stored(migrated: DatabaseSettings) -> dict[str, Any]:
    """A chain in gpu_verifications (seq 1 forked) and a node in gpu_systems, as the sink stores them."""
    chain = MemoryChain()
    for i in range(3):
        chain.append(
            {"kind": RecordKind.COMPUTE_CHECK, "gpu_uuid": UUIDS[0], "hostname": "node-1", "verifier_id": "v",
             "name": f"op{i}", "device": "cuda:0", "outcome": Outcome.PASS, "device_ms": 1e-300}
        )  # fmt: skip
    identity = NvmlReader(FakeNvml()).identity("node-1", "c1")
    with connect(migrated) as conn:
        for n, r in enumerate(chain.records):
            fields = record_json(r)
            for forged in (False, True) if n == 1 else (False,):
                record = {**fields, "name": "forged"} if forged else fields
                conn.execute(
                    VERIFICATION_SQL,
                    (r.time, r.gpu_uuid, r.seq, r.kind.value, record["name"], r.outcome.value, r.hostname,
                     r.device, r.backend, r.device_ms, r.cpu_ms, r.speedup, r.prev_sha256, link_of(record),
                     Jsonb(record), 0, n),
                )  # fmt: skip
        system = (identity.time, "node-1", identity.identity_sha256, "nvml", 2, Jsonb(record_json(identity)))
        conn.execute(SYSTEM_SQL, system)
        conn.execute(LATEST_SQL, system[1:2] + system[0:1] + system[2:])
        conn.commit()
    return {"gpu": UUIDS[0], "host": "node-1"}


def check_reply(reply: httpx.Response) -> None:
    assert reply.status_code < 500, (reply.request.url, reply.status_code, reply.text)
    if reply.status_code >= 400:
        detail = reply.json()["detail"]
        assert isinstance(detail, str)
        assert detail


def test_the_stored_records_are_served_with_the_fork_shown(served_api: str, stored: dict[str, Any]) -> None:
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        answer = client.get(f"/api/v1/gpus/{stored['gpu']}/verifications").json()
        assert [v["seq"] for v in answer["verifications"]] == [2, 1, 1, 0]
        assert [b["seq"] for b in answer["chain_breaks"]] == [1]
        assert client.get(f"/api/v1/systems/{stored['host']}").json()["record"]["hostname"] == "node-1"
        assert len(client.get(f"/api/v1/systems/{stored['host']}/history").json()["history"]) == 1


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    route=st.sampled_from([*ROUTES, "/api/v1/systems"]),
    segment=st.sampled_from(["{gpu}", "{host}", "node-1", UUIDS[0], "", ".", "..", "%00", "%2F", "a/b"])
    | ANY_TEXT,
    params=st.lists(st.tuples(st.sampled_from(PARAMS) | ANY_TEXT, VALUES), max_size=4),
)
@example(route=ROUTES[0], segment="{gpu}", params=[("limit", "100000000000000000000000")])
@example(route=ROUTES[1], segment="node-1\x00", params=[])
@example(route=ROUTES[2], segment="{host}", params=[("limit", "0")])
@example(route=ROUTES[0], segment="GPU-" + "a" * 500, params=[("kind", "\ud800")])
def test_hostile_paths_and_parameters_get_a_4xx_with_a_message_never_a_5xx(
    served_api: str, stored: dict[str, Any], route: str, segment: str, params: list[tuple[str, str]]
) -> None:
    segment = segment.format(**stored) if segment in ("{gpu}", "{host}") else segment
    path = route.format(quote(segment.encode("utf-8", "surrogatepass"), safe="/%"))
    query = "&".join(
        f"{quote(k.encode('utf-8', 'surrogatepass'))}={quote(v.encode('utf-8', 'surrogatepass'))}"
        for k, v in params
    )
    with httpx.Client(headers=as_role("viewer"), base_url=served_api, timeout=10) as client:
        reply = client.get(path + ("?" + query if query else ""))
    check_reply(reply)
    if reply.status_code == 200:
        json.dumps(reply.json())  # a complete JSON document
