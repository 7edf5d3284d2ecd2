"""Every reason an offline job request cannot run, refused (a 4xx error) before the job exists.

A path that is not ``s3://bucket/prefix``, a bucket the app may not use, an output prefix inside
the input prefix (the results would become inputs and re-trigger the job) or overlapping a
watched prefix, a bucket that does not exist or that the service's credentials may not read
(S3's 403), a model or accuracy no provisioned variant serves (for a pipeline job: any of its
stages), no inputs at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from modelless.catalog import PoolSpec
from modelless.exceptions import (
    ForbiddenError,
    InvalidJobError,
    ModellessError,
    NotFoundError,
    S3AccessDeniedError,
)
from modelless.metadata.base import MetadataStore
from modelless.offline.compute import explain_no_candidates, offline_candidates
from modelless.offline.jobs import JobSpec, S3Path, Watch, is_input
from modelless.offline.objects import ObjectStore
from modelless.pipelines.store import PipelineStore
from modelless.validation import check_name, check_targets


@dataclass(frozen=True)
class JobValidator:
    """The checks of one service's job requests. ``objects`` and ``pipelines`` are asked for
    only when a check needs them, so that a request refused early builds no S3 client."""

    store: MetadataStore
    pools: Mapping[str, PoolSpec]
    default_buckets: Sequence[str]  # the buckets an app without a list of its own may use
    watches: Sequence[Watch]
    objects: Callable[[], ObjectStore]
    pipelines: Callable[[], PipelineStore]

    def allowed_buckets(self, app_id: str) -> list[str]:
        own = self.store.offline_buckets(app_id)
        return own if own is not None else list(self.default_buckets)

    def validate(self, spec: JobSpec, require_inputs: bool = True) -> tuple[S3Path, S3Path]:
        """Every reason the job cannot run, as a 4xx error, before anything is written
        (``require_inputs=False``: a watch, whose inputs arrive later). Returns its paths."""
        if not self.store.app_exists(spec.app_id):
            raise NotFoundError(f"no app {spec.app_id!r}", app=spec.app_id)
        check_targets(None, spec.min_accuracy)
        if spec.model_name is not None:
            check_name("modelName", spec.model_name)
        inputs = S3Path.parse(spec.input_path, "inputPath")
        outputs = S3Path.parse(spec.output_path, "outputPath")
        self._check_buckets_allowed(spec.app_id, inputs, outputs)
        self._check_outputs_apart(inputs, outputs)
        self._check_buckets_exist(inputs, outputs)
        if spec.pipeline is not None:
            self._check_pipeline(spec)
        elif not offline_candidates(self.store, self.pools, spec.app_id, spec.min_accuracy, spec.model_name):
            raise explain_no_candidates(self.store, spec.app_id, spec.min_accuracy, spec.model_name)
        if require_inputs:
            self._check_has_inputs(inputs)
        return inputs, outputs

    def _check_buckets_allowed(self, app_id: str, inputs: S3Path, outputs: S3Path) -> None:
        allowed = self.allowed_buckets(app_id)
        for what, path in (("inputPath", inputs), ("outputPath", outputs)):
            if path.bucket not in allowed:
                raise ForbiddenError(
                    f"{what} {path}: app {app_id!r} may not use bucket {path.bucket!r} for offline "
                    f"jobs (allowed: {', '.join(allowed) or 'none'}; an admin allows buckets with "
                    f"`modelless allow-buckets {app_id} BUCKET…`)",
                    bucket=path.bucket,
                    allowed=allowed,
                )

    def _check_outputs_apart(self, inputs: S3Path, outputs: S3Path) -> None:
        """Results written where inputs are read (or where a watch looks) would start jobs."""
        if inputs.covers(outputs):
            raise InvalidJobError(
                f"outputPath {outputs} lies inside inputPath {inputs}: the job's results would become "
                "its own inputs (and start it again); choose an output prefix outside the input prefix",
                inputPath=str(inputs),
                outputPath=str(outputs),
            )
        for watch in self.watches:
            if watch.prefix.covers(outputs) or (
                outputs.bucket == watch.prefix.bucket and watch.prefix.prefix.startswith(outputs.prefix)
            ):
                raise InvalidJobError(
                    f"outputPath {outputs} overlaps the watched prefix {watch.prefix}: every result "
                    "would start a new job; choose an output prefix outside it",
                    outputPath=str(outputs),
                )

    def _check_buckets_exist(self, inputs: S3Path, outputs: S3Path) -> None:
        for what, path in (("inputPath", inputs), ("outputPath", outputs)):
            try:
                exists = self.objects().bucket_exists(path.bucket)
            except S3AccessDeniedError as error:
                error.message = f"{what} {path}: {error.message}"
                raise
            if not exists:
                raise NotFoundError(
                    f"{what} {path}: bucket {path.bucket!r} does not exist", bucket=path.bucket
                )

    def _check_pipeline(self, spec: JobSpec) -> None:
        """A pipeline job: the app has the pipeline, and every stage has a variant an offline job
        may use (its model's, on a provisioned pool, at the stricter of the job's and the stage's
        accuracy floors)."""
        assert spec.pipeline is not None
        check_name("pipeline", spec.pipeline)
        if spec.model_name is not None:
            raise InvalidJobError(
                "give a modelName or a pipeline, not both: a pipeline names its stages' models",
                modelName=spec.model_name,
                pipeline=spec.pipeline,
            )
        pipeline = self.pipelines().get(spec.app_id, spec.pipeline)
        if pipeline is None:
            raise NotFoundError(
                f"app {spec.app_id!r} has no pipeline named {spec.pipeline!r}", pipeline=spec.pipeline
            )
        for stage in pipeline.stages:
            floor = max(spec.min_accuracy, pipeline.accuracy if stage.accuracy is None else stage.accuracy)
            if not offline_candidates(self.store, self.pools, spec.app_id, floor, stage.model):
                error = explain_no_candidates(self.store, spec.app_id, floor, stage.model)
                if isinstance(error, ModellessError):
                    error.within(f"pipeline {pipeline.name!r}, stage {stage.name!r}", stage=stage.name)
                raise error

    def _check_has_inputs(self, inputs: S3Path) -> None:
        # A few keys are enough to know there is an input (folder markers and manifests are not).
        listed = [i for i in self.objects().list_objects(inputs.bucket, inputs.prefix, 16) if is_input(i.key)]
        if not listed:
            raise InvalidJobError(f"inputPath {inputs}: no objects under it", inputPath=str(inputs))
