"""The real zoo (``infra.zoo.real``: timm image models at 3x224x224 and a BERT-style text model),
built and registered once for every benchmark that serves it.

    python -m bench.real_zoo [--quick] [--only NAME ...] [--out-dir docs/bench] [--state-dir .modelless]

``real_zoo`` builds what the zoo's cache lacks (``python -m infra.zoo.real`` in a child process:
torch stays out of the benchmark's processes), then registers each model in-process with the
project's own ``RegistrationService`` (every variant built, profiled in a fresh child process and
pruned, exactly as a registration through the API), one registration at a time, printing its
progress. What came back is cached per model under ``<state>/bench/real-zoo/`` (gitignored): the
model's record, its registration (variant states, prune reasons, when the first variant became
servable and when the last was profiled) and its profiles, with the variant artifacts in a shared
repository directory beside them. An entry is reused while the model's files, the profiling code
(``variants/`` and ``modelless/registration/profiling.py``), the profiler's settings and the accelerator
derivation below are unchanged; anything else registers that model again.

CPU and Lambda profiles are measured here. GPU and Inferentia profiles cannot be (no such device
is lent to the benchmarks): they are **derived** from each model's measured one-thread CPU profile
by ``derive_accelerator_entries`` (INFaaS Table 2's ResNet-50 ratios, stated at the constants) and
imported through the project's import path (``modelless.registration.profile_import``), so they are marked
``imported`` and say in ``hardware`` that they were not measured. Consumers that want only what
was measured take ``RealZoo.measured()``.

Run alone, it writes ``<out-dir>/real-zoo.md`` and ``real-zoo.json``: per architecture, the seconds
from the end of the upload to the first servable variant and to every variant profiled, the
variants kept and pruned (with the registration's reasons), and the kept variants' latency and
accuracy.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlencode

import numpy as np

from bench.report import DEFAULT_OUT_DIR, machine, markdown_table, span, today, write_fragment
from modelless.types import ModelRecord, QueryTargets, Registration, RegistrationStatus, VariantProfile

if TYPE_CHECKING:
    from modelless.registration.service import RegistrationService

ROOT = Path(__file__).resolve().parent.parent
PART = "real-zoo"
CACHE_FORMAT = 1
# The zoo's models most benchmarks serve (``--quick``: the two cheapest to register and serve).
QUICK_MODELS = ("mobilenetv3_small_100", "resnet18")
# The code whose change makes a cached profile stale: the profiler, the variant recipes, pruning
# and the registration's background part.
PROFILING_CODE = ("variants", "layers/modelless/modelless/registration/profiling.py")
REGISTRATION_TIMEOUT_S = 4 * 3600.0  # one model's registration, at most
STALL_TIMEOUT_S = 1800.0  # ...and at most this long without any progress
POLL_S = 0.25

# --- derived accelerator profiles (not measured here) --------------------------------------------
# INFaaS Table 2 (ResNet-50): a 4-vCPU TensorFlow variant answers in 200 ms; a V100 TensorRT
# variant serves 800 QPS at 15 ms; one Inferentia core answers in 20 ms. A GPU call of batch b
# is taken as GPU_BATCH_INTERCEPT + GPU_BATCH_SLOPE·b times its batch-1 latency (at b = 12 that is
# 3.75x, so 12 queries per 15 ms = 800 QPS with a 4 ms batch-1 call: Table 2's point), and the
# batch-1 call as the CPU's over GPU_SPEEDUP (200 ms / 4 ms). Inferentia: the CPU's latency at
# each batch size over ACCEL_SPEEDUP (200 ms / 20 ms). Neither device answers a call faster than
# DEVICE_FLOOR_MS (kernel launch and host-device copies; an assumption, not a measurement).
GPU_SPEEDUP = 50.0
GPU_BATCH_INTERCEPT = 0.75
GPU_BATCH_SLOPE = 0.25
ACCEL_SPEEDUP = 10.0
DEVICE_FLOOR_MS = 0.1
# Loading onto an accelerator: the CPU artifact's measured load plus a device context and the
# compiled engine's deserialisation (an assumption; INFaaS reports loads of 0.59-11 s, §2).
DEVICE_LOAD_EXTRA_MS = 1000.0
DERIVED_FROM = "fp32_all"  # the artifact the accelerator variants are built from
NOT_MEASURED = "derived from this machine's CPU profile by INFaaS Table 2 ratios; not measured here"
DERIVATION_RULE = (
    "derived, not measured: from each model's measured 1-thread FP32 CPU profile by INFaaS Table 2's "
    f"ResNet-50 ratios (GPU batch-1 latency = CPU / {GPU_SPEEDUP:g}, a batch of b costing "
    f"{GPU_BATCH_INTERCEPT:g} + {GPU_BATCH_SLOPE:g}·b batch-1 calls; Inferentia = CPU / {ACCEL_SPEEDUP:g} "
    f"per batch size; neither faster than {DEVICE_FLOOR_MS:g} ms per call; load = the CPU load + "
    f"{DEVICE_LOAD_EXTRA_MS / 1000:g} s; the CPU profile's memory)"
)


def derive_accelerator_entries(cpu_profiles: Sequence[VariantProfile]) -> list[dict[str, Any]]:
    """Import entries (``modelless.registration.profile_import``) for a GPU and an Inferentia variant of one
    model, derived from its measured 1-thread ``DERIVED_FROM`` CPU profile (see the constants)."""
    sources = [p for p in cpu_profiles if p.pool == "cpu" and p.threads == 1 and not p.imported]
    if not sources:
        return []
    exact = [p for p in sources if f"{p.precision}_{p.opt_level}" == DERIVED_FROM]
    source = min(exact or sources, key=lambda p: (p.latency_p50_ms[1], p.variant_id))
    recipe = f"{source.precision}_{source.opt_level}"
    tail = {b: source.latency_p99_ms[b] / source.latency_p50_ms[b] for b in source.latency_p50_ms}
    gpu_one = max(DEVICE_FLOOR_MS, source.latency_p50_ms[1] / GPU_SPEEDUP)
    gpu = {b: gpu_one * (GPU_BATCH_INTERCEPT + GPU_BATCH_SLOPE * b) for b in source.latency_p50_ms}
    accel = {b: max(DEVICE_FLOOR_MS, ms / ACCEL_SPEEDUP) for b, ms in source.latency_p50_ms.items()}
    entries = []
    for pool, p50 in (("gpu", gpu), ("accel", accel)):
        entries.append(
            {
                "recipe": recipe,
                "pool": pool,
                "latency_p50_ms": {str(b): round(ms, 6) for b, ms in p50.items()},
                "latency_p99_ms": {str(b): round(ms * tail[b], 6) for b, ms in p50.items()},
                "load_latency_ms": round(source.load_latency_ms + DEVICE_LOAD_EXTRA_MS, 3),
                "peak_memory_mb": source.peak_memory_mb,
                "accuracy": source.accuracy,
                "accuracy_metric": source.accuracy_metric,
                "accuracy_examples": source.accuracy_examples,
                "hardware": f"{pool}: {NOT_MEASURED} ({source.variant_id})",
                "threads": 1,
            }
        )
    return entries


# --- the zoo's models, as built ----------------------------------------------------------------


class Built(Protocol):
    """What the benchmarks need of a built model (``infra.zoo.real.BuiltModel``; tests hand in
    stand-ins of the same shape)."""

    @property
    def name(self) -> str: ...

    @property
    def app(self) -> str: ...

    @property
    def onnx_path(self) -> Path: ...

    @property
    def valset_path(self) -> Path: ...

    @property
    def testset_path(self) -> Path: ...

    @property
    def manifest(self) -> dict[str, Any]: ...

    @property
    def preprocessing(self) -> dict[str, Any] | None: ...


def zoo_names(quick: bool = False, only: Sequence[str] | None = None) -> list[str] | None:
    """The models to use: ``only`` when given, the two quick ones with ``quick``, else every
    model of the zoo (None)."""
    if only:
        return list(only)
    return list(QUICK_MODELS) if quick else None


def build_models(
    names: Sequence[str] | None, root: Path | None = None, log: Callable[[str], None] = print
) -> list[Built]:
    """The zoo's models (``infra.zoo.real``), built first where its cache lacks them: in a child
    process, so that torch is never imported by a benchmark's process."""
    from infra.zoo import real

    # Absolute: the child runs in the repository's root, this process wherever it was started.
    zoo_root = (root or real.ZOO_ROOT).resolve()
    wanted = list(names) if names is not None else [entry.name for entry in real.ZOO]
    command = [sys.executable, "-m", "infra.zoo.real", "--root", str(zoo_root)]
    if names is not None:
        command += ["--only", *wanted]
    log(f"building the real zoo where {zoo_root} lacks it: {' '.join(wanted)}")
    subprocess.run(command, check=True, cwd=ROOT)
    return [cast(Built, real.load_built(name, zoo_root)) for name in wanted]


