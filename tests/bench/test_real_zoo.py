"""The real zoo's registration for the benchmarks (bench/real_zoo.py) and the variant-picks part
(bench/variant_picks.py), on two tiny stand-in models (never results): registered for real,
in-process, by the project's RegistrationService (every variant built and profiled in child
processes), once for the module; cached, reused, re-registered when the model changes; queries
encoded for the binary path; the variant each target picks through the project's own selection.
Nothing here asserts a timing."""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from bench import real_zoo as real
from bench import variant_picks
from bench.real_zoo import RealZoo, RegisteredModel
from modelless.types import QueryTargets
from tests.bench.standins import StandIn, image_model


def test_every_model_is_registered_with_its_timings_and_reasons(zoo: RealZoo) -> None:
    assert [m.name for m in zoo.models] == ["tiny-image", "tiny-text"]
    assert zoo.apps == ["zoo-images", "zoo-text"]
    for model in zoo.models:
        assert model.registration.status.value == "ready"
        assert model.kept, "registration kept no variant"
        assert model.first_servable_s is not None
        assert 0 <= model.first_servable_s <= model.all_profiled_s
        # Every pruned variant has the registration's reason, and none of them is served.
        assert len(model.prune_reasons) == model.registration.pruned
        assert not set(model.prune_reasons) & set(model.kept)
        assert real.generated(model) == len(model.kept) + model.registration.pruned
        # Every artifact a profile names is in the shared repository.
        assert all((zoo.repository / p.artifact_key).is_file() for p in model.profiles)
    text = zoo.model("tiny-text").record
    assert [(s.name, s.dtype) for s in text.input_specs] == [
        ("input_ids", "int64"),
        ("attention_mask", "int64"),
    ]


def test_accelerator_profiles_are_derived_marked_and_left_out_of_the_measured(zoo: RealZoo) -> None:
    derived = [p for p in zoo.profiles if p.imported]
    assert {p.pool for p in derived} == {"gpu", "accel"}
    assert all(real.NOT_MEASURED in p.hardware for p in derived)
    assert all(not p.imported for p in zoo.measured())
    assert {p.pool for p in zoo.measured()} <= {"cpu", "lambda-cpu"}


def test_a_cached_registration_is_reused_and_a_changed_model_registered_again(
    zoo: RealZoo, standins: list[StandIn], state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[str] = []

    def register(built: real.Built, repository: Path, key: str, log: object) -> RegisteredModel:
        registered.append(built.name)
        return zoo.model(built.name)

    monkeypatch.setattr(real, "register_model", register)
    again = real.real_zoo(built=standins, state_dir=state_dir, log=lambda line: None)
    assert registered == []  # both from the cache
    assert [m.key for m in again.models] == [m.key for m in zoo.models]
    # Another model file under the same name (a different key) is registered again.
    image = standins[0]
    changed = image_model(image.onnx_path.parent.parent / "changed", seed=5)
    keys = {real.cache_key(image, "v", {}), real.cache_key(changed, "v", {})}
    assert len(keys) == 2
    assert real.cache_key(image, "v", {}) != real.cache_key(image, "w", {})  # the profiling code too


def test_queries_are_encoded_for_the_binary_path(zoo: RealZoo) -> None:
    image = real.held_out_batch(zoo.model("tiny-image"), 1)
    content_type, body = real.encode_body(image)
    assert content_type == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(body), allow_pickle=False), image)
    text = real.held_out_batch(zoo.model("tiny-text"), 2)
    assert text.dtype.names == ("input_ids", "attention_mask") and len(text) == 2
    content_type, body = real.encode_body(text)
    assert content_type == "application/x-npz"
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        assert sorted(archive.namelist()) == ["attention_mask.npy", "input_ids.npy"]
    with np.load(io.BytesIO(body), allow_pickle=False) as arrays:
        assert arrays["input_ids"].dtype == np.int64
        np.testing.assert_array_equal(arrays["input_ids"], text["input_ids"])
    targets = QueryTargets("zoo-text", latency_ms=200.0, min_accuracy=0.5, model_name="tiny-text")
    query = parse_qs(urlsplit(real.query_path(targets, binary=True)).query)
    assert query == {
        "appID": ["zoo-text"],
        "latency": ["200.0"],
        "accuracy": ["0.5"],
        "modelName": ["tiny-text"],
    }
    as_json = json.loads(real.json_body(text, targets))
    assert as_json["inputs"]["attention_mask"] == text["attention_mask"].tolist()
    assert real.query_path(targets, binary=False) == "/v1/online_query"


def test_the_real_zoo_report_states_its_registrations(zoo: RealZoo, tmp_path: Path) -> None:
    path = real.write_report(zoo, tmp_path, "scripts/bench real-zoo --only tiny-image tiny-text")
    text = path.read_text()
    assert text.startswith("## ") and "scripts/bench real-zoo --only tiny-image tiny-text" in text
    assert "`tiny-image`" in text and "`tiny-text`" in text and "derived, not measured" in text
    data = json.loads((tmp_path / "real-zoo.json").read_text())
    assert data["headlines"] and len(data["models"]) == 2


def test_accuracy_levels_span_the_measured_spread() -> None:
    profiles = [SimpleNamespace(accuracy=a) for a in (0.5, 0.61, 0.7, 0.82, 0.9)]
    levels = variant_picks.accuracy_levels(profiles)  # type: ignore[arg-type]
    assert levels[0] == 0.5 and levels[-1] == 0.9 and levels == sorted(set(levels))


def test_every_pick_meets_its_targets_through_the_projects_selection(zoo: RealZoo, tmp_path: Path) -> None:
    rows = {app: variant_picks.rows_for(zoo, app) for app in zoo.apps}
    for warm in (True, False):
        found = variant_picks.picks(zoo, warm)
        for app, per_app in found.items():
            assert {label for label, _ in per_app} == {row.label for row in rows[app]}
            for row in rows[app]:
                for latency in variant_picks.LATENCIES_MS:
                    pick = per_app[(row.label, latency)]
                    assert pick.variant is not None, (
                        f"{row.label} within {latency} ms refused: {pick.refused}"
                    )
                    assert pick.variant.app_id == app and not pick.variant.imported
                    assert pick.variant.latency_ms(1) <= latency  # tiny models: every budget is met
                    if row.min_accuracy is not None:
                        assert pick.variant.accuracy >= row.min_accuracy
                    if row.model_name is not None:
                        assert pick.variant.model_name == row.model_name
                    if not warm:
                        assert pick.variant.load_latency_ms + pick.variant.latency_ms(1) <= latency
    path = variant_picks.write_report(zoo, tmp_path, "scripts/bench variant-picks")
    assert "### App `zoo-images`" in path.read_text() and "### App `zoo-text`" in path.read_text()


def test_a_target_no_variant_meets_is_refused(zoo: RealZoo) -> None:
    best = max(p.accuracy for p in zoo.measured() if p.app_id == "zoo-images")
    unreachable = variant_picks.Row("too accurate", "zoo-images", min(1.0, best + 0.01))
    found = variant_picks.picks(zoo, warm=True, extra_rows=[unreachable])
    pick = found["zoo-images"][("too accurate", variant_picks.LATENCIES_MS[0])]
    assert pick.variant is None and pick.cell().startswith("refused")
    assert not math.isnan(best)
