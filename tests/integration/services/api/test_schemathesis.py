"""Schemathesis against the API's own OpenAPI, served for real: no generated request gets a 5xx.

Schemathesis' pytest plugin does not run under pytest 9 (it reads a private
attribute pytest dropped), so the test drives its per-operation strategies
with Hypothesis directly; the requests and the checks are the same.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings


def test_no_generated_request_gets_a_5xx(served_api: str) -> None:
    schema = schemathesis.openapi.from_url(served_api + "/openapi.json")
    failures: list[str] = []
    operations = 0
    paths: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an Err would raise here, as it should
        operations += 1
        paths.add(operation.path)

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            response = case.call(timeout=30)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.formatted_path} {case.query}: {response.status_code}")

        check()
    assert operations >= 8
    # the verifier's routes (#18) are in the schema, so they were attacked too
    assert {
        "/api/v1/gpus/{gpu_uuid}/verifications",
        "/api/v1/systems",
        "/api/v1/systems/{hostname}",
        "/api/v1/systems/{hostname}/history",
    } <= paths, sorted(paths)
    assert failures == []