# --- the registered zoo --------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredModel:
    """One model as the project registered it, and how its registration went."""

    name: str
    app: str
    record: ModelRecord
    registration: Registration
    profiles: list[VariantProfile]  # measured, and the derived (imported) accelerator ones
    manifest: dict[str, Any]  # the zoo's build manifest (accuracy at build, parameters, method)
    testset: Path
    first_servable_s: float | None  # from the end of the upload to the first servable variant
    all_profiled_s: float  # ... to every variant profiled (the registration ready)
    measured_at: str
    machine: str
    key: str

    def measured(self) -> list[VariantProfile]:
        return [p for p in self.profiles if not p.imported]

    @property
    def kept(self) -> list[str]:
        return sorted({p.variant_id for p in self.measured()})

    @property
    def prune_reasons(self) -> dict[str, str]:
        return dict(self.registration.prune_reasons)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "app": self.app,
            "record": json.loads(self.record.to_json()),
            "registration": json.loads(self.registration.to_json()),
            "profiles": [json.loads(p.to_json()) for p in self.profiles],
            "manifest": self.manifest,
            "testset": str(self.testset),
            "first_servable_s": self.first_servable_s,
            "all_profiled_s": self.all_profiled_s,
            "measured_at": self.measured_at,
            "machine": self.machine,
            "key": self.key,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RegisteredModel:
        first = raw.get("first_servable_s")
        return cls(
            name=str(raw["name"]),
            app=str(raw["app"]),
            record=ModelRecord.from_json(json.dumps(raw["record"])),
            registration=Registration.from_json(json.dumps(raw["registration"])),
            profiles=[VariantProfile.from_json(json.dumps(p)) for p in raw["profiles"]],
            manifest=dict(raw["manifest"]),
            testset=Path(str(raw["testset"])),
            first_servable_s=float(first) if first is not None else None,
            all_profiled_s=float(raw["all_profiled_s"]),
            measured_at=str(raw["measured_at"]),
            machine=str(raw["machine"]),
            key=str(raw["key"]),
        )


