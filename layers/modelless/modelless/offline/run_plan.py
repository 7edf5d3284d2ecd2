"""What a run of an offline job works on: the job's fixed input list and the variants that run it,
both recorded on the job at its first run, so that a resume works on the same inputs and every
result comes from the same variants.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from modelless.exceptions import ModellessError, NotFoundError
from modelless.metadata.base import OfflineJobStore
from modelless.offline.compute import Compute, batch_rows
from modelless.offline.jobs import S3Path, is_input, is_watch_source
from modelless.offline.objects import ObjectStore
from modelless.offline.run_state import RunnerConfig, Stage
from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.store import PipelineStore
from modelless.types import ModelRecord, OfflineJob, VariantProfile


@dataclass
class RunPlan:
    """The inputs and the variant (a pipeline job: the entry stage's, and the DAG's stages)."""

    items: list[str]
    variant: VariantProfile
    model: ModelRecord
    pipeline: PipelineSpec | None = None
    stages: dict[str, Stage] = field(default_factory=dict)


class RunPlanner:
    def __init__(
        self,
        store: OfflineJobStore,
        objects: ObjectStore,
        compute: Compute,
        config: RunnerConfig,
        variants: Callable[[str], list[VariantProfile]],
        models: Callable[[str, str], ModelRecord | None],
        pipelines: PipelineStore | None,
    ) -> None:
        self._store = store
        self._objects = objects
        self._compute = compute
        self._config = config
        self._variants = variants
        self._models = models
        self._pipelines = pipelines

    def plan(self, job: OfflineJob, input_path: S3Path) -> RunPlan:
        """The run's inputs and variants, recorded on ``job`` when it first runs. Raises a
        ModellessError when the job cannot run (too many inputs, a variant or model gone)."""
        items = self.inputs(job, input_path)
        pipeline, stages = self.pipeline_stages(job)
        if pipeline is None:
            variant = self.variant(job)
            return RunPlan(items, variant, self.model_of(job, variant))
        entry = stages[pipeline.entry]
        return RunPlan(items, entry.variant, entry.model, pipeline, stages)

    def inputs(self, job: OfflineJob, input_path: S3Path) -> list[str]:
        """The job's inputs: as recorded when it first ran (or, for a watch's job, as its events
        added them), or listed and recorded now."""
        items = self._store.job_items(job.job_id)
        if items or job.total or is_watch_source(job.source):
            job.total = len(items)
            return items
        listed = self._objects.list_objects(input_path.bucket, input_path.prefix, self._config.max_inputs + 1)
        if len(listed) > self._config.max_inputs:
            raise ModellessError(
                f"more than {self._config.max_inputs} objects under {input_path}: split the job"
            )
        items = self._store.fix_job_items(job.job_id, [info.key for info in listed if is_input(info.key)])
        job.total = len(items)
        return items

    def variant(self, job: OfflineJob) -> VariantProfile:
        """The job's variant: pinned at its first run, so that every result comes from it."""
        if job.variant_id is not None:
            return self._pinned(job, job.variant_id, "the job's variant")
        variant = self._compute.choose_variant(job)
        job.variant_id = variant.variant_id
        job.batch = batch_rows(variant, self._config.max_rows, self._config.run_ms)
        return variant

    def _pinned(self, job: OfflineJob, variant_id: str, what: str) -> VariantProfile:
        found = next((v for v in self._variants(job.app_id) if v.variant_id == variant_id), None)
        if found is None:
            raise NotFoundError(f"{what} {variant_id} no longer exists")
        return found

    def model_of(self, job: OfflineJob, variant: VariantProfile) -> ModelRecord:
        model = self._models(job.app_id, variant.model_name)
        if model is None:
            raise NotFoundError(f"model {variant.model_name!r} of app {job.app_id!r} no longer exists")
        return model

    def pipeline_stages(self, job: OfflineJob) -> tuple[PipelineSpec | None, dict[str, Stage]]:
        """A pipeline job's DAG and its stages' variants, each chosen as a one-model job's would
        be (its model, the stricter of the job's and the stage's accuracy floors) and pinned at
        the first run, so that every result comes from the same variants."""
        if job.pipeline is None:
            return None, {}
        spec = None if self._pipelines is None else self._pipelines.get(job.app_id, job.pipeline)
        if spec is None:
            raise NotFoundError(f"pipeline {job.pipeline!r} of app {job.app_id!r} no longer exists")
        stages: dict[str, Stage] = {}
        for stage in spec.stages:
            pinned = job.stage_variants.get(stage.name)
            if pinned is not None:
                variant = self._pinned(job, pinned, f"stage {stage.name!r}'s variant")
            else:
                floor = max(job.min_accuracy, spec.accuracy if stage.accuracy is None else stage.accuracy)
                try:
                    variant = self._compute.choose_variant(
                        replace(job, model_name=stage.model, min_accuracy=floor)
                    )
                except ModellessError as error:
                    error.within(f"pipeline {spec.name!r}, stage {stage.name!r}", stage=stage.name)
                    raise
            stages[stage.name] = Stage(variant, self.model_of(job, variant))
        job.stage_variants = {name: stage.variant.variant_id for name, stage in stages.items()}
        entry = stages[spec.entry].variant
        job.variant_id = entry.variant_id
        job.batch = batch_rows(entry, self._config.max_rows, self._config.run_ms)
        return spec, stages
