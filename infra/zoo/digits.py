"""Train the demo model zoo on scikit-learn's bundled digits and export it to ONNX.

    python -m infra.zoo.digits --out .modelless/demo [--force]

Three classifiers with the same signature (``input`` [batch, 1, 8, 8] float32 -> ``logits``
[batch, 10]) but clearly different cost and accuracy, so that model-less selection has a real
trade-off to make: a linear model (cheapest, least accurate), an MLP, and a CNN that upsamples to
32x32 inside the graph so its convolutions cost milliseconds (slowest, most accurate).

Nothing is downloaded. Training is seeded and runs on two threads; the digits are split 60/20/20
(stratified) into train, validation (``valset.npz``, what registration measures accuracy on) and
test (``testset.npz``, what the demo sends as queries). ``manifest.json`` is written last, so a run
that dies half way leaves no manifest and the next run starts over.

This is the only module that imports torch; serving code never imports it.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

from modelless.cli import format_table

SEED = 7
FORMAT = 1
MANIFEST = "manifest.json"
VALSET = "valset.npz"
TESTSET = "testset.npz"
OPSET = 17
BATCH_SIZE = 64
TRAIN_THREADS = 2
PARITY_ATOL = 1e-4
INPUT_SHAPE = (1, 8, 8)
NUM_CLASSES = 10

Split = tuple[np.ndarray, np.ndarray]


def _tiny() -> nn.Module:
    # Pooled to 4x4 before a linear layer: the cheapest model, and visibly the least accurate.
    return nn.Sequential(nn.AvgPool2d(2), nn.Flatten(), nn.Linear(16, NUM_CLASSES))


def _linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, NUM_CLASSES))


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, 256),
        nn.ReLU(),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, NUM_CLASSES),
    )


def _cnn() -> nn.Module:
    # At 8x8 a CNN would cost no more than the MLP; upsampling inside the graph gives the zoo a
    # model whose latency is clearly the highest while keeping one input signature for all three.
    # BatchNorm makes the dozen epochs the time budget allows converge reliably across seeds, and
    # the exporter folds it into the convolutions, so it costs nothing at inference.
    return nn.Sequential(
        nn.Upsample(size=(32, 32), mode="bilinear", align_corners=False),
        nn.Conv2d(1, 32, 3),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 6 * 6, 128),
        nn.ReLU(),
        nn.Linear(128, NUM_CLASSES),
    )


def _small_cnn() -> nn.Module:
    # Between the MLP and the big CNN: a cheaper upsampling (16x16) and far fewer channels.
    return nn.Sequential(
        nn.Upsample(size=(16, 16), mode="bilinear", align_corners=False),
        nn.Conv2d(1, 16, 3),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 5 * 5, NUM_CLASSES),
    )


@dataclass(frozen=True)
class Recipe:
    name: str
    build: Callable[[], nn.Module]
    epochs: int
    lr: float
    weight_decay: float
    augment: bool
    log_every: int


RECIPES = (
    # Few epochs on purpose: the linear model is the zoo's cheap, visibly less accurate option
    # (trained to convergence it gets within a point of the MLP, which blurs the trade-off).
    Recipe("digits-tiny", _tiny, epochs=6, lr=0.02, weight_decay=0.0, augment=False, log_every=2),
    Recipe("digits-linear", _linear, epochs=6, lr=0.02, weight_decay=0.0, augment=False, log_every=2),
    Recipe("digits-mlp", _mlp, epochs=20, lr=3e-3, weight_decay=1e-4, augment=False, log_every=5),
    Recipe("digits-small-cnn", _small_cnn, epochs=12, lr=3e-3, weight_decay=1e-4, augment=True, log_every=3),
    Recipe("digits-cnn", _cnn, epochs=14, lr=3e-3, weight_decay=1e-4, augment=True, log_every=3),
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_splits(seed: int = SEED) -> dict[str, Split]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    inputs = (data.images / 16.0).astype(np.float32).reshape(-1, *INPUT_SHAPE)
    labels = data.target.astype(np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(
        inputs, labels, test_size=0.4, stratify=labels, random_state=seed
    )
    x_val, x_test, y_val, y_test = train_test_split(
        x_rest, y_rest, test_size=0.5, stratify=y_rest, random_state=seed
    )
    return {"train": (x_train, y_train), "val": (x_val, y_val), "test": (x_test, y_test)}


def _jitter(batch: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by up to one pixel (zero fill).

    load_digits centres every digit, so 1078 training images teach little about position; the
    jitter helps the translation-equivariant CNN generalise. It hurts the MLP, which sees pixels
    by position, so only the CNN's recipe uses it.
    """
    size = batch.shape[-1]
    padded = nn.functional.pad(batch, (1, 1, 1, 1))
    offsets = torch.randint(0, 3, (batch.shape[0], 2), generator=generator)
    shifted = torch.empty_like(batch)
    for dy in range(3):
        for dx in range(3):
            chosen = (offsets[:, 0] == dy) & (offsets[:, 1] == dx)
            shifted[chosen] = padded[chosen, :, dy : dy + size, dx : dx + size]
    return shifted


