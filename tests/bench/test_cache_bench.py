"""The prediction-cache benchmark (bench/cache.py) on a tiny input: its pairs measured through the
real API in-process (real services, the real runtime on a two-input token model), its summary,
its write-up and its plot. The numbers are not judged; the shape of the run is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench import cache as bench_cache
from modelless.api import create_app
from modelless.api.services import build_services
from modelless.cache.base import row_digests
from modelless.client import Client
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.repository.local import LocalModelRepository
from tests.input_models import image_model, image_record
from tests.unit.test_api import Api, InProcessLambda, make_settings
from tests.unit.test_api_query_inputs import APP, publish


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    """An app's client on the in-process API with the cache on, serving a tiny image model."""
    store = InMemoryMetadataStore()
    repository = LocalModelRepository(tmp_path / "repo")
    lambda_tier = InProcessLambda(repository, tmp_path / "lambda-cache")
    services = build_services(
        make_settings(tmp_path, prediction_cache_enabled=True), store=store, lambda_tier=lambda_tier
    )
    api = Api(TestClient(create_app(services)), services, store, repository, lambda_tier)
    key = api.create_app(APP)
    publish(api, image_record(APP, "images", None), image_model())
    built = Client("http://testserver", api_key=key["X-Api-Key"])
    built._http.close()
    built._http = cast(Any, api.client)
    try:
        yield built
    finally:
        api.client.close()
        services.close()


def test_every_input_is_new_to_the_cache() -> None:
    base = np.random.default_rng(0).random((3, 2, 2)).astype(np.float32)
    inputs = bench_cache.distinct_inputs(base, 7)
    assert inputs.shape == (7, 2, 2) and inputs.dtype == np.float32
    assert len(set(row_digests(inputs))) == 7


def test_the_quick_core_measures_pairs_and_writes_its_section(client: Client, tmp_path: Path) -> None:
    base = np.random.default_rng(1).random((4, 3, 4, 4)).astype(np.float32)
    inputs = bench_cache.distinct_inputs(base, 6)

    def query(batch: np.ndarray) -> dict[str, Any]:
        return client.online_query(batch, APP, model_name="images")

    pairs = bench_cache.measure_pairs(query, inputs, warmup=1)

    assert len(pairs.miss_client_ms) == len(pairs.hit_client_ms) == 5
    assert (pairs.unexpected, pairs.mismatched) == (0, 0)
    assert pairs.miss_tiers == {"lambda": 5}
    summary = bench_cache.summarise(pairs)
    assert summary["pairs"] == 5 and summary["ratio_client_p50"] is not None
    path = bench_cache.write(pairs, "`images` (test)", "test", 0.0, tmp_path)
    text = path.read_text()
    assert text.startswith("## The prediction cache") and "Cache hit latency vs a miss" in text
    assert (tmp_path / "cache.png").stat().st_size > 0
    data = json.loads((tmp_path / "cache.json").read_text())
    assert data["summary"] == summary and len(data["headlines"]) == 1
