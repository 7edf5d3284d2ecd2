"""Building one real-zoo model (infra/zoo/real.py calls this; it imports torch, timm, onnxruntime).

The data, shared by every model of one build: scikit-learn's digits (1797 8x8 images, 10
classes) split, stratified with a fixed seed, into disjoint train / validation / test sets. The
image models see each digit as an 8-bit grey image upsampled bilinearly to their native size,
replicated to RGB and normalised with ImageNet's mean and std (the preprocessing recipe stored in
the manifest); the text model sees the token sequences of infra/zoo/text_model.py.
"""

from __future__ import annotations

import io
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infra.zoo import real_torch as rt
from infra.zoo import text_model
from infra.zoo.real import (
    FORMAT,
    MANIFEST,
    MODEL_FILE,
    NUM_CLASSES,
    TESTSET,
    VALSET,
    BuildConfig,
    Logger,
    ZooEntry,
)
from modelless.exceptions import InvalidModelError

PARITY_BATCH_SIZES = (1, 3)
PARITY_RELATIVE_TOLERANCE = 1e-2  # of the largest logit (at least 1.0): float32 reordering, BN folding
DATASET = "sklearn.datasets.load_digits (1797 8x8 digits, 10 classes), stratified disjoint splits"
IMAGE_METHOD = (
    "Random-initialised (seeded) timm backbone; BatchNorm running statistics re-estimated on the "
    "training images; a linear head fitted by logistic regression on the frozen pooled features "
    "and installed as the model's classifier; no pretrained weights."
)
TEXT_METHOD = (
    "BERT-style encoder written here, trained from scratch for a few epochs on the training "
    "digits read as token sequences (one token per inked pixel)."
)


def split_indices(labels: np.ndarray, config: BuildConfig) -> dict[str, np.ndarray]:
    """Disjoint, stratified train / val / test indices (fixed seed)."""
    from sklearn.model_selection import train_test_split

    everything = np.arange(len(labels))
    train, rest = train_test_split(
        everything, train_size=config.train_count, stratify=labels, random_state=config.seed
    )
    val, test = train_test_split(
        rest, train_size=config.val_count, stratify=labels[rest], random_state=config.seed
    )
    if config.test_count is not None and config.test_count < len(test):
        test, _ = train_test_split(
            test, train_size=config.test_count, stratify=labels[test], random_state=config.seed
        )
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


