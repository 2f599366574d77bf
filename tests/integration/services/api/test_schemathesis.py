"""Schemathesis over the committed OpenAPI document (docs/api/openapi.json), against the API served for
real with an admin's token: every generated request's answer conforms to the document (status code,
content type, headers, body schema, no 5xx, `Allow` and 405 for a method a path does not take), invalid
data is refused, and the API refuses a call without the token it declares. One check is left out:
`positive_data_acceptance`, which counts a documented 400 for a value the schema cannot express (a
reversed range, a cursor the API did not return) as a failure.

Bounded and seeded, so CI runs the same cases in a few minutes at most: `EXAMPLES` per operation,
derandomized (Hypothesis' seed comes from each test's name). Schemathesis' pytest plugin does not run
under pytest 9 (it reads a private attribute pytest dropped), so the test drives its per-operation
strategies with Hypothesis directly; the requests and the checks are the same.
"""

from __future__ import annotations

import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance

from services.api.openapi import DOCUMENT
from tests.helpers.identities import as_role

EXAMPLES = 25  # per operation: about 1,000 requests in all
BUDGET_S = 300


def test_the_committed_document_holds_for_every_generated_request(served_api: str) -> None:
    schema = schemathesis.openapi.from_path(DOCUMENT)
    failures: list[str] = []
    paths: set[str] = set()
    operations = calls = 0
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an Err would raise here, as it should
        operations += 1
        paths.add(operation.path)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
        def check(case: Any) -> None:
            nonlocal calls
            calls += 1
            headers = {**(case.headers or {}), **as_role("admin")}
            response = case.call(base_url=served_api, headers=headers, timeout=30)
            try:
                case.validate_response(response, headers=headers, excluded_checks=[positive_data_acceptance])
            except (
                AssertionError,
                FailureGroup,
            ) as e:  # each check's failure, collected and shown at the end
                failures.append(f"{case.method} {case.formatted_path} {case.query}: {response.status_code}:"
                                f" {str(e)[:600]}")  # fmt: skip

        check()
    assert operations >= 30
    # the verifier's routes (#18) are in the schema, so they were attacked too
    assert {
        "/api/v1/gpus/{gpu_uuid}/verifications",
        "/api/v1/systems",
        "/api/v1/systems/{hostname}",
        "/api/v1/systems/{hostname}/history",
    } <= paths, sorted(paths)
    assert failures == [], "\n".join(failures[:20])
    assert calls >= operations * 5
    assert time.monotonic() - started < BUDGET_S  # bounded: it must stay a few minutes at most in CI