@torch.no_grad()
def _torch_accuracy(model: nn.Module, split: Split) -> float:
    model.eval()
    predictions = model(torch.from_numpy(split[0])).argmax(dim=1).numpy()
    return float((predictions == split[1]).mean())


def train(recipe: Recipe, train_split: Split, val_split: Split, seed: int) -> tuple[nn.Module, float]:
    """Train one model; returns it and the wall-clock seconds spent (progress evaluations included)."""
    # Seeding per model keeps each model's result independent of which others are trained.
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = recipe.build()
    inputs, labels = torch.from_numpy(train_split[0]), torch.from_numpy(train_split[1])
    steps_per_epoch = math.ceil(len(inputs) / BATCH_SIZE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=recipe.lr, total_steps=recipe.epochs * steps_per_epoch, pct_start=0.15
    )
    loss_fn = nn.CrossEntropyLoss()
    started = time.perf_counter()
    for epoch in range(1, recipe.epochs + 1):
        model.train()
        order = torch.randperm(len(inputs), generator=generator)
        loss_sum = 0.0
        for start in range(0, len(inputs), BATCH_SIZE):
            index = order[start : start + BATCH_SIZE]
            batch = _jitter(inputs[index], generator) if recipe.augment else inputs[index]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(batch), labels[index])
            loss.backward()
            optimizer.step()
            schedule.step()
            loss_sum += float(loss.item()) * len(index)
        if epoch % recipe.log_every == 0 or epoch == recipe.epochs:
            log(
                f"  {recipe.name}: epoch {epoch:>2}/{recipe.epochs}  loss {loss_sum / len(inputs):.4f}  "
                f"val acc {_torch_accuracy(model, val_split):.4f}  ({time.perf_counter() - started:.1f} s)"
            )
    model.eval()
    return model, time.perf_counter() - started


def export_onnx(model: nn.Module) -> bytes:
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        # The TorchScript exporter is chosen on purpose (a small, plain graph that every ORT
        # optimisation and quantisation pass handles); its deprecation notice is not news here.
        warnings.simplefilter("ignore", DeprecationWarning)
        target = Path(scratch) / "model.onnx"
        torch.onnx.export(
            model,
            (torch.zeros(1, *INPUT_SHAPE),),
            target,
            dynamo=False,
            opset_version=OPSET,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        )
        data = target.read_bytes()
    onnx.checker.check_model(onnx.load_from_string(data))
    return data


def ort_session(data: bytes, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


@torch.no_grad()
def check_parity(model: nn.Module, session: ort.InferenceSession, inputs: np.ndarray) -> float:
    """Compare torch and onnxruntime at several batch sizes (which also proves the batch dim is dynamic)."""
    worst = 0.0
    for count in (1, 7, 32):
        batch = inputs[:count]
        expected = model(torch.from_numpy(batch)).numpy()
        (actual,) = session.run(["logits"], {"input": batch})
        if actual.shape != (count, NUM_CLASSES):
            raise RuntimeError(f"onnxruntime returned shape {actual.shape} for a batch of {count}")
        worst = max(worst, float(np.abs(actual - expected).max()))
    if worst > PARITY_ATOL:
        raise RuntimeError(f"onnxruntime differs from torch by {worst:.2e} (> {PARITY_ATOL})")
    return worst


def ort_accuracy(session: ort.InferenceSession, split: Split) -> float:
    (logits,) = session.run(["logits"], {"input": split[0]})
    return float((np.asarray(logits).argmax(axis=1) == split[1]).mean())


def batch1_latency_ms(session: ort.InferenceSession, sample: np.ndarray, runs: int = 300) -> float:
    """Median batch-1 latency: a rough figure for the table, not the registrar's profile."""
    feed = {"input": sample[None]}
    for _ in range(30):
        session.run(["logits"], feed)
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(["logits"], feed)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def _npz(split: Split) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, inputs=split[0].astype(np.float32), labels=split[1].astype(np.int64))
    return buffer.getvalue()


