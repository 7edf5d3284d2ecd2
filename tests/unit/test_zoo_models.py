"""The cost study's heavy model (issue 7, part 1): the demo zoo's input and output, the cost class
of a vision model rather than of a digits model (counted in multiply-adds, not timed), and a
cache that is reused only while it is this recipe's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from infra.zoo import digits as demo_models  # noqa: E402
from infra.zoo import digits_resnet as sim_models  # noqa: E402


def test_the_heavy_model_takes_the_demo_input_and_gives_ten_logits() -> None:
    trunk, head = sim_models._network()
    rows = torch.zeros(3, *demo_models.INPUT_SHAPE)
    features = trunk(rows)
    assert features.shape == (3, sim_models.feature_count())
    assert head(features).shape == (3, demo_models.NUM_CLASSES)


def test_its_trunk_is_seeded_so_every_build_is_the_same_model() -> None:
    first, _ = sim_models._network()
    second, _ = sim_models._network()
    for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_it_costs_an_order_of_magnitude_more_than_the_demo_zoos_largest_model() -> None:
    trunk, head = sim_models._network()
    heavy = sim_models.multiply_adds(torch.nn.Sequential(trunk, head))
    cnn = next(r for r in demo_models.RECIPES if r.name == "digits-cnn").build().eval()
    assert heavy >= 10 * sim_models.multiply_adds(cnn)
    # Its convolutions, counted by hand: the stem, two stages of two residual blocks of two
    # 3x3 convolutions, and the stride-2 convolution between the stages.
    narrow, wide = sim_models.CHANNELS
    side = sim_models.UPSAMPLE
    convolutions = (
        side * side * narrow * 9
        + 2 * sim_models.BLOCKS * side * side * narrow * narrow * 9
        + (side // 2) ** 2 * wide * narrow * 9
        + 2 * sim_models.BLOCKS * (side // 2) ** 2 * wide * wide * 9
    )
    assert heavy == convolutions + sim_models.feature_count() * demo_models.NUM_CLASSES


def test_a_cached_model_is_reused_only_while_it_is_this_recipes(tmp_path: Path) -> None:
    model = tmp_path / "digits-resnet.onnx"
    model.write_bytes(b"onnx")
    manifest = {
        "format": sim_models.FORMAT,
        "recipe": sim_models.RECIPE,
        "file": model.name,
        "onnx_bytes": 4,
    }
    (tmp_path / sim_models.MANIFEST).write_text(json.dumps(manifest))
    assert sim_models.load_manifest(tmp_path) == manifest
    (tmp_path / sim_models.MANIFEST).write_text(json.dumps({**manifest, "recipe": {"channels": [8, 16]}}))
    assert sim_models.load_manifest(tmp_path) is None
    (tmp_path / sim_models.MANIFEST).write_text(json.dumps({**manifest, "onnx_bytes": 5}))
    assert sim_models.load_manifest(tmp_path) is None  # a truncated file is not the model
    assert sim_models.load_manifest(tmp_path / "missing") is None