@dataclass(frozen=True)
class RealZoo:
    """The registered zoo: its models (in the zoo's order) and where their artifacts are."""

    models: list[RegisteredModel]
    repository: Path

    @property
    def profiles(self) -> list[VariantProfile]:
        return [p for m in self.models for p in m.profiles]

    def measured(self) -> list[VariantProfile]:
        return [p for m in self.models for p in m.measured()]

    def model(self, name: str) -> RegisteredModel:
        for model in self.models:
            if model.name == name:
                return model
        raise KeyError(f"{name!r} is not in the registered zoo ({', '.join(m.name for m in self.models)})")

    def by_model(self) -> dict[str, list[VariantProfile]]:
        return {m.name: list(m.profiles) for m in self.models}

    @property
    def apps(self) -> list[str]:
        return sorted({m.app for m in self.models})

    def publish(self, store: Any, measured_only: bool = True) -> None:
        """Put every model, its registration and its profiles in ``store`` (a MetadataStore), as
        a registration would have left them."""
        for model in self.models:
            store.add_model(model.record, model.registration)
            profiles = model.measured() if measured_only else model.profiles
            store.publish_variants(model.record, profiles, model.registration)


def profiling_code_version(root: Path = ROOT) -> str:
    """A digest of the code that measures profiles (``PROFILING_CODE``)."""
    digest = hashlib.sha256()
    for entry in PROFILING_CODE:
        path = root / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            if "__pycache__" in file.parts:
                continue
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def profiler_settings() -> dict[str, Any]:
    """The settings that change what a registration measures (profiling, accuracy, batching)."""
    from modelless.config import Settings

    dumped = Settings().model_dump()
    wanted = ("profile", "accuracy", "max_batch", "calibration")
    return {
        k: v
        for k, v in sorted(dumped.items())
        if any(w in k for w in wanted) and not any(other in k for other in ("offline", "cache"))
    }


