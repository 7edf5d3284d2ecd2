"""The torch side of the real zoo (infra/zoo/real.py): image data at native size, BatchNorm
re-estimation, the fitted linear head, ONNX export and its checks against torch.

Imported only while building: serving code and the zoo's API (``load_built``) never import torch.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import types
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PIXEL_SCALE = 255
OPSET = 17
OUTPUT_NAME = "logits"
# torch.jit does not list TracerWarning in its exports (mypy --strict); it is there at runtime.
TRACER_WARNING: type[Warning] = getattr(torch.jit, "TracerWarning", UserWarning)
HEAD_CS = (0.01, 0.1, 1.0)  # LogisticRegression's inverse L2 strengths, chosen by 3-fold CV on train
HEAD_ITERATIONS = 3000


def import_timm() -> types.ModuleType:
    """timm, imported so that it works with the CPU torch wheel.

    torchvision's PyPI wheel is built against CUDA torch; on import it registers fake (meta)
    kernels for its C-extension operators (``torchvision::nms`` ...), which the CPU torch build
    does not have, and the import dies with "operator torchvision::nms does not exist". timm only
    needs torchvision's Python transforms, never those operators, so the registration module is
    replaced by an empty one before anything imports torchvision.
    """
    if "torchvision" not in sys.modules:
        sys.modules.setdefault(
            "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
        )
    import timm

    return timm


# --- data ---------------------------------------------------------------------------------------


def digit_images(pixels: np.ndarray, size: int) -> np.ndarray:
    """8-bit grey images [N, size, size] (uint8) from digits [N, 8, 8] (intensities 0..16):
    upsampled bilinearly, as a camera image of the digit would be stored."""
    source = torch.from_numpy(np.asarray(pixels, dtype=np.float32) / 16.0).unsqueeze(1)
    upsampled = nn.functional.interpolate(source, size=(size, size), mode="bilinear", align_corners=False)
    return (upsampled * PIXEL_SCALE).round().clamp(0, PIXEL_SCALE).to(torch.uint8).squeeze(1).numpy()


def normalise(images: np.ndarray) -> np.ndarray:
    """Model inputs [N, 3, H, W] float32 from 8-bit grey images [N, H, W]: the preprocessing
    recipe's steps (divide by 255, replicate to RGB, subtract the mean, divide by the std)."""
    scaled = torch.from_numpy(np.asarray(images)).to(torch.float32).div(PIXEL_SCALE).unsqueeze(1)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return ((scaled.expand(-1, 3, -1, -1) - mean) / std).contiguous().numpy()


def batches(images: np.ndarray, batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, len(images), batch_size):
        yield torch.from_numpy(normalise(images[start : start + batch_size]))


# --- random backbone, re-estimated BatchNorm, fitted head -----------------------------------


