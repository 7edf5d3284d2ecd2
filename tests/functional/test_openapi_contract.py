"""The API against its own OpenAPI document, by schemathesis: for every operation, requests made
from the document (its schemas and examples, valid and deliberately invalid) must never get a 5xx,
and every reply's status, content type and body must be ones the document lists for it.

The gateway runs in-process (ASGI) over real services: an in-memory store, a local repository, the
Lambda tier in this process, S3 emulated by moto (offline jobs and s3:// registrations read it).
One app with two ready models, so that requests naming it get past the key check; registration's
background part never starts. Bounded: a few examples per operation, no deadline.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from modelless.api import create_app
from modelless.api.services import build_services
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.repository.local import LocalModelRepository
from tests.conftest import service_url
from tests.unit.test_api import ADMIN_KEY, Api, InProcessLambda, make_settings, seed_digits

APP = "contract"
# Per operation and kind (valid, invalid); the document's examples come on top.
MAX_EXAMPLES = int(os.environ.get("MODELLESS_CONTRACT_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# The operations only the admin key opens; every other one gets the app's key.
ADMIN_OPERATIONS = {
    ("POST", "/v1/apps"),
    ("GET", "/v1/cache"),
    ("DELETE", "/v1/cache"),
    ("PUT", "/v1/apps/{app_id}/offline-buckets"),
    ("GET", "/metrics"),
}
APP_FIELDS = ("appID", "app_id")


@dataclass
class Gateway:
    api: Api
    app_key: str


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    endpoint = service_url("MODELLESS_TEST_AWS_ENDPOINT")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL", endpoint)  # boto3's default client: never real AWS
        store = InMemoryMetadataStore()
        repository = LocalModelRepository(tmp_path / "repo")
        lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
        services = build_services(make_settings(tmp_path), store=store, lambda_tier=lambda_tier)
        # Registrations stay queued: building and profiling variants of fuzzed uploads is not
        # this test's subject.
        patch.setattr(services.registrar._background, "submit", lambda *args, **kwargs: None)
        app = create_app(services)
        api = Api(TestClient(app), services, store, repository, lambda_tier)
        try:
            app_key = api.create_app(APP)["X-Api-Key"]
            seed_digits(api, APP)
            yield Gateway(api, app_key)
        finally:
            api.client.close()
            services.close()


def test_every_reply_is_one_the_openapi_document_lists(gateway: Gateway) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", gateway.api.client.app)
    started = time.perf_counter()
    operations = 0
    sent: Counter[int] = Counter()
    failures: list[str] = []
    for loaded in schema.get_all_operations():
        if isinstance(loaded, Err):
            failures.append(f"an operation schemathesis cannot read: {loaded.err()}")
            continue
        operation = loaded.ok()
        operations += 1
        admin = (operation.method.upper(), operation.path) in ADMIN_OPERATIONS
        key = ADMIN_KEY if admin else gateway.app_key
        strategies = [
            *schema.get_strategies_from_examples(operation),  # the document's own examples
            operation.as_strategy(GenerationMode.POSITIVE),
            operation.as_strategy(GenerationMode.NEGATIVE),
        ]
        for strategy in strategies:
            failure = _exercise(strategy, key, sent)
            if failure is not None:
                failures.append(f"{operation.label}: {failure}")
    elapsed = time.perf_counter() - started
    print(
        f"schemathesis: {operations} operations, {sum(sent.values())} requests "
        f"({dict(sorted(sent.items()))}), {len(failures)} failures, {elapsed:.1f} s"
    )
    assert operations >= 25  # every operation of the document was exercised
    assert failures == [], "\n\n".join(failures)


def _exercise(strategy: Any, key: str, sent: Counter[int]) -> str | None:
    """Send the strategy's cases, each reply held to the checks; the first failure, told."""

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,  # nothing written under the work tree
        derandomize=True,  # the same cases every run: a failure here is reproducible
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],  # no shrinking: the first failure is told
    )
    @given(strategy)
    def send(case: Any) -> None:
        _name_the_app(case)
        # One request in eight without its key: the 401 is part of the contract too.
        headers = {"X-Api-Key": key} if _toss(case.body, case.query, one_in=8) else {}
        response = case.call_and_validate(headers=headers, checks=CHECKS)
        sent[response.status_code] += 1

    try:
        send()
    except Unsatisfiable:
        return None  # nothing to make invalid: an operation without parameters or a body
    except (Exception, BaseExceptionGroup) as error:  # the checks' failures: a FailureGroup
        return f"{type(error).__name__}: {str(error)[:2000]}"
    return None


def _name_the_app(case: Any) -> None:
    """Most requests name the one app there is (so that they reach past the key check); the rest
    keep the name generated for them (another app's: a 401, 403 or 404)."""
    for part in (case.body, case.query, case.path_parameters):
        if isinstance(part, dict) and _toss(part, case.path, one_in=4):
            for field in APP_FIELDS:
                if field in part:
                    part[field] = APP


def _toss(*parts: Any, one_in: int) -> bool:
    """True but one time in ``one_in``, as a function of the generated data (hypothesis must be
    able to replay a case)."""
    data = json.dumps([repr(p) if isinstance(p, bytes) else p for p in parts], sort_keys=True, default=repr)
    return zlib.crc32(data.encode()) % one_in != 0