def cache_key(built: Built, code_version: str, settings: Mapping[str, Any]) -> str:
    derivation = [DERIVED_FROM, GPU_SPEEDUP, GPU_BATCH_INTERCEPT, GPU_BATCH_SLOPE, ACCEL_SPEEDUP]
    derivation += [DEVICE_FLOOR_MS, DEVICE_LOAD_EXTRA_MS]
    raw = json.dumps(
        [
            CACHE_FORMAT,
            built.name,
            built.app,
            file_digest(built.onnx_path),
            file_digest(built.valset_path),
            code_version,
            dict(settings),
            derivation,
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def cache_dir(state_dir: Path) -> Path:
    return state_dir / "bench" / "real-zoo"


def real_zoo(
    names: Sequence[str] | None = None,
    *,
    quick: bool = False,
    state_dir: Path = Path(".modelless"),
    log: Callable[[str], None] = print,
    built: Sequence[Built] | None = None,
) -> RealZoo:
    """The registered zoo: each model from the cache when its entry still matches, else
    registered now (one at a time) and cached. ``built``: the models to register (tests' stand-ins);
    by default the zoo's, built first where ``state_dir``/zoo-real lacks them (``names``, or the
    quick pair)."""
    models = (
        list(built)
        if built is not None
        else build_models(zoo_names(quick, names), root=state_dir / "zoo-real", log=log)
    )
    directory = cache_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    repository = directory / "repo"
    code_version = profiling_code_version()
    settings = profiler_settings()
    registered = []
    for index, model in enumerate(models, start=1):
        key = cache_key(model, code_version, settings)
        entry_path = directory / f"{model.name}.json"
        cached = _read_entry(entry_path)
        if cached is not None and cached.key == key and _artifacts_present(cached, repository):
            log(f"[{index}/{len(models)}] {model.name}: cached, registered {cached.measured_at}")
            registered.append(cached)
            continue
        log(f"[{index}/{len(models)}] {model.name}: registering (every variant built and profiled)...")
        fresh = register_model(model, repository, key, log)
        partial = entry_path.with_suffix(".partial")
        partial.write_text(json.dumps(fresh.to_json(), indent=1))
        partial.replace(entry_path)
        registered.append(fresh)
    return RealZoo(registered, repository)


def _read_entry(path: Path) -> RegisteredModel | None:
    try:
        return RegisteredModel.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _artifacts_present(model: RegisteredModel, repository: Path) -> bool:
    return all((repository / p.artifact_key).is_file() for p in model.profiles if p.artifact_key)


def submit_registration(registrar: RegistrationService, built: Built) -> Registration:
    """The one call into the registration API: the upload of the model, its validation set and
    its preprocessing recipe, as files on this machine (what an upload becomes on the gateway)."""
    from modelless.registration.ingest import RegistrationSource

    source = RegistrationSource(model=built.onnx_path, valset=built.valset_path)
    return registrar.register(built.app, built.name, source, preprocessing=built.preprocessing)


def register_model(
    built: Built, repository_dir: Path, key: str, log: Callable[[str], None] = print
) -> RegisteredModel:
    """Register one model in-process into ``repository_dir`` (its previous artifacts removed
    first), following its progress; then import its derived accelerator profiles."""
    from modelless.catalog import DEFAULT_POOLS
    from modelless.config import Settings
    from modelless.metadata import open_metadata_store
    from modelless.registration.profile_import import import_profiles
    from modelless.registration.profiling import model_prefix
    from modelless.registration.service import RegistrationService
    from modelless.repository.local import LocalModelRepository

    store = open_metadata_store("memory://")
    repository = LocalModelRepository(repository_dir)
    repository.delete_prefix(model_prefix(built.app, built.name))
    registrar = RegistrationService(store, repository, Settings(), DEFAULT_POOLS)
    try:
        submitted = submit_registration(registrar, built)
        uploaded_at = time.time()  # the upload is in the repository: the background part begins
        final, observed_first = _follow(store, submitted.registration_id, built, log)
        if final.status is not RegistrationStatus.READY:
            raise RuntimeError(f"registering {built.name} failed: {final.message}")
        measured = store.list_variants(built.app, built.name)
        entries = derive_accelerator_entries(measured)
        if entries:
            import_profiles(store, repository, DEFAULT_POOLS, built.app, built.name, entries)
    finally:
        registrar.close()
    record = store.get_model(built.app, built.name)
    registration = store.get_registration(submitted.registration_id)
    assert record is not None and registration is not None
    first = registration.first_servable_at or observed_first
    finished = final.finished_at or time.time()
    model = RegisteredModel(
        name=built.name,
        app=built.app,
        record=record,
        registration=registration,
        profiles=store.list_variants(built.app, built.name),
        manifest=dict(built.manifest),
        testset=built.testset_path,
        first_servable_s=round(first - uploaded_at, 2) if first is not None else None,
        all_profiled_s=round(finished - uploaded_at, 2),
        measured_at=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        machine=machine(),
        key=key,
    )
    log(
        f"  {built.name}: first servable after {_seconds(model.first_servable_s)}, every variant profiled "
        f"after {model.all_profiled_s:.0f} s; {len(model.kept)} kept, {registration.pruned} pruned"
    )
    return model


def _follow(
    store: Any, registration_id: str, built: Built, log: Callable[[str], None]
) -> tuple[Registration, float | None]:
    """Poll the registration until it ends, printing each change of its progress. Returns its
    final record and when a variant was first seen published (for a registration record that
    does not say it)."""
    started = last_change = time.monotonic()
    observed_first: float | None = None
    shown = ""
    while True:
        current = store.get_registration(registration_id)
        if current is None:
            raise RuntimeError(f"registration {registration_id} of {built.name} vanished")
        if observed_first is None and store.list_variants(built.app, built.name):
            observed_first = time.time()
        eta = f", ~{current.eta_s:.0f} s left" if current.eta_s is not None else ""
        line = (
            f"  {built.name}: {current.status.value} {current.done}/{current.total}{eta} - {current.message}"
        )
        if line != shown:
            log(line)
            shown, last_change = line, time.monotonic()
        if current.status in (RegistrationStatus.READY, RegistrationStatus.FAILED):
            return current, observed_first
        now = time.monotonic()
        if now - started > REGISTRATION_TIMEOUT_S or now - last_change > STALL_TIMEOUT_S:
            raise RuntimeError(f"registering {built.name} made no progress for {now - last_change:.0f} s")
        time.sleep(POLL_S)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} s"


# --- queries to the zoo's models -----------------------------------------------------------------


def held_out_batch(model: RegisteredModel, rows: int) -> np.ndarray:
    """``rows`` examples of the model's held-out test set, as a batch the model takes (a plain
    array for one input, a structured array for several: ``modelless.inputs.tensors``)."""
    from modelless.inputs.tensors import from_feeds

    specs = model.record.input_specs
    with np.load(model.testset, allow_pickle=False) as data:
        if len(specs) == 1:
            key = "inputs" if "inputs" in data.files else specs[0].name
            arrays = {specs[0].name: data[key][:rows]}
        else:
            arrays = {spec.name: data[spec.name][:rows] for spec in specs}
    return from_feeds(arrays, specs)


def encode_body(batch: np.ndarray) -> tuple[str, bytes]:
    """A query body for the binary path: one ``.npy`` array for a one-input model, an ``.npz``
    with one array per input for several."""
    buffer = io.BytesIO()
    if batch.dtype.names is None:
        np.save(buffer, batch, allow_pickle=False)
        return "application/x-npy", buffer.getvalue()
    arrays = {name: np.ascontiguousarray(batch[name]) for name in batch.dtype.names}
    cast(Any, np.savez)(buffer, **arrays)  # one array per input, named as the input
    return "application/x-npz", buffer.getvalue()


def json_body(batch: np.ndarray, targets: QueryTargets) -> bytes:
    """Today's JSON body for the same query: ``inputs`` a nested list (an object of them, one per
    input, for several)."""
    if batch.dtype.names is None:
        inputs: Any = batch.tolist()
    else:
        inputs = {name: batch[name].tolist() for name in batch.dtype.names}
    body: dict[str, Any] = {"appID": targets.app_id, "inputs": inputs}
    body |= _target_fields(targets)
    return json.dumps(body).encode()


def query_path(targets: QueryTargets, binary: bool) -> str:
    """The online-query path: binary bodies carry their targets in query parameters."""
    if not binary:
        return "/v1/online_query"
    return "/v1/online_query?" + urlencode({"appID": targets.app_id, **_target_fields(targets)})


def _target_fields(targets: QueryTargets) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if targets.latency_ms is not None:
        fields["latency"] = targets.latency_ms
    if targets.min_accuracy:
        fields["accuracy"] = targets.min_accuracy
    if targets.model_name is not None:
        fields["modelName"] = targets.model_name
    return fields


# --- the write-up --------------------------------------------------------------------------------


def manifest_value(manifest: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` the build manifest has (its field names, as the zoo writes them)."""
    for key in keys:
        value = manifest.get(key)
        if value is not None:
            return value
    return None


def _fmt_count(value: Any) -> str:
    return f"{int(value):,}" if isinstance(value, int | float) and not isinstance(value, bool) else "—"


def _fmt_accuracy(value: Any) -> str:
    return f"{float(value):.3f}" if isinstance(value, int | float) and not isinstance(value, bool) else "—"


def ms_digits(values: Sequence[float]) -> int:
    """Decimals that show a latency at its scale: none from 10 ms up, one from 1 ms, three below."""
    smallest = min(values, default=1.0)
    return 0 if smallest >= 10 else 1 if smallest >= 1 else 3


def fmt_ms(value: float) -> str:
    return f"{value:.{ms_digits([value])}f}"


def accuracy_with_ci(profile: VariantProfile) -> str:
    """``0.912 [0.884, 0.935]``: the accuracy and its 95 % interval where the profile has one."""
    if profile.accuracy_low > 0.0 or profile.accuracy_high < 1.0:
        return f"{profile.accuracy:.3f} [{profile.accuracy_low:.3f}, {profile.accuracy_high:.3f}]"
    return f"{profile.accuracy:.3f}"


def inputs_text(record: ModelRecord) -> str:
    return ", ".join(f"{s.name} {s.dtype}[{'x'.join(map(str, s.shape))}]" for s in record.input_specs)


def generated(model: RegisteredModel) -> int:
    """Variants profiled: those kept and those pruned (a recipe at each placement)."""
    return len(model.kept) + model.registration.pruned


def zoo_rows(zoo: RealZoo) -> list[list[str]]:
    rows = []
    for model in zoo.models:
        cpu = [p for p in model.measured() if p.pool == "cpu"]
        manifest = model.manifest
        rows.append(
            [
                f"`{model.name}`",
                model.app,
                _fmt_count(manifest_value(manifest, "parameters", "params", "param_count")),
                inputs_text(model.record),
                f"{_fmt_accuracy(manifest_value(manifest, 'val_accuracy', 'torch_val_accuracy'))} / "
                f"{_fmt_accuracy(manifest_value(manifest, 'test_accuracy', 'torch_test_accuracy'))}",
                f"{generated(model)} / {len(model.kept)} / {model.registration.pruned}",
                _seconds(model.first_servable_s),
                _seconds(model.all_profiled_s),
                span([p.latency_p50_ms[1] for p in cpu], ms_digits([p.latency_p50_ms[1] for p in cpu])),
                span([p.accuracy for p in model.measured()], 3),
                model.measured_at,
            ]
        )
    return rows


ZOO_HEADER = [
    "model",
    "app",
    "parameters",
    "inputs",
    "accuracy at build, val / test (torch)",
    "variants generated / kept / pruned",
    "upload end → first servable",
    "→ every variant profiled",
    "kept cpu variants: batch-1 p50 ms",
    "kept variants: accuracy",
    "registered",
]


def prune_lines(zoo: RealZoo) -> list[str]:
    lines = []
    for model in zoo.models:
        for variant, reason in sorted(model.prune_reasons.items()):
            lines.append(f"- `{variant}`: {reason}")
    return lines


def write_report(zoo: RealZoo, out_dir: Path, command: str) -> Path:
    rows = zoo_rows(zoo)
    first = [m.first_servable_s for m in zoo.models if m.first_servable_s is not None]
    every = [m.all_profiled_s for m in zoo.models]
    kept = sum(len(m.kept) for m in zoo.models)
    pruned = sum(m.registration.pruned for m in zoo.models)
    cpu_batch_one = [p.latency_p50_ms[1] for p in zoo.measured() if p.pool == "cpu"]
    spread = max(cpu_batch_one) / min(cpu_batch_one) if cpu_batch_one else math.nan
    reasons = prune_lines(zoo)
    median_every = statistics.median(every) if every else math.nan
    machines = sorted({m.machine.rsplit(",", 1)[0] for m in zoo.models})
    markdown = f"""## The real zoo: registration at real size

Machine: `{machine()}` (registrations on {", ".join(f"`{m}`" for m in machines)}); {today()}.
Reproduce: `{command}` (builds the zoo where `.modelless/zoo-real` lacks it:
`python -m infra.zoo.real`, see [ZOO.md](../ZOO.md)). Every model registered once, in-process, by the
project's `RegistrationService` with the catalog's pools and the default settings, one registration at
a time (nothing else profiling beside it), and cached under `.modelless/bench/real-zoo/` until the
model, the profiling code or its settings change: the date of each registration is in the table.
There is one registration per model, so the spread is that of the profiler itself: each batch-1
latency carries its own confidence interval (the profiler times runs until it is narrow).

Accuracy at build is the model's own on the zoo's validation and test splits (torch, before
export; not ImageNet accuracy: see ZOO.md); the variants' accuracy is what registration measured
on the validation set it was given. Times run from the end of the upload (the model and its
validation set in the repository) to the first variant published (servable) and to the
registration's end (every variant profiled, the dominated ones pruned).

{markdown_table(ZOO_HEADER, rows)}

In all: {kept} variants kept, {pruned} pruned; kept CPU variants' batch-1 p50 spans
{span(cpu_batch_one, ms_digits(cpu_batch_one))} ms ({spread:.0f}x). First servable variant after
{span(first, 0)} s;
every variant profiled after {span(every, 0)} s (median {median_every:.0f} s).

GPU and Inferentia profiles used by the cost study are {DERIVATION_RULE}; they are not in this table.

<details><summary>Why each pruned variant was pruned (the registration's reasons)</summary>

{chr(10).join(reasons) if reasons else "No variant was pruned, or the registrations recorded no reasons."}

</details>
"""
    headlines = [
        f"Real zoo ({len(zoo.models)} architectures): first variant servable {span(first, 0)} s after the "
        f"upload, every variant profiled after {span(every, 0)} s; {kept} variants kept, {pruned} pruned; "
        f"batch-1 CPU latency spread {spread:.0f}x"
    ]
    return write_fragment(
        out_dir,
        PART,
        markdown,
        {
            "machine": machine(),
            "date": today(),
            "command": command,
            "models": [m.to_json() | {"profiles": len(m.profiles)} for m in zoo.models],
            "headlines": headlines,
        },
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"only {' and '.join(QUICK_MODELS)}")
    parser.add_argument("--only", nargs="+", help="these models of the zoo only")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--state-dir", type=Path, default=Path(".modelless"))
    args = parser.parse_args(list(argv) if argv is not None else None)
    print(f"machine: {machine()}", flush=True)
    zoo = real_zoo(args.only, quick=args.quick, state_dir=args.state_dir)
    command = " ".join(
        [
            "scripts/bench real-zoo",
            *(["--quick"] if args.quick else []),
            *(["--only", *args.only] if args.only else []),
        ]
    )
    write_report(zoo, args.out_dir, command)


if __name__ == "__main__":
    main()
