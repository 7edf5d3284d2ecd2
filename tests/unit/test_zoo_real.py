"""The real zoo (infra/zoo/real.py), built on a tiny configuration through the same code path as
the full zoo: MobileNetV3-Small and ResNet-18 at 48x48 on a few hundred digits, and the text
encoder trained for a few epochs. Checks the method (BatchNorm re-estimated, head fitted, accuracy
above chance), the export (one file, agrees with torch, dynamic batch), the manifest and the cache."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("timm") is None:  # not importorskip: timm is imported via rt.import_timm
    pytest.skip("timm is not installed (the train extra)", allow_module_level=True)

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from infra.zoo import real, text_model  # noqa: E402
from infra.zoo import real_torch as rt  # noqa: E402
from modelless.exceptions import NotFoundError  # noqa: E402

TINY = real.BuildConfig(
    image_size=48,
    train_count=200,
    val_count=100,
    test_count=100,
    text_epochs=4,
    latency_budget_s=0.05,
)
NAMES = ["mobilenetv3_small_100", "resnet18", "digits-text-encoder"]


@pytest.fixture(scope="module")
def zoo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo-real")


@pytest.fixture(scope="module")
def built(zoo_root: Path) -> dict[str, real.BuiltModel]:
    messages: list[str] = []
    models = real.build_zoo(NAMES, zoo_root, log=messages.append, config=TINY)
    assert [m.name for m in models] == NAMES
    assert any("[resnet18] batchnorm" in m for m in messages)  # progress per model and phase
    return {m.name: m for m in models}


def session(model: real.BuiltModel) -> ort.InferenceSession:
    return ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])


def feeds(model: real.BuiltModel, rows: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    with np.load(model.valset_path, allow_pickle=False) as valset:
        labels = valset["labels"]
        arrays = {
            spec.name: valset["inputs" if len(model.input_specs) == 1 else spec.name][:rows]
            for spec in model.input_specs
        }
    return arrays, labels[:rows]


def test_batchnorm_reestimation_replaces_the_initial_running_statistics() -> None:
    timm = rt.import_timm()
    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    layers = rt.batchnorm_layers(model)
    assert layers and all(
        torch.equal(layer.running_var, torch.ones_like(layer.running_var)) for layer in layers
    )
    images = rt.digit_images(np.random.default_rng(0).integers(0, 17, size=(16, 8, 8)), 32)
    assert rt.reestimate_batchnorm(model, images, batch_size=8) == len(layers)
    assert not model.training
    for layer in layers:
        assert layer.momentum == 0.1  # restored after the cumulative average
        assert not torch.equal(layer.running_mean, torch.zeros_like(layer.running_mean))
        assert not torch.equal(layer.running_var, torch.ones_like(layer.running_var))


def test_the_image_build_reestimated_batchnorm_and_fitted_a_head_that_beats_chance(
    built: dict[str, real.BuiltModel],
) -> None:
    manifest = built["resnet18"].manifest
    batchnorm = manifest["batchnorm"]
    assert batchnorm["layers"] == 20 and batchnorm["changed_layers"] == 20
    assert batchnorm["images"] == TINY.train_count
    assert manifest["head"]["features"] == 512
    # Ten classes: chance is 0.1; random features with a fitted head do far better.
    assert manifest["val_accuracy"] > 0.4 and manifest["test_accuracy"] > 0.4
    assert built["digits-text-encoder"].manifest["test_accuracy"] > 0.3


@pytest.mark.parametrize("name", NAMES)
def test_onnx_is_one_file_that_agrees_with_torch_at_any_batch_size(
    built: dict[str, real.BuiltModel], name: str
) -> None:
    model = built[name]
    assert sorted(p.name for p in model.directory.iterdir()) == [
        "manifest.json",
        "model.onnx",
        "testset.npz",
        "valset.npz",
    ]
    graph = onnx.load(str(model.onnx_path))
    assert not any(onnx.external_data_helper.uses_external_data(t) for t in graph.graph.initializer)
    assert graph.opset_import[0].version >= 17
    parity = model.manifest["parity"]
    assert parity["batch_sizes"] == [1, 3] and parity["argmax_agreement"] == 1.0
    assert parity["max_abs_diff"] < 1e-3 * max(1.0, parity["max_abs_logit"])
    runner = session(model)
    for spec in [*runner.get_inputs(), *runner.get_outputs()]:
        assert isinstance(spec.shape[0], str)  # a symbolic (dynamic) batch dimension
    for rows in (1, 3):
        arrays, _ = feeds(model, rows)
        (logits,) = runner.run(["logits"], arrays)
        assert logits.shape == (rows, 10)
    # onnxruntime's accuracy on the whole validation set is the torch accuracy the manifest holds.
    arrays, labels = feeds(model, TINY.val_count)
    (logits,) = runner.run(["logits"], arrays)
    assert abs(float((logits.argmax(axis=1) == labels).mean()) - model.manifest["val_accuracy"]) <= 0.011


def test_the_manifest_describes_the_model(built: dict[str, real.BuiltModel]) -> None:
    image, text = built["resnet18"], built["digits-text-encoder"]
    for model in (image, text):
        manifest = json.loads((model.directory / "manifest.json").read_text())
        assert manifest == model.manifest
        for key in (
            "name",
            "app",
            "architecture",
            "source",
            "params",
            "inputs",
            "val_accuracy",
            "test_accuracy",
            "build_seconds",
            "method",
            "torch",
            "timm",
            "seed",
        ):
            assert key in manifest, key
        assert manifest["counts"] == {"train": 200, "val": 100, "test": 100}
    assert (image.app, image.manifest["source"]) == ("zoo-images", "timm:resnet18")
    assert image.manifest["params"] == 11_181_642
    assert [(s.name, s.shape, s.dtype) for s in image.input_specs] == [("input", [3, 48, 48], "float32")]
    assert image.preprocessing == {
        "kind": "image",
        "size": [48, 48],
        "resize": None,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "scale": 255,
        "layout": "NCHW",
        "channels": "RGB",
    }
    assert text.app == "zoo-text" and text.preprocessing is None
    with np.load(image.valset_path) as valset:
        assert valset["inputs"].shape == (100, 3, 48, 48) and valset["inputs"].dtype == np.float32
        assert valset["labels"].dtype == np.int64
    with np.load(text.testset_path) as testset:
        assert sorted(testset.files) == ["attention_mask", "input_ids", "labels"]


@pytest.mark.parametrize("name", NAMES)
def test_the_first_rows_of_a_split_are_read_without_the_rest(
    built: dict[str, real.BuiltModel], name: str
) -> None:
    model = built[name]
    first = real.read_split(model.testset_path, rows=3)
    whole = real.read_split(model.testset_path)
    assert sorted(first) == sorted(whole)
    for key, array in whole.items():
        assert first[key].dtype == array.dtype
        np.testing.assert_array_equal(first[key], array[:3])


def test_the_image_models_of_one_build_share_their_split_files(built: dict[str, real.BuiltModel]) -> None:
    first, second = built["mobilenetv3_small_100"], built["resnet18"]
    for path in ("valset_path", "testset_path"):
        a, b = getattr(first, path).stat(), getattr(second, path).stat()
        assert (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)  # one file, two names (a hard link)


def test_the_text_model_takes_int64_input_ids_and_attention_mask(built: dict[str, real.BuiltModel]) -> None:
    model = built["digits-text-encoder"]
    length = text_model.SEQUENCE_LENGTH
    assert [(s.name, s.shape, s.dtype) for s in model.input_specs] == [
        ("input_ids", [length], "int64"),
        ("attention_mask", [length], "int64"),
    ]
    runner = session(model)
    assert [(i.name, i.type) for i in runner.get_inputs()] == [
        ("input_ids", "tensor(int64)"),
        ("attention_mask", "tensor(int64)"),
    ]


def test_tokens_are_a_cls_then_one_per_inked_pixel_then_padding() -> None:
    images = np.zeros((2, 8, 8))
    images[0, 0, 0], images[0, 7, 7] = 16, 1
    images[1, 3, 4] = 9
    input_ids, attention_mask = text_model.tokenise(images)
    assert input_ids.dtype == attention_mask.dtype == np.int64
    assert input_ids[0, :3].tolist() == [text_model.CLS, 2 + 0 * 4 + 3, 2 + 63 * 4 + 0]
    assert input_ids[1, :2].tolist() == [text_model.CLS, 2 + 28 * 4 + 2]
    assert attention_mask.sum(axis=1).tolist() == [3, 2]
    assert (input_ids[attention_mask == 0] == text_model.PAD).all()


def test_a_second_build_reuses_the_cache(built: dict[str, real.BuiltModel], zoo_root: Path) -> None:
    before = {p: p.stat().st_mtime_ns for name in NAMES for p in (zoo_root / name).iterdir()}
    messages: list[str] = []
    again = real.build_zoo(NAMES, zoo_root, log=messages.append, config=TINY)
    assert [m.manifest for m in again] == [built[name].manifest for name in NAMES]
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert not any("building" in m for m in messages)
    assert real.load_built("resnet18", zoo_root).manifest == built["resnet18"].manifest


def test_loading_a_model_that_is_not_built_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match=r"python -m infra\.zoo\.real --only resnet50"):
        real.load_built("resnet50", tmp_path)
    with pytest.raises(NotFoundError, match="no zoo model named"):
        real.build_zoo(["resnet5000"], tmp_path)


def test_the_zoo_lists_the_required_models_in_their_apps() -> None:
    names = {e.name: e.app for e in real.ZOO}
    for name in (
        "mobilenetv3_small_100",
        "mobilenetv2_100",
        "efficientnet_b0",
        "resnet18",
        "resnet50",
        "densenet121",
        "vit_tiny_patch16_224",
    ):
        assert names[name] == "zoo-images"
    assert [n for n, app in names.items() if app == "zoo-text"] == ["digits-text-encoder"]