def load_current(out_dir: Path) -> dict[str, Any] | None:
    """The manifest, if it is this version's and every file it lists is present at its recorded size."""
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return None
        models = manifest["models"]
        if [m["name"] for m in models] != [r.name for r in RECIPES]:
            return None
        sized = [(m["file"], m["onnx_bytes"]) for m in models]
        files = [out_dir / f for f, _ in sized] + [
            out_dir / manifest["valset"],
            out_dir / manifest["testset"],
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not all(f.is_file() for f in files):
        return None
    if any((out_dir / f).stat().st_size != size for f, size in sized):
        return None
    return manifest


def build_zoo(out_dir: Path, force: bool = False) -> dict[str, Any]:
    """Train, export and check the demo models into ``out_dir``; returns the manifest.

    Reuses what is there when the manifest and all its files exist, unless ``force``.
    """
    out_dir = Path(out_dir)
    if not force:
        current = load_current(out_dir)
        if current is not None:
            log(f"demo zoo in {out_dir} is up to date (use --force to retrain)")
            return current
    out_dir.mkdir(parents=True, exist_ok=True)
    # A stale manifest must not vouch for files this run is about to replace.
    (out_dir / MANIFEST).unlink(missing_ok=True)
    # The demo calls this inside the serving process: leave torch's thread count as it was.
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        manifest = _train_all(out_dir)
    finally:
        torch.set_num_threads(threads)
    _write_atomic(out_dir / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    return manifest


def _train_all(out_dir: Path) -> dict[str, Any]:
    splits = load_splits()
    log(
        f"digits: {len(splits['train'][0])} train, {len(splits['val'][0])} validation, "
        f"{len(splits['test'][0])} test; training on {TRAIN_THREADS} threads"
    )
    _write_atomic(out_dir / VALSET, _npz(splits["val"]))
    _write_atomic(out_dir / TESTSET, _npz(splits["test"]))
    entries: list[dict[str, Any]] = []
    for index, recipe in enumerate(RECIPES):
        model, seconds = train(recipe, splits["train"], splits["val"], SEED + index)
        data = export_onnx(model)
        session = ort_session(data)
        worst = check_parity(model, session, splits["val"][0])
        _write_atomic(out_dir / f"{recipe.name}.onnx", data)
        entry = {
            "name": recipe.name,
            "file": f"{recipe.name}.onnx",
            "params": sum(p.numel() for p in model.parameters()),
            "onnx_bytes": len(data),
            "val_accuracy": round(ort_accuracy(session, splits["val"]), 4),
            "test_accuracy": round(ort_accuracy(session, splits["test"]), 4),
            "train_seconds": round(seconds, 2),
            "epochs": recipe.epochs,
            "batch1_ms_1thread": round(batch1_latency_ms(session, splits["val"][0][0]), 4),
            "max_abs_diff_vs_torch": float(f"{worst:.2e}"),
        }
        log(
            f"  {recipe.name}: exported {len(data)} bytes, onnxruntime val acc {entry['val_accuracy']:.4f}, "
            f"max |ort - torch| {worst:.1e}"
        )
        entries.append(entry)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "dataset": "sklearn.datasets.load_digits, pixels / 16, stratified 60/20/20 split",
        "seed": SEED,
        "input_shape": ["batch", *INPUT_SHAPE],
        "num_classes": NUM_CLASSES,
        "opset": OPSET,
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
        "valset": VALSET,
        "testset": TESTSET,
        "val_count": len(splits["val"][0]),
        "test_count": len(splits["test"][0]),
        "train_seconds_total": round(sum(e["train_seconds"] for e in entries), 2),
        "models": entries,
    }
    accuracies = [e["val_accuracy"] for e in entries]
    if accuracies != sorted(set(accuracies)):
        # Not fatal, but the demo's story (pay latency for accuracy) needs this order.
        log(f"warning: validation accuracy does not rise with model cost: {accuracies}")
    return manifest


def manifest_table(manifest: dict[str, Any]) -> str:
    rows = [
        {
            "model": m["name"],
            "params": f"{m['params']:,}",
            "onnx KB": f"{m['onnx_bytes'] / 1024:.1f}",
            "val acc": f"{m['val_accuracy']:.4f}",
            "test acc": f"{m['test_accuracy']:.4f}",
            "train s": f"{m['train_seconds']:.1f}",
            "ort b1 ms (1 thr)": f"{m['batch1_ms_1thread']:.3f}",
        }
        for m in manifest["models"]
    ]
    return format_table(rows, list(rows[0]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".modelless/demo"), help="output directory")
    parser.add_argument("--force", action="store_true", help="retrain even if the zoo is up to date")
    args = parser.parse_args(argv)
    manifest = build_zoo(args.out, force=args.force)
    print(manifest_table(manifest))
    print(
        f"\ntotal training time {manifest['train_seconds_total']:.1f} s; "
        f"validation set {manifest['val_count']}, test set {manifest['test_count']} images; in {args.out}"
    )


if __name__ == "__main__":
    main()
