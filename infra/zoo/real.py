"""The real model zoo: real architectures at their native input size, built and cached locally.

    python -m infra.zoo.real [--only NAME ...] [--list] [--root DIR]

Image models (app ``zoo-images``): timm's MobileNetV3-Small, MobileNetV2, EfficientNet-B0,
ResNet-18/50/101, DenseNet-121 and ViT-Tiny, each taking ``input`` [batch, 3, 224, 224] float32
and returning ``logits`` [batch, 10]. One text model (app ``zoo-text``): a small BERT-style
encoder written here (infra/zoo/text_model.py) taking ``input_ids`` and ``attention_mask``
[batch, 48] int64.

No weights are downloaded (there is no internet here but PyPI), so accuracy is earned honestly on
scikit-learn's digits: an image model keeps its seeded random initialisation, has its BatchNorm
running statistics re-estimated on training images, and gets a linear head fitted by logistic
regression on its frozen pooled features, installed as its own classifier so that the exported
ONNX file is one end-to-end model. The text model is trained, briefly. docs/ZOO.md says more.

Each model is cached in ``.modelless/zoo-real/<name>/``: ``model.onnx`` (weights inside, dynamic
batch dimension), ``valset.npz`` (what registration gets), ``testset.npz`` (held out further) and
``manifest.json``, written last. A model whose manifest exists with the current build key (this
module's FORMAT, the build configuration, the entry and the library versions) is not rebuilt.
Models are built one at a time; progress goes to stderr.

Importing this module is cheap (no torch): torch, timm and onnxruntime are imported only to build.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import numpy as np

from modelless.exceptions import NotFoundError
from modelless.types import TensorSpec

FORMAT = 1
ZOO_ROOT = Path(".modelless/zoo-real")
IMAGE_APP = "zoo-images"
TEXT_APP = "zoo-text"
MODEL_FILE = "model.onnx"
VALSET = "valset.npz"
TESTSET = "testset.npz"
MANIFEST = "manifest.json"
NUM_CLASSES = 10
LIBRARIES = ("torch", "timm", "torchvision", "onnx", "onnxruntime", "scikit-learn", "numpy")

ModelKind = Literal["image", "text"]
Logger = Callable[[str], None]


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo: its registered name, its app and where its architecture comes from."""

    name: str
    app: str
    kind: ModelKind
    architecture: str  # timm's model name, or the class written here
    source: str  # "timm:<name>" or "infra.zoo.text_model:<class>"


def _timm_entry(name: str) -> ZooEntry:
    return ZooEntry(name=name, app=IMAGE_APP, kind="image", architecture=name, source=f"timm:{name}")


ZOO: tuple[ZooEntry, ...] = (
    *(
        _timm_entry(name)
        for name in (
            "mobilenetv3_small_100",
            "mobilenetv2_100",
            "efficientnet_b0",
            "resnet18",
            "resnet50",
            "densenet121",
            "vit_tiny_patch16_224",
            # Up to ResNet-50 the zoo spans ~40x in batch-1 latency (one onnxruntime thread,
            # MobileNetV3-Small 0.9 ms, ResNet-50 34 ms); ResNet-101 (65 ms) takes it past 50x.
            "resnet101",
        )
    ),
    ZooEntry(
        name="digits-text-encoder",
        app=TEXT_APP,
        kind="text",
        architecture="DigitsTextEncoder",
        source="infra.zoo.text_model:DigitsTextEncoder",
    ),
)


@dataclass(frozen=True)
class BuildConfig:
    """How a zoo is built. The defaults build the real zoo; tests pass a tiny configuration to the
    same code path (a smaller image size, fewer examples, fewer epochs)."""

    image_size: int = 224  # the image models' native input size
    train_count: int = 640  # training images: BatchNorm statistics and the head's fit
    val_count: int = 400  # registration's validation set (its .npz stays ~30 MB at 224x224)
    test_count: int | None = None  # None: every remaining digit
    batch_size: int = 32
    seed: int = 0
    text_epochs: int = 12
    text_d_model: int = 128
    text_layers: int = 2
    latency_budget_s: float = 3.0  # spent measuring each model's batch-1 onnxruntime latency


DEFAULT_CONFIG = BuildConfig()


@dataclass(frozen=True)
class BuiltModel:
    """A built zoo model: its files and its manifest."""

    name: str
    app: str
    directory: Path
    onnx_path: Path
    valset_path: Path
    testset_path: Path
    manifest: dict[str, Any]

    @property
    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec(s["name"], list(s["shape"]), s["dtype"]) for s in self.manifest["inputs"]]

    @property
    def preprocessing(self) -> dict[str, Any] | None:
        recipe = self.manifest.get("preprocessing")
        return dict(recipe) if recipe is not None else None


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def entry_named(name: str) -> ZooEntry:
    for entry in ZOO:
        if entry.name == name:
            return entry
    raise NotFoundError(
        f"no zoo model named {name!r}; the zoo holds {[e.name for e in ZOO]}",
        model=name,
        known=[e.name for e in ZOO],
    )


def build_key(entry: ZooEntry, config: BuildConfig) -> dict[str, Any]:
    """What a cached model must have been built from to be reused."""
    return {
        "format": FORMAT,
        "entry": asdict(entry),
        "config": asdict(config),
        "versions": {library: _version(library) for library in LIBRARIES},
    }


def _version(library: str) -> str:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return "absent"


