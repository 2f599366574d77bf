"""The committed OpenAPI document is the app's, and it describes every answer: each 2xx has a schema."""

from __future__ import annotations

from typing import Any

import pytest

from services.api import openapi

DOCUMENT = openapi.document()
OPERATIONS = [
    (method.upper(), path, operation)
    for path, methods in DOCUMENT["paths"].items()
    for method, operation in methods.items()
]


def test_the_committed_document_is_the_apps() -> None:
    assert openapi.DOCUMENT.exists(), "no docs/api/openapi.json: run `make openapi`"
    assert openapi.DOCUMENT.read_text() == openapi.rendered(DOCUMENT), (
        "docs/api/openapi.json is stale: run `make openapi` (python -m services.api.openapi) and commit it"
    )
    assert openapi.main(["--check"]) == 0


def test_check_says_when_the_document_is_stale(tmp_path: Any) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n")
    assert openapi.main(["--check", "--output", str(stale)]) == 1
    assert openapi.main(["--output", str(stale)]) == 0
    assert openapi.main(["--check", "--output", str(stale)]) == 0


def schema_of(ref_or_schema: dict[str, Any]) -> dict[str, Any]:
    ref = ref_or_schema.get("$ref")
    if ref is None:
        return ref_or_schema
    found: dict[str, Any] = DOCUMENT["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return found


@pytest.mark.parametrize(
    ("method", "path", "operation"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS]
)
def test_every_2xx_answer_has_a_media_type_and_a_schema(
    method: str, path: str, operation: dict[str, Any]
) -> None:
    answers = {status: r for status, r in operation["responses"].items() if status.startswith("2")}
    assert answers, f"{method} {path} declares no 2xx answer"
    for status, answer in answers.items():
        assert answer.get("content"), f"{method} {path} {status} has no media type"
        for media_type, content in answer["content"].items():
            schema = content.get("schema")
            assert schema, f"{method} {path} {status} {media_type} has no schema"
            if media_type == "application/json":
                assert schema_of(schema).get("type") == "object", f"{method} {path}: an untyped JSON answer"
                assert schema_of(schema).get("properties"), f"{method} {path}: an answer without fields"


def test_every_refusal_is_a_problem_with_a_detail() -> None:
    for method, path, operation in OPERATIONS:
        for status, answer in operation["responses"].items():
            if status.startswith(("4", "5")) and path.startswith("/api/v1"):
                schema = answer["content"]["application/json"]["schema"]
                assert schema_of(schema)["required"] == ["detail"] or path == "/readyz", (
                    method,
                    path,
                    status,
                )
    assert "HTTPValidationError" not in DOCUMENT["components"]["schemas"]  # FastAPI's, not what the API says


def test_every_answer_field_is_always_present() -> None:
    """An answer's keys are always there (null where there is no value): the schemas say so."""
    for name, schema in DOCUMENT["components"]["schemas"].items():
        if schema.get("type") == "object" and "properties" in schema and not name.startswith("Body_"):
            assert sorted(schema.get("required", [])) == sorted(schema["properties"]), name
