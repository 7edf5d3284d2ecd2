"""The OpenAPI document's promises about errors and keys (tests/functional/test_openapi_contract.py
holds the API to them): every error status of every operation in the API's one error shape, no
FastAPI 422 the API never answers, the API key as a security scheme on every operation but the
health checks, and an example for every JSON request body."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelless.api import create_app
from modelless.api.openapi import error_responses
from modelless.api.services import build_services
from modelless.metadata.memory import InMemoryMetadataStore
from tests.unit.test_api import make_settings

PUBLIC_PATHS = {"/health", "/health/live", "/health/ready"}
ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
KEY_SCHEMES: list[dict[str, list[str]]] = [{"ApiKey": []}, {"BearerKey": []}]


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp_path: Path = tmp_path_factory.mktemp("openapi")
    services = build_services(make_settings(tmp_path), store=InMemoryMetadataStore())
    try:
        yield create_app(services).openapi()
    finally:
        services.close()


def operations(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            yield f"{method.upper()} {path}", operation


def test_every_error_status_of_every_operation_is_the_error_shape(document: dict[str, Any]) -> None:
    checked = 0
    for label, operation in operations(document):
        responses = operation["responses"]
        assert "500" in responses, label  # an unexpected failure is answered in the shape too
        for status, response in responses.items():
            if int(status) < 400:
                continue
            assert response["content"]["application/json"]["schema"] == ERROR_SCHEMA, (label, status)
            assert response["description"], (label, status)
            checked += 1
        if "503" in responses:
            assert "Retry-After" in responses["503"]["headers"], label
    assert checked > 100


def test_no_operation_lists_fastapis_422_which_the_api_never_answers(document: dict[str, Any]) -> None:
    assert "HTTPValidationError" not in document["components"]["schemas"]
    with_422 = {label for label, operation in operations(document) if "422" in operation["responses"]}
    # 422 is targets_unreachable only: no variant meets a query's targets.
    assert with_422 == {"POST /v1/online_query", "POST /v1/pipelines/{name}/query"}


def test_the_error_shape_is_code_message_and_details(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["ErrorResponse"]["required"] == ["error"]
    assert schemas["ErrorBody"]["required"] == ["code", "message"]
    assert set(schemas["ErrorBody"]["properties"]) == {"code", "message", "details"}


def test_the_api_key_is_a_security_scheme_on_every_operation_but_health(document: dict[str, Any]) -> None:
    schemes = document["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-Api-Key",
        "description": schemes["ApiKey"]["description"],
    }
    assert schemes["BearerKey"]["type"] == "http"
    assert schemes["BearerKey"]["scheme"] == "bearer"
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            label = f"{method.upper()} {path}"
            if path in PUBLIC_PATHS:
                assert "security" not in operation, label
                assert "401" not in operation["responses"], label
            else:
                assert operation["security"] == KEY_SCHEMES, label  # either one
                assert "401" in operation["responses"], label
                # The key is a scheme, not a parameter that clients would fill in by hand.
                names = {p["name"].lower() for p in operation.get("parameters", [])}
                assert not names & {"x-api-key", "authorization"}, label


def test_every_json_request_body_has_an_example(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    bodies = 0
    for label, operation in operations(document):
        for media, content in operation.get("requestBody", {}).get("content", {}).items():
            if content.get("schema", {}).get("format") == "binary":
                continue  # a file's bytes
            schema = content.get("schema", {})
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
            assert "example" in content or schema.get("examples"), (label, media)
            bodies += 1
    assert bodies >= 11


def test_names_and_the_choice_of_model_or_targets_are_in_the_schema(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for model in ("CreateApp", "ImportProfiles", "Feedback", "OfflineQuery", "RegisterPipeline"):
        assert schemas[model]["properties"]["appID"]["pattern"].startswith("^[A-Za-z0-9]"), model
    online_query = document["paths"]["/v1/online_query"]["post"]["requestBody"]["content"]
    required = [branch["required"] for branch in online_query["application/json"]["schema"]["anyOf"]]
    assert required == [["modelName"], ["latency"], ["accuracy"]]
    assert [branch["required"] for branch in schemas["Feedback"]["oneOf"]] == [["label"], ["reward"]]


def test_error_responses_lists_500_always_and_retry_after_with_503() -> None:
    responses = error_responses(404, 503)
    assert list(responses) == [404, 500, 503]
    assert "Retry-After" in responses[503]["headers"]
    assert "headers" not in responses[404]
