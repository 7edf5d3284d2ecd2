"""The cost study's heavy model: a ResNet-style CNN whose CPU inference costs what a vision model
costs relative to INFaaS's loads (its ResNet50 CPU variant served ~10 QPS per worker).

    python -m infra.zoo.digits_resnet --out .modelless/sim/models [--force]

``digits-resnet`` takes the demo zoo's input (``input`` [batch, 1, 8, 8] float32 -> ``logits``
[batch, 10]), so it registers beside the demo models under one app, and upsamples to 32x32 inside
the graph, then runs a stem and two stages of two residual blocks (``CHANNELS`` wide, the second
stage at stride 2), an average pool to 4x4 and a linear head. Its batch-1 latency on one CPU
thread is several milliseconds, and it gains nothing from batching on a CPU (each row costs the
same), as a ResNet50 on a CPU does.

How it is trained, in the time a benchmark run can spend: the convolutional trunk keeps its
seeded random initialisation (a random-feature model: no gradient ever reaches it); only the
linear head is trained, by L-BFGS on the trunk's standardised features of the demo zoo's training
split (the standardisation is folded into the head before export). Its accuracy is measured, as
every model's is, by the registration on the validation split; this module also records it on
the validation and test splits. Nothing is downloaded.

Built in a child process (``build_heavy_model``) so that the benchmark's own process never
imports torch; the result is cached: a directory with the ONNX file and ``manifest.json``
(written last) is reused while its manifest matches this module's ``FORMAT`` and recipe.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NAME = "digits-resnet"
FORMAT = 2
MANIFEST = "manifest.json"
SEED = 11
UPSAMPLE = 32  # the trunk's input resolution (the digits are 8x8)
CHANNELS = (64, 128)  # the two stages' widths
BLOCKS = 2  # residual blocks per stage
POOLED = 4  # the head sees a POOLED x POOLED map of each channel
RESIDUAL_SCALE = 0.5  # a random residual branch at half weight keeps the activations' scale
HEAD_L2 = 1e-3
HEAD_ITERATIONS = 200
BUILD_THREADS = 2
RECIPE = {
    "upsample": UPSAMPLE,
    "channels": list(CHANNELS),
    "blocks": BLOCKS,
    "pooled": POOLED,
    "residual_scale": RESIDUAL_SCALE,
    "head_l2": HEAD_L2,
    "head_iterations": HEAD_ITERATIONS,
    "seed": SEED,
}


def load_manifest(out_dir: Path) -> dict[str, Any] | None:
    """The manifest, if it is this recipe's and its ONNX file is there at its recorded size."""
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text())
        if manifest.get("format") != FORMAT or manifest.get("recipe") != RECIPE:
            return None
        model = out_dir / manifest["file"]
        if not model.is_file() or model.stat().st_size != manifest["onnx_bytes"]:
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return dict(manifest)


