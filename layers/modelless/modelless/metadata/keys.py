"""Every Redis key name the project uses, in one place."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class KeySpace:
    prefix: str = "modelless:"

    def app(self, app_id: str) -> str:
        return f"{self.prefix}app:{app_id}"

    def api_key(self, key_hash: str) -> str:
        return f"{self.prefix}apikey:{key_hash}"

    def model(self, app_id: str, model_name: str) -> str:
        return f"{self.prefix}model:{app_id}:{model_name}"

    def models(self, app_id: str) -> str:
        return f"{self.prefix}models:{app_id}"

    def registration(self, registration_id: str) -> str:
        return f"{self.prefix}registration:{registration_id}"

    def variants(self, app_id: str) -> str:
        """Hash: variant id -> profile JSON, for every variant of the app."""
        return f"{self.prefix}variants:{app_id}"

    def accuracy_index(self, app_id: str, model_name: str | None = None) -> str:
        """Sorted set: variant id scored by accuracy, per app and per model."""
        suffix = f":{model_name}" if model_name else ""
        return f"{self.prefix}idx:accuracy:{app_id}{suffix}"

    def latency_index(self, app_id: str) -> str:
        """Sorted set: variant id scored by batch-1 p99 latency."""
        return f"{self.prefix}idx:latency:{app_id}"

    def profiles_version(self, app_id: str) -> str:
        """Counter bumped with every change to the app's profiles (gateway cache revalidation)."""
        return f"{self.prefix}profiles-version:{app_id}"

    def load(self, second: int) -> str:
        """Hash: group key -> queries counted in that epoch second (expires on its own)."""
        return f"{self.prefix}load:{second}"

    def load_peaks(self, second: int) -> str:
        """Hash: group key -> its peak queries in one slice of that epoch second (expires)."""
        return f"{self.prefix}load-peak:{second}"

    def workers(self) -> str:
        """Hash: worker id -> its last state report (JSON)."""
        return f"{self.prefix}workers"

    def epoch(self) -> str:
        """String: the marker an embedded stack writes once into a new store; a store without it
        was emptied since (``MetadataStore.epoch``)."""
        return f"{self.prefix}epoch"

    def scaler_lease(self) -> str:
        """String with a TTL: the scheduled scaler invocation that ticks now (one at a time)."""
        return f"{self.prefix}scaler-lease"

    def scaling_plan(self) -> str:
        """String: the plan the scaler applied last (JSON, ``ScalingReport.published``)."""
        return f"{self.prefix}scaling-plan"

    # --- offline jobs (docs/ARCHITECTURE.md §6) ------------------------------------------------
    def offline_buckets(self, app_id: str) -> str:
        """JSON list: the S3 buckets the app's offline jobs may read and write."""
        return f"{self.prefix}offline-buckets:{app_id}"

    def job(self, job_id: str) -> str:
        """String: the job's record (JSON)."""
        return f"{self.prefix}job:{job_id}"

    def app_jobs(self, app_id: str) -> str:
        """Sorted set: the app's job ids scored by creation time."""
        return f"{self.prefix}jobs:{app_id}"

    def unfinished_jobs(self) -> str:
        """Set: ids of jobs not completed or failed (what a restart resumes)."""
        return f"{self.prefix}jobs-unfinished"

    def job_items(self, job_id: str) -> str:
        """List: the input keys of the job, fixed when it first ran."""
        return f"{self.prefix}job-items:{job_id}"

    def job_item_set(self, job_id: str) -> str:
        """Set: the same input keys, for membership (a watch's job adds inputs one event at a time)."""
        return f"{self.prefix}job-item-set:{job_id}"

    def job_done(self, job_id: str) -> str:
        """Hash: input key -> its output key ('' for an input that failed): the done markers."""
        return f"{self.prefix}job-done:{job_id}"

    def job_errors(self, job_id: str) -> str:
        """Hash: input key -> why it failed (decode error, wrong shape)."""
        return f"{self.prefix}job-errors:{job_id}"

    def job_lease(self, job_id: str) -> str:
        """String with a TTL: the id of the runner that holds the job."""
        return f"{self.prefix}job-lease:{job_id}"

    def request_key(self, app_id: str, operation: str, key: str) -> str:
        """String with a TTL: an app's Idempotency-Key for one operation (register_model,
        offline_query) and what it did (``IdempotentRequest``). The caller's key is hashed: any
        text a client chose, kept to one short, safe name."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return f"{self.prefix}request-key:{app_id}:{operation}:{digest}"

    def idempotency(self, name: str) -> str:
        """Prefix of Powertools' idempotency records for one handler."""
        return f"{self.prefix}idempotency:{name}"

    # --- the prediction cache (modelless.cache.redis) -----------------------------------------
    def prediction(self, entry: str) -> str:
        """String: one cached row's outputs (``modelless.cache.base.entry_key`` names ``entry``)."""
        return f"{self.prefix}prediction:{entry}"

    def prediction_lru(self) -> str:
        """Sorted set: cached entry keys scored by their last use (``prediction_clock``)."""
        return f"{self.prefix}prediction-lru"

    def prediction_clock(self) -> str:
        """Counter: the prediction cache's logical clock, one tick per use (no wall clock to skew)."""
        return f"{self.prefix}prediction-clock"

    def prediction_stats(self) -> str:
        """Hash: the prediction cache's counters (bytes held, hits, misses, evictions)."""
        return f"{self.prefix}prediction-stats"

    def pattern(self) -> str:
        return f"{self.prefix}*"

    # --- feedback and selection from it (modelless.feedback.redis) ------------------------------
    def feedback_selection(self, app_id: str) -> str:
        """String: the app's selection policy (infaas, exp3, exp4); absent: infaas."""
        return f"{self.prefix}feedback-selection:{app_id}"

    def feedback_weights(self, app_id: str, policy: str) -> str:
        """Hash: model -> its log-weight under one bandit policy of the app."""
        return f"{self.prefix}feedback-weights:{app_id}:{policy}"

    def feedback_query(self, app_id: str, query_id: str) -> str:
        """String with a TTL: what each model answered to one query (``QueryRecord``)."""
        return f"{self.prefix}feedback-query:{app_id}:{query_id}"

    def feedback_given(self, app_id: str, query_id: str) -> str:
        """String with a TTL: the feedback given for one query (the first; repeats compare to it)."""
        return f"{self.prefix}feedback-given:{app_id}:{query_id}"

    def feedback_outcomes(self, app_id: str) -> str:
        """Hash: '<model>:count' and '<model>:reward' -> the model's feedbacks and their sum."""
        return f"{self.prefix}feedback-outcomes:{app_id}"

    def feedback_recent(self, app_id: str, model_name: str) -> str:
        """List: the model's recent rewards, newest first, capped."""
        return f"{self.prefix}feedback-recent:{app_id}:{model_name}"

    # --- pipelines (modelless.pipelines.redis) ------------------------------------------------
    def pipelines(self, app_id: str) -> str:
        """Hash: pipeline name -> its spec's JSON."""
        return f"{self.prefix}pipelines:{app_id}"

    def pipeline_branches(self, app_id: str, pipeline: str) -> str:
        """Hash: '<edge>:seen' and '<edge>:taken' -> how often the edge's source ran, and how often
        the edge was then taken (its measured branch probability)."""
        return f"{self.prefix}pipeline-branches:{app_id}:{pipeline}"
