"""The background part of a registration: build a model's variant artifacts, profile them and
publish each variant the moment its own profile is done, then prune.

Every step runs in a fresh child process (``python -m variants build|measure``), so that the
memory a profile measures is the variant's own and nothing in the caller disturbs its timings.
``modelless.registration.service`` hands a checked, stored model to ``build_and_profile``; this module
never sees an upload.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aws_lambda_powertools import Logger

from modelless.catalog import Placement, PoolSpec, placements
from modelless.config import Settings
from modelless.exceptions import first_line
from modelless.metadata.base import ModelStore
from modelless.repository.base import ModelRepository
from modelless.types import ModelRecord, Registration, RegistrationStatus, VariantProfile
from variants.pruning import SLACK_MS, prune_variants
from variants.recipes import Recipe

logger = Logger(service="registrar", child=True)


def model_prefix(app_id: str, model_name: str) -> str:
    return f"apps/{app_id}/{model_name}/"


def variant_id(app_id: str, model_name: str, recipe: str, pool: str) -> str:
    return f"{app_id}/{model_name}/{recipe}/{pool}"


@dataclass(frozen=True)
class Profiler:
    """What profiling writes to and how it reports progress (the registration service's parts)."""

    store: ModelStore
    repository: ModelRepository
    settings: Settings
    pools: Mapping[str, PoolSpec]
    progress: Callable[[Registration, RegistrationStatus, str], None]


def build_and_profile(
    profiler: Profiler, model: ModelRecord, registration: Registration, tmp: Path, metric: str
) -> None:
    """Build every recipe's artifact in a child process, then profile them with
    ``ProfilingRun``: the registered precision first, each variant published as soon as its
    own profile is done, pruning at the end."""
    prefix = model_prefix(model.app_id, model.model_name)
    source = tmp / "source.onnx"
    profiler.repository.get_file(model.artifact_key, source)
    valset = tmp / "valset.npz"
    profiler.repository.get_file(f"{prefix}valset.npz", valset)
    with np.load(valset, allow_pickle=False) as data:
        examples = len(data["labels"])
    # Static INT8 calibrates on the first examples; every variant's accuracy is then measured
    # on the others, so that all accuracies are comparable and none is measured on its own
    # calibration data. Too small a set is kept whole and static INT8 skipped.
    calibration = min(MAX_CALIBRATION_EXAMPLES, examples // 4) if examples >= MIN_EXAMPLES_TO_CALIBRATE else 0
    estimate = StepEstimate(source.stat().st_size, examples - calibration, profiler.settings)

    profiler.progress(
        registration, RegistrationStatus.GENERATING, "building optimised and quantised artifacts"
    )
    build_args: list[object] = [source, tmp / "artifacts", "--valset", valset]
    build_args += ["--calibration-count", calibration, "--threads", os.cpu_count() or 1]
    built = run_step("build", *build_args, timeout_s=estimate.build_s(calibration))
    run = ProfilingRun(profiler, model, registration, tmp, valset, metric, calibration, estimate)
    run.profile(built)


def variant_profile(
    model: ModelRecord,
    recipe: Recipe,
    key: str,
    placement: Placement,
    timing: Mapping[str, Any],
    accuracy: Mapping[str, Any],
    fetch_ms: float,
) -> VariantProfile:
    """One variant: an artifact's timing at the placement's thread count and its accuracy."""
    return VariantProfile(
        variant_id=variant_id(model.app_id, model.model_name, recipe.name, placement.name),
        app_id=model.app_id,
        model_name=model.model_name,
        pool=placement.pool.name,
        precision=recipe.precision,
        opt_level=recipe.opt_level,
        threads=placement.threads,
        artifact_key=key,
        size_bytes=timing["size_bytes"],
        load_latency_ms=round(timing["load_latency_ms"] + fetch_ms, 3),
        latency_p50_ms={int(b): t for b, t in timing["latency_p50_ms"].items()},
        latency_p99_ms={int(b): t for b, t in timing["latency_p99_ms"].items()},
        peak_memory_mb=timing["peak_memory_mb"],
        accuracy=accuracy["accuracy"],
        price_per_second=placement.price_per_second,
        request_price=placement.pool.request_price,
        hardware=timing["hardware"],
        # The embedded stack runs its CPU pools, Lambda's included, on this machine.
        measured_on_target=True,
        memory_mb=placement.memory_mb,
        saturation_qps=timing["saturation_qps"],
        max_useful_batch=timing["max_useful_batch"],
        accuracy_metric=accuracy["accuracy_metric"],
        accuracy_examples=accuracy["accuracy_examples"],
        accuracy_low=accuracy["accuracy_low"],
        accuracy_high=accuracy["accuracy_high"],
        agreement=accuracy["agreement"],
        profile_runs=timing["profile_runs"],
        p50_ci_pct=timing["p50_ci_pct"],
        # Timing passes run one at a time, with nothing else profiling beside them.
        contended=False,
    )


MAX_CALIBRATION_EXAMPLES = 128
MIN_EXAMPLES_TO_CALIBRATE = 40
MiB = 1024 * 1024
# Step time limits are derived, not fixed: an estimate of what the step does (from the model's
# size until the registered model's speed is measured, from that speed after), times a margin.
STEP_TIMEOUT_MARGIN = 5.0
MIN_STEP_TIMEOUT_S = 120.0
# Before anything is measured: seconds per example per MB of model, at one thread (ResNet-50's
# 100 MB run ~40 ms an image on one core; BERT-base's 440 MB ~200 ms a 128-token sequence).
GUESSED_S_PER_EXAMPLE_PER_MB = 0.0005
# Reading, optimising and writing the model: ~a dozen passes over its bytes, at this rate.
BUILD_S_PER_MB = 6.0
# A variant may run this much slower than the registered model (static INT8 at the basic level
# runs its unfused QDQ nodes one by one).
SLOWEST_VARIANT_FACTOR = 4.0
# Screening times batch 1 only, briefly: a second per level past the minimum runs at most.
SCREEN_BUDGET_S = 1.0
# Queued recipes: the registered precision at its best-guess level first (it is the reference,
# and the variant most likely kept), then dynamic INT8, then the rest; smaller first in a rank.
REFERENCE_RECIPE = Recipe("fp32", "all")
QUANTISED = ("int8", "int8-static")


class VariantState:
    QUEUED = "queued"
    PROFILING = "profiling"
    READY = "ready"
    PRUNED = "pruned"
    FAILED = "failed"


def profile_order(artifacts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order recipes are profiled in (see REFERENCE_RECIPE)."""

    def rank(artifact: dict[str, Any]) -> tuple[int, int, str]:
        recipe = Recipe.parse(str(artifact["recipe"]))
        first = 0 if recipe == REFERENCE_RECIPE else 1 if recipe.precision == "int8" else 2
        return first, int(artifact.get("size_bytes") or 0), recipe.name

    ordered = sorted(artifacts, key=rank)
    # Without an FP32 'all' artifact, the registered precision's first one leads all the same.
    reference = next((a for a in ordered if str(a["recipe"]).startswith("fp32_")), None)
    if reference is not None and ordered[0] is not reference:
        ordered.remove(reference)
        ordered.insert(0, reference)
    return ordered


def max_request_batch(settings: Settings, model: ModelRecord) -> int:
    """The largest batch a query can carry: Settings.max_batch, and as many rows as fit in the
    query body limit sent as binary tensors (JSON carries fewer)."""
    row_bytes = sum(
        math.prod(max(1, d) for d in spec.shape) * np.dtype(spec.dtype).itemsize for spec in model.input_specs
    )
    return max(1, min(settings.max_batch, settings.max_query_bytes // max(1, row_bytes)))


@dataclass
class StepEstimate:
    """What each child step is expected to take, for its time limit."""

    model_bytes: int
    scored_examples: int
    settings: Settings
    seconds_per_example: float | None = None  # the registered model at batch 1, one thread, once timed

    @property
    def model_mb(self) -> float:
        return self.model_bytes / MiB

    def per_example_s(self) -> float:
        if self.seconds_per_example is not None:
            return self.seconds_per_example * SLOWEST_VARIANT_FACTOR
        return max(1e-4, self.model_mb * GUESSED_S_PER_EXAMPLE_PER_MB)

    def _limit(self, estimate_s: float) -> float:
        return max(MIN_STEP_TIMEOUT_S, STEP_TIMEOUT_MARGIN * estimate_s)

    def build_s(self, calibration: int) -> float:
        work = BUILD_S_PER_MB * self.model_mb + (calibration + self.scored_examples) * self.per_example_s()
        return self._limit(work)

    def accuracy_s(self, passes: int, threads: int) -> float:
        load = BUILD_S_PER_MB / 4 * self.model_mb
        return self._limit(load + passes * self.scored_examples * self.per_example_s() / max(1, threads))

    def timing_s(self, max_batch: int) -> float:
        settings = self.settings
        load = BUILD_S_PER_MB / 4 * self.model_mb
        sizes = [1 << i for i in range(max_batch.bit_length())] + [max_batch]
        per_batch = [
            # warm-up (a budget past two runs) + timed runs (the minimum, then at most the budget)
            2 * settings.profile_batch_budget_s
            + (2 + settings.profile_min_runs) * batch * self.per_example_s()
            for batch in sizes
        ]
        return self._limit(load + sum(per_batch))


def screened_out(medians: Mapping[str, float], pct: float) -> dict[str, str]:
    """Recipes (with their batch-1 medians, ms) more than ``pct`` % (plus the timer's slack)
    slower than the fastest level of their own precision: recipe -> that fastest sibling."""
    fastest: dict[str, str] = {}
    for recipe, median in medians.items():
        precision = Recipe.parse(recipe).precision
        if precision not in fastest or median < medians[fastest[precision]]:
            fastest[precision] = recipe
    return {
        recipe: fastest[precision]
        for recipe, median in medians.items()
        if median
        > medians[fastest[(precision := Recipe.parse(recipe).precision)]] * (1 + pct / 100) + SLACK_MS
    }


class ProfilingRun:
    """One registration's profiling, after its artifacts are built.

    Accuracy passes run in parallel (``profile_parallelism`` at once: contention does not change
    an accuracy), timing passes one at a time with nothing else profiling beside them, each in
    its own child process. The reference recipe goes first, alone, so that the registered model
    is servable as early as can be; the others follow in groups: the group's accuracy passes
    together, then its timing passes one by one. Each (recipe, thread count) timing publishes
    the variants of the placements with that thread count at once."""

    def __init__(
        self,
        profiler: Profiler,
        model: ModelRecord,
        registration: Registration,
        tmp: Path,
        valset: Path,
        metric: str,
        calibration: int,
        estimate: StepEstimate,
    ) -> None:
        self._profiler = profiler
        self._store = profiler.store
        self._repository = profiler.repository
        self._settings = profiler.settings
        self.model = model
        self.registration = registration
        self._tmp = tmp
        self._valset = valset
        self._metric = metric
        self._calibration = calibration
        self._estimate = estimate
        self._prefix = model_prefix(model.app_id, model.model_name)
        self._placements = [
            p for pool in profiler.pools.values() if pool.device == "cpu" for p in placements(pool)
        ]
        self._thread_counts = sorted({p.threads for p in self._placements})
        self._max_batch = max_request_batch(self._settings, model)
        self._reference: str | None = None
        self._reference_p50_ms: float | None = None  # its batch-1 median at the fewest threads
        self._screened: dict[str, str] = {}  # variant id -> why it was not profiled in full
        self.generated: list[VariantProfile] = []
        self._notes: list[str] = []
        self._accuracy_notes: list[str] = []
        self._started = time.monotonic()

    def profile(self, built: Mapping[str, Any]) -> None:
        artifacts: list[dict[str, Any]] = list(built["artifacts"])
        self._notes += [str(note) for note in built.get("notes") or []]
        reference_answers = built.get("reference")
        self._answers = Path(str(reference_answers)) if reference_answers else None
        keys: dict[str, str] = {}
        for artifact in artifacts:
            recipe = str(artifact["recipe"])
            keys[recipe] = f"{self._prefix}variants/{recipe}.onnx"
            self._repository.put_file(keys[recipe], Path(str(artifact["path"])))
            if not artifact["runs_on_cpu"]:
                self._notes.append(
                    f"{recipe} kept for accelerator pools only (the CPU provider cannot run it)"
                )
        order = profile_order([a for a in artifacts if a["runs_on_cpu"]])
        if not order:
            raise RuntimeError("no artifact runs on this machine's CPU provider")
        self._reference = str(order[0]["recipe"])
        registration = self.registration
        registration.variants = {str(a["recipe"]): VariantState.QUEUED for a in order}
        registration.total = len(order) * len(self._thread_counts)
        registration.done = 0
        self._started = time.monotonic()
        self._profiler.progress(registration, RegistrationStatus.PROFILING, "profiling variants")

        parallelism = max(1, self._settings.profile_parallelism)
        with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="accuracy") as passes:
            self._profile_group(order[:1], keys, passes)
            rest = self._screen(order[1:])
            for start in range(0, len(rest), parallelism):
                self._profile_group(rest[start : start + parallelism], keys, passes)
        self._finish()

    def _screen(self, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The candidates worth a full profile. Optimisation levels of one precision compute the
        same function, so they differ in speed only: each level that has a sibling is timed at
        batch 1 on the fewest threads (briefly, alone), and one more than ``profile_screen_pct``
        slower than its precision's fastest is pruned here, with the reason, instead of paying
        for its accuracy pass and a timing pass per thread count (most of a large model's
        registration). A level whose screen fails is profiled in full (and fails there, said)."""
        pct = self._settings.profile_screen_pct
        if pct <= 0:
            return candidates
        threads = self._thread_counts[0]
        medians: dict[str, float] = {}
        if self._reference is not None and self._reference_p50_ms is not None:
            medians[self._reference] = self._reference_p50_ms
        precisions = [Recipe.parse(r).precision for r in [*medians, *(str(a["recipe"]) for a in candidates)]]
        for artifact in candidates:
            recipe = str(artifact["recipe"])
            if precisions.count(Recipe.parse(recipe).precision) < 2:
                continue  # a precision's only level: nothing to screen it against
            self._save(f"screening {recipe} at batch 1")
            budget_s = min(SCREEN_BUDGET_S, self._settings.profile_batch_budget_s)
            try:
                timing = self._measure(artifact, threads, max_batch=1, batch_budget_s=budget_s)
            except Exception as error:
                logger.warning("screening step failed", extra={"recipe": recipe, "error": str(error)})
                continue
            medians[recipe] = float(timing["latency_p50_ms"]["1"])
        # The reference is profiled and published already: never screened, however it compares.
        slower = {r: f for r, f in screened_out(medians, pct).items() if r != self._reference}
        for recipe, fastest in slower.items():
            self._screen_out(recipe, fastest, medians, threads, pct)
        return [a for a in candidates if str(a["recipe"]) not in slower]

    def _screen_out(
        self, recipe: str, fastest: str, medians: Mapping[str, float], threads: int, pct: float
    ) -> None:
        reason = (
            f"screened out at batch 1 on {threads} thread(s): p50 {medians[recipe]:.3f} ms vs "
            f"{fastest}'s {medians[fastest]:.3f} ms, more than {pct:g} % slower at the same precision; "
            "not profiled further"
        )
        for placement in self._placements:
            self._screened[variant_id(self.model.app_id, self.model.model_name, recipe, placement.name)] = (
                reason
            )
        self.registration.variants[recipe] = VariantState.PRUNED
        self.registration.done += len(self._thread_counts)
        self.registration.eta_s = self._eta()

    def _profile_group(
        self, group: list[dict[str, Any]], keys: Mapping[str, str], passes: ThreadPoolExecutor
    ) -> None:
        threads = max(1, (os.cpu_count() or 1) // len(group))
        for artifact in group:
            self._set_state(str(artifact["recipe"]), VariantState.PROFILING)
        self._save(f"measuring the accuracy of {', '.join(str(a['recipe']) for a in group)}")
        pending = {str(a["recipe"]): passes.submit(self._accuracy, a, threads) for a in group}
        accuracies: dict[str, dict[str, Any]] = {}
        for recipe, future in pending.items():
            try:
                accuracies[recipe] = future.result()
            except Exception as error:
                self._failed(recipe, error, steps_left=len(self._thread_counts))
        for artifact in group:
            recipe = str(artifact["recipe"])
            if recipe in accuracies:
                self._time_recipe(artifact, keys[recipe], accuracies[recipe])

    def _accuracy(self, artifact: Mapping[str, Any], threads: int) -> dict[str, Any]:
        recipe = Recipe.parse(str(artifact["recipe"]))
        scored = self._estimate.scored_examples
        largest = max(1, min(self._max_batch, scored))
        # Quantised variants: as queries run them, one at a time and in the largest batch (dynamic
        # INT8 scales activations per batch); the others do not depend on the batch.
        batches = sorted({1, largest}) if recipe.precision in QUANTISED else [largest]
        args: list[object] = [artifact["path"], self._valset, "--threads", threads, "--metric", self._metric]
        args += ["--accuracy-from", self._calibration, "--batches", ",".join(map(str, batches))]
        if self._answers is not None:
            args += ["--reference", self._answers]
        result: dict[str, Any] = run_step(
            "accuracy", *args, timeout_s=self._estimate.accuracy_s(len(batches), threads)
        )
        return result

    def _time_recipe(self, artifact: Mapping[str, Any], key: str, accuracy: Mapping[str, Any]) -> None:
        recipe = Recipe.parse(str(artifact["recipe"]))
        by_batch = {int(b): float(a) for b, a in (accuracy.get("accuracy_by_batch") or {}).items()}
        if len(by_batch) > 1:
            shown = "/".join(f"{by_batch[b]:.3f}" for b in sorted(by_batch))
            self._accuracy_notes.append(
                f"{recipe.name} {shown} at batch {'/'.join(map(str, sorted(by_batch)))}"
            )
        fetch_ms = self._fetch_ms(key)
        for index, threads in enumerate(self._thread_counts):
            try:
                timing = self._measure(
                    artifact, threads, self._max_batch, self._settings.profile_batch_budget_s
                )
            except Exception as error:
                self._failed(recipe.name, error, steps_left=len(self._thread_counts) - index)
                return
            if recipe.name == self._reference and threads == self._thread_counts[0]:
                # The registered model's measured speed sets the later steps' time limits.
                self._reference_p50_ms = float(timing["latency_p50_ms"]["1"])
                self._estimate.seconds_per_example = self._reference_p50_ms / 1000 * threads
            profiles = [
                variant_profile(self.model, recipe, key, placement, timing, accuracy, fetch_ms)
                for placement in self._placements
                if placement.threads == threads
            ]
            last = index == len(self._thread_counts) - 1
            self._publish(recipe, profiles, timing, accuracy, threads, last)

    def _measure(
        self, artifact: Mapping[str, Any], threads: int, max_batch: int, batch_budget_s: float
    ) -> dict[str, Any]:
        """One timing pass (``python -m variants measure``) of ``artifact``, up to ``max_batch``,
        with the settings' stopping rule and ``batch_budget_s`` per batch size."""
        settings = self._settings
        args: list[object] = [artifact["path"], self._valset, "--threads", threads]
        args += ["--max-runs", settings.profile_runs, "--min-runs", settings.profile_min_runs]
        args += ["--stability-pct", settings.profile_stability_pct]
        args += ["--batch-budget-s", batch_budget_s, "--max-batch", max_batch]
        args += ["--ceiling-ms", settings.profile_latency_ceiling_ms]
        timing: dict[str, Any] = run_step("measure", *args, timeout_s=self._estimate.timing_s(max_batch))
        return timing

    def _fetch_ms(self, key: str) -> float:
        """A cold load starts from the repository: time the fetch (the session's start-up is
        timed in the child)."""
        probe = self._tmp / "fetch-probe.onnx"
        started = time.perf_counter()
        self._repository.get_file(key, probe)
        fetch_ms = (time.perf_counter() - started) * 1000
        probe.unlink(missing_ok=True)
        return fetch_ms

    def _publish(
        self,
        recipe: Recipe,
        profiles: list[VariantProfile],
        timing: Mapping[str, Any],
        accuracy: Mapping[str, Any],
        threads: int,
        last: bool,
    ) -> None:
        registration = self.registration
        self.generated += profiles
        registration.done += 1
        if last:
            registration.variants[recipe.name] = VariantState.READY
        if recipe.precision == "fp32":
            # The registered model's own accuracy: what queries without a target are held to.
            known = self.model.reference_accuracy
            reference = max(known, accuracy["accuracy"]) if known is not None else accuracy["accuracy"]
            self.model = dataclasses.replace(self.model, reference_accuracy=reference)
        self.model = dataclasses.replace(self.model, ready=True)
        if registration.first_servable_at is None:
            registration.first_servable_at = time.time()
        registration.variant_ids = sorted(v.variant_id for v in self.generated)
        registration.eta_s = self._eta()
        registration.message = (
            f"profiled {recipe.name} at {threads} thread(s): p50 {timing['latency_p50_ms']['1']:.3f} ms "
            f"(+-{timing['p50_ci_pct']:.1f} %, {timing['profile_runs']} runs), accuracy "
            f"{accuracy['accuracy']:.4f} [{accuracy['accuracy_low']:.4f}, "
            f"{accuracy['accuracy_high']:.4f}]; servable"
        )
        self._store.add_variants(self.model, profiles, registration)

    def _failed(self, recipe: str, error: BaseException, steps_left: int) -> None:
        """A step of ``recipe`` failed: the recipe is marked failed and the others go on, unless
        it is the registered model's own (then the registration fails)."""
        if recipe == self._reference:
            raise error
        logger.warning("variant step failed", extra={"recipe": recipe, "error": str(error)})
        self.registration.variants[recipe] = VariantState.FAILED
        self.registration.done += steps_left
        self._notes.append(f"{recipe} failed: {first_line(error)}")
        self.registration.eta_s = self._eta()
        self._save(f"{recipe} failed; the other variants go on")

    def _eta(self) -> float:
        """Seconds until every profile is done, at the pace profiles have finished so far (the
        wall time they took, their parallel accuracy passes included)."""
        registration = self.registration
        if registration.done <= 0:
            return 0.0
        per_profile = (time.monotonic() - self._started) / registration.done
        return round(per_profile * max(0, registration.total - registration.done), 1)

    def _set_state(self, recipe: str, state: str) -> None:
        self.registration.variants[recipe] = state

    def _save(self, message: str) -> None:
        self.registration.message = message
        self._store.put_registration(self.registration)

    def _finish(self) -> None:
        """Prune, unpublish what was pruned, and mark the registration ready (atomically)."""
        registration = self.registration
        if not self.generated:
            raise RuntimeError("no variant could be profiled: " + "; ".join(self._notes))
        pruning = prune_variants(self.generated)
        kept_recipes = {f"{v.precision}_{v.opt_level}" for v in pruning.kept}
        for recipe, state in registration.variants.items():
            if recipe in kept_recipes:
                registration.variants[recipe] = VariantState.READY  # (some of a failed one's too)
            elif state == VariantState.READY:
                registration.variants[recipe] = VariantState.PRUNED
        registration.prune_reasons = dict(sorted({**pruning.reasons, **self._screened}.items()))
        registration.status = RegistrationStatus.READY
        registration.finished_at = time.time()
        registration.eta_s = 0.0
        registration.variant_ids = sorted(v.variant_id for v in pruning.kept)
        registration.pruned = len(pruning.pruned) + len(self._screened)
        message = (
            f"{len(self.generated) + len(self._screened)} variants generated, {len(self.generated)} "
            f"profiled; {len(pruning.pruned)} pruned as dominated (slower, costlier and no more accurate "
            f"than another of their pool)"
        )
        if self._screened:
            message += f", {len(self._screened)} screened out (a slower level of their precision at batch 1)"
        message += f"; {len(pruning.kept)} kept"
        if self._accuracy_notes:
            message += "; quantised accuracy, lower recorded: " + ", ".join(self._accuracy_notes)
        if self._notes:
            message += "; " + "; ".join(self._notes)
        registration.message = message
        self._store.remove_variants(self.model.app_id, [v.variant_id for v in pruning.pruned], registration)


def run_step(command: str, *args: object, timeout_s: float) -> Any:
    """Run one ``python -m variants`` step in a child process and return its JSON answer."""
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "variants", command, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        raise RuntimeError(f"variant {command} step ran past its limit of {timeout_s:.0f} s") from expired
    if completed.returncode != 0:
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"variant {command} step failed: {last}")
    return json.loads(completed.stdout.strip().splitlines()[-1])
