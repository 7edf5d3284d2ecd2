"""What the API's routers depend on, built once per process (per Lambda container)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from modelless.auth import ApiKeys
from modelless.cache import open_cached_predictions
from modelless.catalog import DEFAULT_POOLS, PoolSpec
from modelless.config import Settings, get_settings
from modelless.dispatch import Dispatcher
from modelless.feedback.factory import feedback_store_for
from modelless.feedback.service import FeedbackService
from modelless.metadata import MetadataStore, open_metadata_store
from modelless.offline.service import OfflineService
from modelless.pipelines.factory import pipeline_store_for
from modelless.pipelines.service import PipelineService
from modelless.pools.invokers import AwsLambdaInvoker, HttpWorkerInvoker, LambdaInvoker
from modelless.registration.service import LambdaRegistrationLauncher, RegistrationService
from modelless.repository import ModelRepository, open_repository
from modelless.selection import InfaasPolicy
from modelless.types import WorkerState


@dataclass
class Services:
    settings: Settings
    store: MetadataStore
    repository: ModelRepository
    dispatcher: Dispatcher
    registrar: RegistrationService
    pools: Mapping[str, PoolSpec]
    offline: OfflineService | None = None  # offline jobs (docs/ARCHITECTURE.md §6)
    keys: ApiKeys = field(init=False)  # callers' API keys, looked up in the store
    feedback: FeedbackService = field(init=False)  # apps' selection policies, and their feedback
    pipelines: PipelineService = field(init=False)  # apps' pipelines of models (InferLine)

    def __post_init__(self) -> None:
        self.keys = ApiKeys(self.store, self.settings.stale_cache_max_age_s, self.settings.metadata_epoch)
        self.feedback = FeedbackService(feedback_store_for(self.store), self.dispatcher)
        self.pipelines = PipelineService(
            pipeline_store_for(self.store), self.store, self.dispatcher, self.settings.max_batch, self.pools
        )

    def close(self) -> None:
        self.feedback.close()
        self.pipelines.close()
        if self.offline is not None:
            self.offline.close()
        self.registrar.close()
        if self.dispatcher.cache is not None:
            self.dispatcher.cache.predictions.close()
        self.store.close()


def build_services(
    settings: Settings | None = None,
    store: MetadataStore | None = None,
    lambda_tier: LambdaInvoker | None = None,
    extra_workers: Callable[[], list[WorkerState]] | None = None,
    pools: Mapping[str, PoolSpec] = DEFAULT_POOLS,
) -> Services:
    settings = settings or get_settings()
    store = store or open_metadata_store(settings.metadata_url)
    repository = open_repository(settings.repository_url)
    if lambda_tier is None and settings.lambda_function:
        lambda_tier = AwsLambdaInvoker(settings.lambda_function)
    dispatcher = Dispatcher(
        store,
        InfaasPolicy(pools, settings.accuracy_tolerance),
        HttpWorkerInvoker(),
        lambda_tier,
        cache_ttl_s=settings.profile_cache_ttl_s,
        extra_workers=extra_workers,
        stale_max_age_s=settings.stale_cache_max_age_s,
        # One cache for online queries and this process's offline runners (child-process runners
        # open the same one: Redis, from the same settings).
        predictions=open_cached_predictions(settings),
    )
    # In AWS the registrar function generates and profiles variants; else a thread of this process.
    launcher = (
        LambdaRegistrationLauncher(settings.registrar_function) if settings.registrar_function else None
    )
    registrar = RegistrationService(store, repository, settings, pools, launcher)
    # Offline jobs see the workers as selection does (this dispatcher's recent loads included).
    offline = OfflineService.from_settings(
        settings,
        store,
        pools,
        dispatcher.live_view.live_workers,
        predictions=None if dispatcher.cache is None else dispatcher.cache.predictions,
    )
    return Services(settings, store, repository, dispatcher, registrar, pools, offline)