def build_heavy_model(out_dir: Path, log: Any = print) -> dict[str, Any]:
    """The heavy model's manifest, built (in a child process) unless the cache is current."""
    current = load_manifest(out_dir)
    if current is not None:
        return current
    log(f"building {NAME} (random-feature ResNet trunk, trained linear head) into {out_dir}...")
    subprocess.run(
        [sys.executable, "-m", "infra.zoo.digits_resnet", "--out", str(out_dir)],
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    built = load_manifest(out_dir)
    if built is None:
        raise RuntimeError(f"building {NAME} into {out_dir} left no current manifest")
    return built


# --- the build (the child process: the only place here that imports torch) ----------------------


def _network() -> tuple[Any, Any]:
    """(trunk, head) as torch modules, the trunk freshly initialised from ``SEED``."""
    import torch
    from torch import nn

    from infra.zoo.digits import NUM_CLASSES

    class Residual(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.first = nn.Conv2d(channels, channels, 3, padding=1)
            self.second = nn.Conv2d(channels, channels, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            branch = self.second(torch.relu(self.first(x)))
            return torch.relu(x + RESIDUAL_SCALE * branch)

    torch.manual_seed(SEED)
    narrow, wide = CHANNELS
    trunk = nn.Sequential(
        nn.Upsample(size=(UPSAMPLE, UPSAMPLE), mode="bilinear", align_corners=False),
        nn.Conv2d(1, narrow, 3, padding=1),
        nn.ReLU(),
        *[Residual(narrow) for _ in range(BLOCKS)],
        nn.Conv2d(narrow, wide, 3, stride=2, padding=1),
        nn.ReLU(),
        *[Residual(wide) for _ in range(BLOCKS)],
        # A fixed pool (not an adaptive one) exports to ONNX with a dynamic batch dimension.
        nn.AvgPool2d(UPSAMPLE // 2 // POOLED),
        nn.Flatten(),
    )
    head = nn.Linear(wide * POOLED * POOLED, NUM_CLASSES)
    return trunk.eval(), head


def feature_count() -> int:
    return CHANNELS[1] * POOLED * POOLED


def multiply_adds(model: Any, input_shape: tuple[int, ...] = (1, 8, 8)) -> int:
    """Multiply-adds of one row through ``model``'s convolutions and linear layers (what its CPU
    time scales with; counted on a forward pass of one zero row)."""
    import torch
    from torch import nn

    total = 0

    def count(module: nn.Module, _: Any, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            total += output.numel() * per_output
        elif isinstance(module, nn.Linear):
            total += output.numel() * module.in_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def _fit_head(trunk: Any, head: Any, train_inputs: Any, train_labels: Any) -> Any:
    """Train ``head`` on the trunk's standardised features; returns the model with the
    standardisation folded into the head."""
    import torch
    from torch import nn

    with torch.no_grad():
        features = trunk(torch.from_numpy(train_inputs))
    mean = features.mean(0)
    scale = features.std(0) + 1e-6
    standardised = (features - mean) / scale
    labels = torch.from_numpy(train_labels)
    optimiser = torch.optim.LBFGS(head.parameters(), max_iter=HEAD_ITERATIONS, line_search_fn="strong_wolfe")

    def closure() -> float:
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(head(standardised), labels) + HEAD_L2 * head.weight.pow(2).sum()
        loss.backward()
        return float(loss.detach())

    optimiser.step(closure)  # type: ignore[no-untyped-call]
    folded = nn.Linear(head.in_features, head.out_features)
    with torch.no_grad():
        folded.weight.copy_(head.weight / scale)
        folded.bias.copy_(head.bias - (head.weight * mean / scale).sum(1))
    return nn.Sequential(trunk, folded).eval()


def _build(out_dir: Path) -> dict[str, Any]:
    import torch

    from infra.zoo.digits import (
        batch1_latency_ms,
        check_parity,
        export_onnx,
        load_splits,
        ort_accuracy,
        ort_session,
    )

    torch.set_num_threads(BUILD_THREADS)
    started = time.perf_counter()
    splits = load_splits()
    trunk, head = _network()
    model = _fit_head(trunk, head, *splits["train"])
    data = export_onnx(model)
    session = ort_session(data)
    worst = check_parity(model, session, splits["val"][0])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).unlink(missing_ok=True)
    target = out_dir / f"{NAME}.onnx"
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, target)
    manifest = {
        "format": FORMAT,
        "recipe": RECIPE,
        "name": NAME,
        "file": target.name,
        "onnx_bytes": len(data),
        "params": sum(p.numel() for p in model.parameters()),
        "multiply_adds": multiply_adds(model),
        "trained_params": sum(p.numel() for p in model[1].parameters()),
        "training": "random convolutional trunk (seeded, never trained); linear head by L-BFGS",
        "val_accuracy": round(ort_accuracy(session, splits["val"]), 4),
        "test_accuracy": round(ort_accuracy(session, splits["test"]), 4),
        "batch1_ms_1thread": round(batch1_latency_ms(session, splits["val"][0][0], runs=100), 3),
        "max_abs_diff_vs_torch": float(f"{worst:.2e}"),
        "build_seconds": round(time.perf_counter() - started, 1),
        "torch": torch.__version__,
    }
    partial = out_dir / (MANIFEST + ".partial")
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(partial, out_dir / MANIFEST)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path(".modelless/sim/models"))
    parser.add_argument("--force", action="store_true", help="build even if the cached model is current")
    args = parser.parse_args(argv)
    manifest = None if args.force else load_manifest(args.out)
    if manifest is None:
        manifest = _build(args.out)
    print(json.dumps({k: v for k, v in manifest.items() if k != "recipe"}, indent=1))


if __name__ == "__main__":
    main()