class ZooBuilder:
    """Builds models one at a time over data loaded once; ``close`` restores torch's threads."""

    def __init__(self, config: BuildConfig, log: Logger) -> None:
        from sklearn.datasets import load_digits

        self.config = config
        self.log = log
        self._threads = torch.get_num_threads()
        torch.set_num_threads(os.cpu_count() or 1)
        digits = load_digits()
        self.pixels = np.asarray(digits.images, dtype=np.float64)  # [N, 8, 8], 0..16
        self.labels = np.asarray(digits.target, dtype=np.int64)
        self.splits = split_indices(self.labels, config)
        self._images: np.ndarray | None = None
        self._tokens: tuple[np.ndarray, np.ndarray] | None = None
        self._split_files: dict[tuple[str, str], bytes] = {}
        self._split_paths: dict[tuple[str, str], Path] = {}
        sizes = ", ".join(f"{len(v)} {k}" for k, v in self.splits.items())
        log(f"data: {DATASET}: {sizes}; torch on {torch.get_num_threads()} threads")

    def close(self) -> None:
        torch.set_num_threads(self._threads)

    # --- data ---------------------------------------------------------------------------------

    def images(self) -> np.ndarray:
        """Every digit as an 8-bit grey image at the configured size [N, S, S] (built once)."""
        if self._images is None:
            self._images = rt.digit_images(self.pixels, self.config.image_size)
        return self._images

    def tokens(self) -> tuple[np.ndarray, np.ndarray]:
        if self._tokens is None:
            self._tokens = text_model.tokenise(self.pixels)
        return self._tokens

    def split(self, kind: str, name: str) -> dict[str, np.ndarray]:
        """A split's model inputs by input name (images as 8-bit, normalised batch by batch)."""
        index = self.splits[name]
        if kind == "image":
            return {"input": self.images()[index]}
        input_ids, attention_mask = self.tokens()
        return {"input_ids": input_ids[index], "attention_mask": attention_mask[index]}

    def split_file(self, kind: str, name: str) -> bytes:
        """The split's .npz (compressed once, shared by the models of one kind)."""
        key = (kind, name)
        if key not in self._split_files:
            inputs = self.split(kind, name)
            labels = self.labels[self.splits[name]]
            if kind == "image":
                self._split_files[key] = _npz(inputs=rt.normalise(inputs["input"]), labels=labels)
            else:
                self._split_files[key] = _npz(**inputs, labels=labels)
        return self._split_files[key]

    def write_split(self, kind: str, name: str, target: Path) -> int:
        """Write the split's .npz to ``target``; returns its size. The models of one kind share
        identical split files within a build: later ones are hard links to the first written
        (an image test set is ~55 MB, eight times over otherwise)."""
        key = (kind, name)
        first = self._split_paths.get(key)
        if first is not None and first.is_file():
            partial = target.with_name(target.name + ".partial")
            partial.unlink(missing_ok=True)
            try:
                os.link(first, partial)
                os.replace(partial, target)
                return target.stat().st_size
            except OSError:
                partial.unlink(missing_ok=True)  # no hard links on this file system: write a copy
        _write_atomic(target, self.split_file(kind, name))
        self._split_paths[key] = target
        return target.stat().st_size

    # --- one model ----------------------------------------------------------------------------

    def build(self, entry: ZooEntry, directory: Path, key: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        directory.mkdir(parents=True, exist_ok=True)
        # A stale manifest must not vouch for files this build is about to replace.
        (directory / MANIFEST).unlink(missing_ok=True)
        phases: dict[str, float] = {}
        if entry.kind == "image":
            model, details = self._image_model(entry, phases)
        else:
            model, details = self._text_model(entry, phases)
        manifest = self._finish(entry, directory, model, details, phases, started, key)
        self.log(
            f"[{entry.name}] done in {manifest['build_seconds']:.1f} s: torch val acc "
            f"{manifest['val_accuracy']:.4f}, test acc {manifest['test_accuracy']:.4f}, onnxruntime "
            f"batch 1 {manifest['ort_batch1_ms_1thread']:.2f} ms (1 thread)"
        )
        return manifest

    def _phase(
        self, entry: ZooEntry, phases: dict[str, float], name: str, since: float, message: str
    ) -> float:
        now = time.perf_counter()
        phases[name] = round(now - since, 2)
        self.log(f"[{entry.name}] {name}: {message} ({now - since:.1f} s)")
        return now

    def _image_model(
        self, entry: ZooEntry, phases: dict[str, float]
    ) -> tuple[torch.nn.Module, dict[str, Any]]:
        config = self.config
        timm = rt.import_timm()
        since = time.perf_counter()
        torch.manual_seed(config.seed)
        model: Any = timm.create_model(entry.architecture, pretrained=False, num_classes=NUM_CLASSES)
        model.eval()
        since = self._phase(entry, phases, "create", since, f"{rt.parameter_count(model):,} parameters")
        train = self.split("image", "train")["input"]
        layers = rt.batchnorm_layers(model)
        if layers:
            count = rt.reestimate_batchnorm(model, train, config.batch_size)
            changed = sum(
                1
                for layer in layers
                if layer.running_mean is not None
                and layer.running_var is not None
                and (
                    bool(layer.running_mean.abs().max() > 0) or bool((layer.running_var - 1).abs().max() > 0)
                )
            )
            batchnorm: dict[str, Any] = {"layers": count, "images": len(train), "changed_layers": changed}
            message = f"{count} BatchNorm layers re-estimated on {len(train)} images ({changed} changed)"
        else:
            batchnorm = {
                "layers": 0,
                "images": 0,
                "changed_layers": 0,
                "note": "no BatchNorm (LayerNorm normalises each token by its own statistics): "
                "nothing to re-estimate",
            }
            message = "no BatchNorm layers (LayerNorm): nothing to re-estimate"
        since = self._phase(entry, phases, "batchnorm", since, message)
        features = rt.pooled_features(model, train, config.batch_size)
        since = self._phase(entry, phases, "features", since, f"{features.shape[1]} pooled features")
        head = rt.fit_head(features, self.labels[self.splits["train"]], config.seed)
        rt.install_head(model, head)
        self._check_head(entry, model, train[:4], features[:4])
        since = self._phase(
            entry,
            phases,
            "head",
            since,
            f"logistic regression (C={head.inverse_l2:g}), train accuracy {head.train_accuracy:.4f}",
        )
        details = {
            "batchnorm": batchnorm,
            "head": {
                "features": int(features.shape[1]),
                "inverse_l2": head.inverse_l2,
                "cv_accuracy": {str(c): round(a, 4) for c, a in head.cv_accuracy.items()},
                "train_accuracy": round(head.train_accuracy, 4),
                "fit": "sklearn LogisticRegression (L2, lbfgs) on standardised features, C chosen by "
                f"3-fold CV on the training features among {list(rt.HEAD_CS)}; the standardisation "
                "folded into the Linear weights",
            },
        }
        return model, details

    def _check_head(self, entry: ZooEntry, model: Any, images: np.ndarray, features: np.ndarray) -> None:
        """The end-to-end model must compute exactly classifier(features): the head was fitted on
        the features the classifier sees."""
        with torch.no_grad():
            end_to_end = model(torch.from_numpy(rt.normalise(images))).numpy()
            classifier = model.get_classifier()
            direct = classifier(torch.from_numpy(features.astype(np.float32))).numpy()
        if not np.allclose(end_to_end, direct, rtol=1e-3, atol=1e-3):
            raise InvalidModelError(
                f"{entry.name}: the model's output is not its classifier applied to the pooled features",
                max_abs_diff=float(np.abs(end_to_end - direct).max()),
            )

    def _text_model(
        self, entry: ZooEntry, phases: dict[str, float]
    ) -> tuple[torch.nn.Module, dict[str, Any]]:
        config = self.config
        since = time.perf_counter()
        torch.manual_seed(config.seed)
        shape = text_model.EncoderShape(
            d_model=config.text_d_model, layers=config.text_layers, feedforward=2 * config.text_d_model
        )
        model = text_model.DigitsTextEncoder(shape)
        since = self._phase(entry, phases, "create", since, f"{rt.parameter_count(model):,} parameters")
        train = self.split("text", "train")

        def progress(message: str) -> None:
            self.log(f"[{entry.name}] train: {message}")

        report = text_model.train(
            model,
            train["input_ids"],
            train["attention_mask"],
            self.labels[self.splits["train"]],
            epochs=config.text_epochs,
            seed=config.seed,
            log=progress,
        )
        since = self._phase(
            entry, phases, "train", since, f"{report.epochs} epochs, loss {report.final_loss:.4f}"
        )
        details = {
            "training": {
                "epochs": report.epochs,
                "seconds": round(report.seconds, 2),
                "final_loss": round(report.final_loss, 5),
                "optimiser": "AdamW, one-cycle learning rate, cross-entropy, batch 32",
            },
            "encoder": asdict(shape),
            "tokens": {
                "vocabulary": text_model.VOCABULARY,
                "sequence_length": text_model.SEQUENCE_LENGTH,
                "pad": text_model.PAD,
                "cls": text_model.CLS,
                "pixel_token": "2 + pixel_position * 4 + (intensity - 1) // 4, one per inked pixel, "
                "in raster order",
            },
        }
        return model, details

    def _finish(
        self,
        entry: ZooEntry,
        directory: Path,
        model: torch.nn.Module,
        details: dict[str, Any],
        phases: dict[str, float],
        started: float,
        key: dict[str, Any],
    ) -> dict[str, Any]:
        config = self.config
        labels = {name: self.labels[index] for name, index in self.splits.items()}
        val = self.split(entry.kind, "val")
        since = time.perf_counter()
        val_accuracy = rt.torch_accuracy(model, val, labels["val"], config.batch_size)
        test_accuracy = rt.torch_accuracy(
            model, self.split(entry.kind, "test"), labels["test"], config.batch_size
        )
        since = self._phase(
            entry, phases, "accuracy", since, f"torch val {val_accuracy:.4f}, test {test_accuracy:.4f}"
        )
        example = {name: rt.batch_inputs(val, 0, 1, name) for name in val}
        onnx_path = directory / MODEL_FILE
        onnx_bytes = rt.export_onnx(model, example, onnx_path)
        session = rt.ort_session(onnx_path)
        parity = rt.check_parity(model, session, val, PARITY_BATCH_SIZES)
        if parity.max_abs_diff > PARITY_RELATIVE_TOLERANCE * max(1.0, parity.max_abs_logit):
            raise InvalidModelError(
                f"{entry.name}: onnxruntime differs from torch by {parity.max_abs_diff:.2e} "
                f"(largest logit {parity.max_abs_logit:.2f})",
                parity=asdict(parity),
            )
        since = self._phase(
            entry,
            phases,
            "export",
            since,
            f"{onnx_bytes / 1e6:.1f} MB ONNX; vs torch at batch {list(PARITY_BATCH_SIZES)}: max |diff| "
            f"{parity.max_abs_diff:.1e}, argmax agreement {parity.argmax_agreement:.2f}",
        )
        latency_ms, runs = rt.batch1_latency_ms(
            session,
            {name: rt.batch_inputs(val, 0, 1, name) for name in val},
            budget_s=config.latency_budget_s,
        )
        since = self._phase(entry, phases, "latency", since, f"onnxruntime batch 1: {latency_ms:.2f} ms")
        files = {MODEL_FILE: onnx_bytes}
        for file_name, split in ((VALSET, "val"), (TESTSET, "test")):
            files[file_name] = self.write_split(entry.kind, split, directory / file_name)
        self._phase(
            entry,
            phases,
            "splits",
            since,
            f"valset {files[VALSET] / 1e6:.1f} MB, testset {files[TESTSET] / 1e6:.1f} MB",
        )
        manifest = {
            "format": FORMAT,
            "build_key": key,
            "name": entry.name,
            "app": entry.app,
            "kind": entry.kind,
            "architecture": entry.architecture,
            "source": entry.source,
            "params": rt.parameter_count(model),
            "num_classes": NUM_CLASSES,
            "inputs": self._input_specs(entry, val),
            "output": {"name": rt.OUTPUT_NAME, "shape": [NUM_CLASSES], "dtype": "float32"},
            "preprocessing": self._preprocessing() if entry.kind == "image" else None,
            "val_accuracy": round(val_accuracy, 4),
            "test_accuracy": round(test_accuracy, 4),
            "accuracy_note": "torch top-1 on this zoo's digits splits; not an ImageNet accuracy",
            "method": IMAGE_METHOD if entry.kind == "image" else TEXT_METHOD,
            "dataset": DATASET,
            "counts": {name: len(index) for name, index in self.splits.items()},
            **details,
            "onnx": {
                "exporter": "torch.onnx.export, TorchScript (dynamo=False)",
                "opset": rt.OPSET,
                "bytes": onnx_bytes,
                "dynamic_axes": "batch (dim 0) on every input and on logits",
            },
            "parity": asdict(parity),
            "ort_batch1_ms_1thread": round(latency_ms, 3),
            "ort_latency_runs": runs,
            "build_seconds": round(time.perf_counter() - started, 1),
            "phase_seconds": phases,
            "build_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "timm": key["versions"]["timm"],
            "versions": key["versions"],
            "seed": config.seed,
            "files": files,
        }
        text = json.dumps(manifest, indent=2) + "\n"
        _write_atomic(directory / MANIFEST, text.encode())
        loaded: dict[str, Any] = json.loads(text)  # as a later run will read it (lists, not tuples)
        return loaded

    def _input_specs(self, entry: ZooEntry, inputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        if entry.kind == "image":
            size = self.config.image_size
            return [{"name": "input", "shape": [3, size, size], "dtype": "float32"}]
        return [
            {"name": name, "shape": list(array.shape[1:]), "dtype": str(array.dtype)}
            for name, array in inputs.items()
        ]

    def _preprocessing(self) -> dict[str, Any]:
        size = self.config.image_size
        return {
            "kind": "image",
            "size": [size, size],
            "resize": None,  # the digits are drawn at the model's size: resize straight to it
            "mean": list(rt.IMAGENET_MEAN),
            "std": list(rt.IMAGENET_STD),
            "scale": rt.PIXEL_SCALE,
            "layout": "NCHW",
            "channels": "RGB",
        }