def batchnorm_layers(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    # timm's BatchNormAct2d (EfficientNet, MobileNet) subclasses BatchNorm2d.
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def reestimate_batchnorm(model: nn.Module, images: np.ndarray, batch_size: int) -> int:
    """Replace every BatchNorm layer's running mean and variance by their average over
    ``images`` (each layer in train mode, the rest in eval mode, no gradients); returns the
    number of layers re-estimated. A randomly initialised network's running statistics (0 and 1)
    describe nothing: in eval mode its activations would drift in scale layer after layer."""
    layers = batchnorm_layers(model)
    model.eval()
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative (equal-weight) average over the batches
        layer.train()
    with torch.no_grad():
        for batch in batches(images, batch_size):
            model(batch)
    for layer, momentum in zip(layers, momenta, strict=True):
        layer.momentum = momentum
    model.eval()
    return len(layers)


def pooled_features(model: Any, images: np.ndarray, batch_size: int) -> np.ndarray:
    """The timm model's pre-logits features (what its classifier sees), in eval mode."""
    model.eval()
    parts = []
    with torch.no_grad():
        for batch in batches(images, batch_size):
            parts.append(model.forward_head(model.forward_features(batch), pre_logits=True).numpy())
    return np.concatenate(parts).astype(np.float64)


@dataclass(frozen=True)
class FittedHead:
    weight: np.ndarray  # [classes, features], the standardisation folded in
    bias: np.ndarray  # [classes]
    inverse_l2: float  # the C chosen
    cv_accuracy: dict[float, float]  # each C's mean 3-fold accuracy on the training features
    train_accuracy: float


def fit_head(features: np.ndarray, labels: np.ndarray, seed: int) -> FittedHead:
    """A multinomial logistic regression on standardised features, its L2 strength chosen by
    3-fold cross-validation on the same (training) features, folded back into the raw features'
    space: softmax(W (f - mu) / s + b) == softmax((W / s) f + b - W (mu / s))."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    scaler = StandardScaler().fit(features)
    standardised = scaler.transform(features)
    folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=seed)
    # One BLAS/OpenMP thread: these fits are small (hundreds of rows), and on a busy two-core box
    # several spinning threads made each fit ~100x slower (minutes instead of a second).
    with threadpool_limits(limits=1):
        scores = {
            inverse_l2: float(
                cross_val_score(
                    LogisticRegression(C=inverse_l2, max_iter=HEAD_ITERATIONS), standardised, labels, cv=folds
                ).mean()
            )
            for inverse_l2 in HEAD_CS
        }
        # The best cross-validated accuracy; on a tie, the stronger regularisation.
        chosen = max(HEAD_CS, key=lambda inverse_l2: (scores[inverse_l2], -inverse_l2))
        classifier = LogisticRegression(C=chosen, max_iter=HEAD_ITERATIONS).fit(standardised, labels)
    scale = np.asarray(scaler.scale_, dtype=np.float64)
    mean = np.asarray(scaler.mean_, dtype=np.float64)
    coefficients = np.asarray(classifier.coef_, dtype=np.float64)
    weight = coefficients / scale
    bias = np.asarray(classifier.intercept_, dtype=np.float64) - (coefficients * (mean / scale)).sum(axis=1)
    return FittedHead(
        weight=weight,
        bias=bias,
        inverse_l2=chosen,
        cv_accuracy=scores,
        train_accuracy=float(classifier.score(standardised, labels)),
    )


def install_head(model: Any, head: FittedHead) -> None:
    """Make the fitted head the model's own classifier, so that the export is end to end."""
    classifier = model.get_classifier()
    if not isinstance(classifier, nn.Linear) or tuple(classifier.weight.shape) != head.weight.shape:
        raise TypeError(f"expected a Linear classifier of shape {head.weight.shape}; got {classifier}")
    with torch.no_grad():
        classifier.weight.copy_(torch.from_numpy(head.weight))
        classifier.bias.copy_(torch.from_numpy(head.bias))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def torch_accuracy(
    model: nn.Module, inputs: Mapping[str, np.ndarray], labels: np.ndarray, batch_size: int
) -> float:
    """Top-1 accuracy of the torch model (eval mode) on inputs given by input name."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            feeds = [torch.from_numpy(batch_inputs(inputs, start, batch_size, name)) for name in inputs]
            predictions = model(*feeds).argmax(dim=1).numpy()
            correct += int((predictions == labels[start : start + batch_size]).sum())
    return correct / len(labels)


def batch_inputs(inputs: Mapping[str, np.ndarray], start: int, count: int, name: str) -> np.ndarray:
    array = inputs[name][start : start + count]
    # Image splits are kept as 8-bit images and normalised batch by batch (a float copy of a whole
    # split at 224x224 is hundreds of MB).
    return normalise(array) if array.dtype == np.uint8 else array


# --- export and checks --------------------------------------------------------------------------


def export_onnx(model: nn.Module, example: Mapping[str, np.ndarray], target: Path) -> int:
    """Export ``model`` (eval mode) to one self-contained ONNX file with a dynamic batch dimension
    on every input and on ``logits``; returns its size in bytes.

    The TorchScript exporter (``dynamo=False``) is chosen on purpose: it writes the weights inside
    the file (no ``.onnx.data`` beside it below 2 GB), exports these models in about a second, and
    gives the plain graph that the variant generators (quantiser, ORT optimisation levels) handle,
    as the demo zoo's does. It runs with autograd on (not under ``torch.no_grad``): with autograd
    off, ``nn.TransformerEncoder`` in eval mode takes its fused inference fast path, which does
    not export faithfully.
    """
    model.eval()
    names = list(example)
    args = tuple(torch.from_numpy(np.ascontiguousarray(example[name][:1])) for name in names)
    dynamic_axes = {name: {0: "batch"} for name in [*names, OUTPUT_NAME]}
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch, warnings.catch_warnings():
        # The TorchScript exporter's deprecation notice is not news here (see above).
        warnings.simplefilter("ignore", DeprecationWarning)
        # The tracer's notes on Python-level shape checks (constant at a fixed input shape).
        warnings.simplefilter("ignore", TRACER_WARNING)
        written = Path(scratch) / "model.onnx"
        with torch.inference_mode(False), torch.enable_grad():
            torch.onnx.export(
                model,
                args,
                str(written),
                dynamo=False,
                opset_version=OPSET,
                input_names=names,
                output_names=[OUTPUT_NAME],
                dynamic_axes=dynamic_axes,
            )
        loaded = onnx.load(str(written))  # external data, had any been written, is read back in
        onnx.checker.check_model(loaded, full_check=True)
        # One file, weights inside: save_model with external data off rewrites any that exist.
        onnx.save_model(loaded, str(target), save_as_external_data=False)
    leftovers = [p.name for p in target.parent.iterdir() if p.name.endswith(".data")]
    if leftovers:
        raise RuntimeError(f"the export left external data files beside {target.name}: {leftovers}")
    return target.stat().st_size


def ort_session(path: Path, threads: int = 1) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class Parity:
    batch_sizes: tuple[int, ...]
    max_abs_diff: float
    max_abs_logit: float
    argmax_agreement: float
    output_shapes: tuple[tuple[int, ...], ...]


def check_parity(
    model: nn.Module, session: ort.InferenceSession, inputs: Mapping[str, np.ndarray], sizes: tuple[int, ...]
) -> Parity:
    """torch (eval) against onnxruntime at each batch size in ``sizes`` (which also proves the
    batch dimension dynamic): the largest absolute difference and the argmax agreement."""
    worst = 0.0
    largest = 0.0
    agree = 0
    total = 0
    shapes = []
    model.eval()
    for size in sizes:
        feeds = {name: batch_inputs(inputs, 0, size, name) for name in inputs}
        with torch.no_grad():
            expected = model(*[torch.from_numpy(feeds[name]) for name in inputs]).numpy()
        (actual,) = session.run([OUTPUT_NAME], feeds)
        actual = np.asarray(actual)
        shapes.append(tuple(int(d) for d in actual.shape))
        if actual.shape != expected.shape:
            raise RuntimeError(
                f"onnxruntime returned {actual.shape} for a batch of {size}; torch {expected.shape}"
            )
        worst = max(worst, float(np.abs(actual - expected).max()))
        largest = max(largest, float(np.abs(expected).max()))
        agree += int((actual.argmax(axis=1) == expected.argmax(axis=1)).sum())
        total += size
    return Parity(tuple(sizes), worst, largest, agree / total, tuple(shapes))


def batch1_latency_ms(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], budget_s: float = 3.0, max_runs: int = 200
) -> tuple[float, int]:
    """Median batch-1 latency of ``session`` over as many runs as ``budget_s`` allows (at least 5,
    after 3 warm-up runs), and the run count: a figure for the zoo's table, not a profile."""
    one = {name: np.ascontiguousarray(array[:1]) for name, array in feeds.items()}
    for _ in range(3):
        session.run([OUTPUT_NAME], one)
    timings: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(timings) < max_runs and (len(timings) < 5 or time.perf_counter() < deadline):
        started = time.perf_counter()
        session.run([OUTPUT_NAME], one)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1000, len(timings)


Logger = Callable[[str], None]