def _built(entry: ZooEntry, directory: Path, manifest: dict[str, Any]) -> BuiltModel:
    return BuiltModel(
        name=entry.name,
        app=entry.app,
        directory=directory,
        onnx_path=directory / MODEL_FILE,
        valset_path=directory / VALSET,
        testset_path=directory / TESTSET,
        manifest=manifest,
    )


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest, if it and every file it vouches for are there (at their recorded sizes)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        if not isinstance(manifest, dict):
            return None
        for file_name, size in manifest["files"].items():
            if (directory / file_name).stat().st_size != size:
                return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return manifest


def read_split(path: Path, rows: int | None = None) -> dict[str, np.ndarray]:
    """A split file's arrays (``valset.npz``/``testset.npz``), or only their first ``rows`` rows:
    those are read without decompressing the rest (an image test set is ~450 MB as float32)."""
    if rows is None:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    arrays: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            with archive.open(member) as stream:
                version = np.lib.format.read_magic(stream)
                if version == (1, 0):
                    shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
                else:
                    shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
                if fortran_order or dtype.hasobject:
                    raise ValueError(f"{path}:{member} is not a C-ordered numeric array")
                count = min(rows, shape[0])
                row_shape = tuple(shape[1:])
                size = count * int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
                data = stream.read(size)
            arrays[member.removesuffix(".npy")] = (
                np.frombuffer(data, dtype=dtype).reshape(count, *row_shape).copy()
            )
    return arrays


def load_built(name: str, root: Path = ZOO_ROOT) -> BuiltModel:
    """A built model, from its cache. Raises ``NotFoundError`` when it is not built (or its files
    are incomplete), saying how to build it."""
    entry = entry_named(name)
    directory = Path(root) / name
    manifest = _read_manifest(directory)
    if manifest is None:
        raise NotFoundError(
            f"zoo model {name!r} is not built in {directory} (or its files are incomplete); build it "
            f"with: .venv/bin/python -m infra.zoo.real --only {name} --root {root}",
            model=name,
            directory=str(directory),
        )
    return _built(entry, directory, manifest)


def build_zoo(
    names: Sequence[str] | None = None,
    root: Path = ZOO_ROOT,
    log: Logger = _stderr,
    config: BuildConfig = DEFAULT_CONFIG,
) -> list[BuiltModel]:
    """Build the requested models (all by default) that are not cached with the current build
    key, one at a time; returns every requested model, in the zoo's order."""
    wanted = set(names) if names is not None else {e.name for e in ZOO}
    for name in sorted(wanted):
        entry_named(name)  # an unknown name fails before anything is built
    entries = [e for e in ZOO if e.name in wanted]
    root = Path(root)
    cached: dict[str, dict[str, Any]] = {}
    for entry in entries:
        manifest = _read_manifest(root / entry.name)
        if manifest is not None and manifest.get("build_key") == build_key(entry, config):
            cached[entry.name] = manifest
    pending = [e for e in entries if e.name not in cached]
    log(f"zoo: {len(entries)} model(s) requested in {root}: {len(cached)} cached, {len(pending)} to build")
    results: list[BuiltModel] = []
    builder = None
    for entry in entries:
        directory = root / entry.name
        if entry.name in cached:
            log(f"[{entry.name}] cached in {directory}")
            results.append(_built(entry, directory, cached[entry.name]))
            continue
        if builder is None:
            from infra.zoo.real_build import ZooBuilder

            builder = ZooBuilder(config, log)
        position = pending.index(entry) + 1
        log(f"[{entry.name}] building ({position}/{len(pending)}) into {directory}")
        manifest = builder.build(entry, directory, build_key(entry, config))
        results.append(_built(entry, directory, manifest))
    if builder is not None:
        builder.close()
    return results


# --- command line -------------------------------------------------------------------------------


def results_table(models: Sequence[BuiltModel]) -> str:
    from modelless.cli import format_table

    rows = [
        {
            "model": m.name,
            "app": m.app,
            "params": f"{m.manifest['params']:,}",
            "torch val acc": f"{m.manifest['val_accuracy']:.4f}",
            "torch test acc": f"{m.manifest['test_accuracy']:.4f}",
            "ort b1 ms (1 thread)": f"{m.manifest['ort_batch1_ms_1thread']:.2f}",
            "build s": f"{m.manifest['build_seconds']:.1f}",
        }
        for m in models
    ]
    return format_table(rows, list(rows[0])) if rows else "(no models)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infra.zoo.real",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="build (or show) these models only")
    parser.add_argument("--list", action="store_true", help="list the zoo and what is built; build nothing")
    parser.add_argument("--root", type=Path, default=ZOO_ROOT, help=f"cache directory (default {ZOO_ROOT})")
    args = parser.parse_args(argv)
    try:
        names = [entry_named(name).name for name in args.only] if args.only else [e.name for e in ZOO]
    except NotFoundError as error:
        parser.error(error.message)
    if args.list:
        for name in names:
            entry = entry_named(name)
            state = "built" if _read_manifest(args.root / name) is not None else "not built"
            print(f"{name:24} {entry.app:11} {entry.source:42} {state}")
        return
    started = time.perf_counter()
    models = build_zoo(names, args.root)
    print(results_table(models))
    seconds = time.perf_counter() - started
    print(f"\n{len(models)} model(s) in {args.root} ({seconds:.0f} s on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
