"""Per-query variant selection: INFaaS ``getVariant`` (§4.1), as a pluggable policy.

A policy is a pure function of the query's targets, the candidate profiles and the workers'
live state: no I/O, so it is tested on hand-built profiles and timed on its own.

``Candidates`` is the candidate list with what a decision looks up precomputed once per batch
size (latency, cost, cold latency; the variants ordered by the inactive-variant key), so that a
decision costs a walk over the live instances and the head of one sorted list, not a pass over
every profile. The dispatcher keeps one per app and per target for as long as the profiles do
not change; a plain list works too (it is indexed on the spot, with the same answers).

The Lambda tier's cold starts: a query sent to the tier when no container is idle starts a new
one (a process start, then the variant's load: hundreds of ms locally, more in AWS). Where the
tier can say which containers are idle (``LambdaTierState``: the local tier can), selection
counts that start in the expected latency of a Lambda decision, and a query whose budget a cold
start would break prefers a worker's instance that meets it, then a warm idle container, and only
then a cold one. Where it cannot (AWS: nothing tells which execution environments are warm), the
tier is assumed warm, as INFaaS's profiled latencies assume; provisioned concurrency
(``LambdaTierProvisionedConcurrency`` in template.yaml) is what makes that assumption hold there.

Queries that name a model, or give no accuracy target, are held to the model as registered:
only variants whose accuracy is within a tolerance of the model's reference accuracy serve them
(``faithful``), so that a quantised variant whose accuracy collapsed never answers a query that
did not ask for a trade-off. Among equally fast and cheap variants, the one that agrees more
with the registered model (``agreement``) goes first.

What is queued on an Active instance counts too: a query sent there waits for the requests ahead
of it (the worker's report of its queue, or the gateway's own queries in flight when they are
more), run by run at the instance's batch size (``queue_wait_ms``). An instance whose profiled
latency meets the budget but whose queue would break it is skipped, which INFaaS's profiled p99s
alone would not see: at ~7 ms a query, seven queries ahead already break a 50 ms budget, before
the instance counts as saturated (at eight, or two of its batches: ``monitoring.saturated_queue``).

A worker that tunes its instances' parallelism (``modelless.tuning``) reports how each one's runs
compare with its profile (``InstanceStats.latency_scale``) and how many it runs at once: an
Active instance's latency, cost and queue wait are then the profile's scaled by that, and its
queue drains that many runs at a time (``tuned_scale``). The scale is applied on the walk over
the live instances only; the tables above hold the profiles as registered.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, overload

from modelless.catalog import PoolKind, PoolSpec
from modelless.exceptions import TargetsUnreachableError
from modelless.tuning.capacity import clamped_scale
from modelless.types import (
    Decision,
    InstanceState,
    InstanceStats,
    LambdaTierState,
    QueryTargets,
    Tier,
    VariantProfile,
    WorkerState,
)

# A deployment without a Lambda tier (a dispatcher given none): no container is ever idle and a
# new one never starts, so a decision there is expected never to answer. Any instance on a worker
# goes first, a queued one too (late); with nowhere else, the decision names the Lambda tier still,
# and the dispatcher fails it with a clear 503.
NO_LAMBDA_TIER = LambdaTierState(idle_by_memory={}, default_memory_mb=0, cold_start_ms=math.inf, full=True)


class SelectionPolicy(Protocol):
    def get_variant(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
        lambda_tier: LambdaTierState | None = None,
    ) -> Decision:
        """Choose a variant and where to run it, or raise TargetsUnreachableError. ``lambda_tier``:
        the Lambda tier's containers, when it can see them (else it is taken as warm)."""

    def warmup(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> Decision | None:
        """After a miss, the variant worth loading so that the next such query is served."""


class Scored(NamedTuple):
    """A candidate at one batch size: what the decision compares, computed once (a tuple:
    thousands are built when an app's profiles change)."""

    variant: VariantProfile
    latency_ms: float  # profiled p99 at the batch size
    cost: float  # cost per query at the batch size
    cold_ms: float  # load + inference latency: what a new instance takes

    @classmethod
    def of(cls, variant: VariantProfile, batch: int) -> Scored:
        latency = variant.latency_ms(batch)
        return cls(variant, latency, variant.cost_per_query(batch), variant.load_latency_ms + latency)


Keep = Callable[[VariantProfile], bool]


class BatchTable:
    """The candidates that can take a batch size: in the order of the inactive-variant key (load
    + inference latency, cost, id), and looked up by variant id (for the live instances).

    A subset's table shares its root's id lookup (a target's list then costs one list of
    references, not a dict) and answers only for the variants its ``keep`` admits."""

    __slots__ = ("_by_id", "_keep", "by_cold")

    def __init__(
        self, by_cold: list[Scored], by_id: dict[str, Scored] | None = None, keep: Keep | None = None
    ):
        self.by_cold = by_cold
        self._by_id = by_id if by_id is not None else {s.variant.variant_id: s for s in by_cold}
        self._keep = keep

    @classmethod
    def build(cls, variants: Iterable[VariantProfile], batch: int) -> BatchTable:
        scored = [Scored.of(v, batch) for v in variants if v.max_batch >= batch]
        # Stable: equal keys keep the candidates' order, as min() over them would. Equally quick
        # and cheap: the one closer to the registered model first.
        scored.sort(key=lambda s: (s.cold_ms, s.cost, -(s.variant.agreement or 0.0), s.variant.variant_id))
        return cls(scored)

    def narrowed(self, keep: Keep) -> BatchTable:
        """The table of the candidates ``keep`` admits (this table's must already admit them)."""
        return BatchTable([s for s in self.by_cold if keep(s.variant)], self._by_id, keep)

    def get(self, variant_id: str) -> Scored | None:
        scored = self._by_id.get(variant_id)
        if scored is None or (self._keep is not None and not self._keep(scored.variant)):
            return None
        return scored


# The registered precision: a model's reference accuracy is its FP32 artifact's.
REFERENCE_PRECISION = "fp32"


def accuracy_upper(variant: VariantProfile) -> float:
    """The top of the variant's accuracy interval (its point accuracy when it has none: a
    profile measured before intervals were, or imported without one)."""
    measured = variant.accuracy_examples > 0 and (variant.accuracy_low, variant.accuracy_high) != (0.0, 1.0)
    return variant.accuracy_high if measured else variant.accuracy


def reference_accuracies(variants: Iterable[VariantProfile]) -> dict[str, float]:
    """Per model, its reference accuracy: the registered FP32 artifact's, as measured on the
    validation set at registration (``ModelRecord.reference_accuracy``; the best of the model's
    FP32 profiles, which differ only by graph optimisation). A model without such a profile (hand
    made, imported) has none, and its variants are not held to one."""
    references: dict[str, float] = {}
    for v in variants:
        if v.precision == REFERENCE_PRECISION and v.accuracy_examples > 0 and not v.imported:
            references[v.model_name] = max(references.get(v.model_name, 0.0), v.accuracy)
    return references


def faithful(variant: VariantProfile, references: Mapping[str, float], tolerance: float) -> bool:
    """Whether ``variant`` may serve a query that named its model or gave no accuracy target:
    the top of its accuracy interval reaches its model's reference accuracy minus ``tolerance``."""
    reference = references.get(variant.model_name)
    return reference is None or accuracy_upper(variant) >= reference - tolerance


def holds_to_reference(min_accuracy: float, model_name: str | None) -> bool:
    """Queries that name a model, or give no accuracy target, are served within the tolerance."""
    return model_name is not None or min_accuracy <= 0


def _settings_tolerance() -> float:
    """The one setting read here: for lists cut with no tolerance given (the profile cache of
    ``modelless.dispatch``, the offline runner, a policy built without one); never otherwise."""
    from modelless.config import get_settings  # read once per candidate list, not per decision

    return float(get_settings().accuracy_tolerance)


class Candidates(Sequence[VariantProfile]):
    """An immutable candidate list with its per-batch tables, built lazily and kept.

    ``subset`` derives a narrower list (a target's accuracy and model) whose tables are cut from
    the root list's, already in order: a new target costs one pass, no sort, no profile lookups
    and one list of references per batch size. Variant ids are unique (they are the store's keys).

    ``accuracy_tolerance``: how far below its model's reference accuracy a variant may be and
    still serve queries that name the model or give no accuracy target (``faithful``); by default
    the one ``subset`` is given (a policy's), else ``Settings.accuracy_tolerance``."""

    __slots__ = ("_cut_for", "_keep", "_references", "_root", "_tables", "_tolerance", "_variants")

    def __init__(self, variants: Iterable[VariantProfile], accuracy_tolerance: float | None = None) -> None:
        self._variants = tuple(variants)
        self._tables: dict[int, BatchTable] = {}
        self._root: Candidates | None = None  # set on subsets: the list they are cut from
        self._keep: Keep | None = None  # on subsets: which of the root's variants they hold
        self._cut_for: tuple[float, str | None] | None = None  # on subsets: the targets they hold
        self._tolerance = accuracy_tolerance
        self._references: dict[str, float] | None = None

    @property
    def accuracy_tolerance(self) -> float:
        root = self._root or self
        if root._tolerance is None:
            root._tolerance = _settings_tolerance()
        return root._tolerance

    def references(self) -> Mapping[str, float]:
        """Each model's reference accuracy, from the root list (a subset may have left out the
        FP32 profiles it comes from)."""
        root = self._root or self
        if root._references is None:
            root._references = reference_accuracies(root._variants)
        return root._references

    def _tolerance_or(self, fallback: float | None) -> float:
        """The list's own tolerance, else ``fallback`` (not kept: callers may differ), else the
        settings' (kept)."""
        root = self._root or self
        if root._tolerance is None and fallback is not None:
            return fallback
        return self.accuracy_tolerance

    def subset(
        self, min_accuracy: float, model_name: str | None = None, *, accuracy_tolerance: float | None = None
    ) -> Candidates:
        """The candidates with accuracy >= ``min_accuracy`` (of ``model_name`` when given); for a
        named model or no accuracy target, only those within the tolerance of their model's
        reference accuracy (``faithful``): the list's own tolerance, else ``accuracy_tolerance``."""
        outer = self._keep
        held = holds_to_reference(min_accuracy, model_name)
        references = self.references() if held else {}
        tolerance = self._tolerance_or(accuracy_tolerance) if held and references else 0.0

        def keep(v: VariantProfile) -> bool:
            return (
                v.accuracy >= min_accuracy
                and (model_name is None or v.model_name == model_name)
                and (not held or faithful(v, references, tolerance))
                and (outer is None or outer(v))
            )

        narrower = Candidates(v for v in self._variants if keep(v))
        narrower._root = self._root or self
        narrower._keep = keep
        narrower._cut_for = (min_accuracy, model_name)
        return narrower

    def at_batch(self, batch: int) -> BatchTable:
        table = self._tables.get(batch)
        if table is None:
            # Concurrent builders compute the same table; the last one kept is as good.
            if self._root is not None and self._keep is not None:
                table = self._root.at_batch(batch).narrowed(self._keep)
            else:
                table = BatchTable.build(self._variants, batch)
            self._tables[batch] = table
        return table

    def __len__(self) -> int:
        return len(self._variants)

    @overload
    def __getitem__(self, index: int) -> VariantProfile: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[VariantProfile]: ...

    def __getitem__(self, index: int | slice) -> VariantProfile | Sequence[VariantProfile]:
        return self._variants[index]

    def __iter__(self) -> Iterator[VariantProfile]:
        return iter(self._variants)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Candidates):
            return self._variants == other._variants
        if isinstance(other, list | tuple):
            return list(self._variants) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Candidates({list(self._variants)!r})"


def queue_wait_ms(
    variant: VariantProfile, queued: int, batch_limit: int, latency_scale: float = 1.0, concurrency: int = 1
) -> float:
    """What a query sent to an instance of ``variant`` waits for the ``queued`` requests ahead of
    it: ceil(queued / b) runs of the profiled median latency at b, b the rows the instance's
    batcher takes per run (``InstanceStats.batch_limit``; 1 when it does not batch), within the
    variant's profiled batch sizes (the median of the next profiled size up). A tuned instance
    (``tuned_scale``) runs ``concurrency`` of those runs at once, each ``latency_scale`` times
    the profiled median."""
    if queued <= 0:
        return 0.0
    batch = min(max(1, batch_limit), variant.max_batch)
    rounds = math.ceil(math.ceil(queued / batch) / max(1, concurrency))
    return rounds * variant.median_ms(batch) * latency_scale


def tuned_scale(instance: InstanceStats) -> tuple[float, int]:
    """How an instance's runs compare with its profile's, as its worker's tuner measured them
    (``InstanceStats.latency_scale``, clamped as the scaler clamps it), and the runs it takes at
    once: (1.0, 1), the profile as registered, until a scale is measured."""
    if instance.latency_scale <= 0:
        return 1.0, 1
    return clamped_scale(instance.latency_scale), max(1, instance.concurrency)


def as_candidates(candidates: Sequence[VariantProfile]) -> Candidates:
    return candidates if isinstance(candidates, Candidates) else Candidates(candidates)


def for_targets(
    candidates: Sequence[VariantProfile], targets: QueryTargets, accuracy_tolerance: float | None = None
) -> Candidates:
    """The candidates that meet the targets' accuracy and model (``Candidates.subset``, held to
    ``accuracy_tolerance`` where the list has no tolerance of its own); a list already cut for
    these targets (the dispatcher's cached one) as it is."""
    indexed = as_candidates(candidates)
    if indexed._cut_for == (targets.min_accuracy, targets.model_name):
        return indexed
    return indexed.subset(targets.min_accuracy, targets.model_name, accuracy_tolerance=accuracy_tolerance)


class _Late(NamedTuple):
    """An instance that meets the targets but not the budget now (queued past it, or Overloaded):
    the answer, late, if nothing else can be. The quicker goes first, then the lower worker id."""

    expected_ms: float
    worker_id: str
    scored: Scored
    worker: WorkerState


def _quicker(late: _Late, than: _Late | None) -> bool:
    """Whether ``late`` goes before ``than`` (on (expected, worker id): the first found on a tie)."""
    return than is None or late[:2] < than[:2]


# How instances meeting the budget rank, the lowest first (``InfaasPolicy._consider_instance``).
_InstanceKey = tuple[bool, float, float, int, float, float, str]
# A live instance's latency and cost as measured (``_as_tuned``), its scale and concurrent runs.
_Tuned = tuple[float, float, float, int]


@dataclass(slots=True)
class _LiveWalk:
    """What one decision's walk over the live instances found: the best instance that meets the
    budget (by ``_InstanceKey``); aside, the quickest queued past it and the quickest Overloaded."""

    best: Scored | None = None
    best_worker: WorkerState | None = None
    best_key: _InstanceKey | None = None
    best_expected: float = 0.0
    queued: _Late | None = None
    overloaded: _Late | None = None


class InfaasPolicy:
    """Active instances first (cheapest, then least-loaded worker) whose profiled latency and the
    wait for their queue meet the budget; else the inactive variant with the lowest load +
    inference latency, on the least-utilised worker of its pool or, when no worker has room, on
    the Lambda tier; else, late, the instance whose queue delays it least. Overloaded and
    Interfered instances are skipped, but for this: where nothing meets the budget and nothing
    new can start (no placement, or a Lambda tier at its concurrency limit), an Overloaded
    instance on a worker is the late answer; while a container can start, a burst spills to it.

    Given the Lambda tier's state, a cold start counts: in the expected latency of a decision
    that needs one (ranking the inactive variants), and, for a query whose budget a cold start
    would break, a warm Lambda container ranks after a worker's instance that meets the budget
    (a concurrent query may take the idle container first, leaving this one a cold start; an
    instance on a worker never starts cold). The tier's busy containers are not a queue: an
    Active instance there has an idle container holding it.

    ``accuracy_tolerance`` (``faithful``) for lists without their own: ``Settings.accuracy_tolerance``
    from callers that hold settings (the policy reads nothing else); None: the process's settings."""

    def __init__(self, pools: Mapping[str, PoolSpec], accuracy_tolerance: float | None = None) -> None:
        self._pools = pools
        self._tolerance = accuracy_tolerance

    def get_variant(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
        lambda_tier: LambdaTierState | None = None,
    ) -> Decision:
        budget = _budget(targets)
        # The candidates: those that meet the targets' accuracy and model and take the batch.
        table = for_targets(candidates, targets, self._tolerance).at_batch(targets.batch)
        walk = self._walk_live_instances(targets, table, workers, lambda_tier, budget)
        if walk.best is not None and walk.best_worker is not None:
            return self._active(
                walk.best,
                walk.best_worker,
                walk.best_expected,
                f"cheapest active variant meeting accuracy>={targets.min_accuracy:g} and "
                f"latency<={budget:g} ms, queue included; least-loaded worker running it",
            )
        chosen = self._quickest_new_instance(targets, table, workers, lambda_tier, budget)
        late = _late_answer(walk, chosen, lambda_tier, budget)
        if late is not None:
            # Nothing meets the budget now: every instance that meets the targets is queued past
            # it (or, when nothing new can start, Overloaded), and a new one would answer later
            # still: the quickest of them, late (a queue is a transient: a refusal would name a
            # variant that meets the targets once its queue has drained).
            return self._active(
                late.scored,
                late.worker,
                late.expected_ms,
                f"no variant meeting accuracy>={targets.min_accuracy:g} and latency<={budget:g} ms "
                f"answers within the budget now (queued past it, overloaded or cold): the quickest, late",
            )
        if chosen is not None:
            return chosen
        raise unreachable_error(targets, candidates)

    def _walk_live_instances(
        self,
        targets: QueryTargets,
        table: BatchTable,
        workers: Sequence[WorkerState],
        lambda_tier: LambdaTierState | None,
        budget: float,
    ) -> _LiveWalk:
        """Active: variants with a healthy loaded instance whose profiled latency, after the wait
        for what is queued on it, meets the budget; the cheapest, then the faster, then the
        shorter queue, then the least-utilised worker (first found on a tie). A warm Lambda
        container goes after the workers' instances when a cold start (should another query take
        the container first) would break the budget. The quickest instance that meets the budget
        only when idle is kept aside: the answer, late, if nothing else can be."""
        walk = _LiveWalk()
        lookup = table.get
        min_accuracy, model_name = targets.min_accuracy, targets.model_name
        for worker in workers:
            on_lambda = self._is_lambda(worker.pool)
            for instance in worker.instances:
                state = instance.state
                if state is not InstanceState.ACTIVE and (state is not InstanceState.OVERLOADED or on_lambda):
                    continue
                scored = lookup(instance.variant_id)
                if scored is None:
                    continue
                # Filtered inline (no call per instance): this loop is the cost of a decision.
                tuned = (
                    _as_tuned(scored, instance)
                    if instance.latency_scale > 0
                    else (scored.latency_ms, scored.cost, 1.0, 1)
                )
                variant = scored.variant
                if (  # its queue aside
                    tuned[0] <= budget
                    and variant.accuracy >= min_accuracy
                    and (model_name is None or variant.model_name == model_name)
                ):
                    self._consider_instance(
                        walk, targets, budget, lambda_tier, worker, on_lambda, instance, scored, tuned
                    )
        return walk

    def _consider_instance(
        self,
        walk: _LiveWalk,
        targets: QueryTargets,
        budget: float,
        lambda_tier: LambdaTierState | None,
        worker: WorkerState,
        on_lambda: bool,
        instance: InstanceStats,
        scored: Scored,
        tuned: _Tuned,
    ) -> None:
        """Rank a live instance that meets the targets, its queue aside: into ``walk``'s best when
        its queue meets the budget too; aside, a late answer, when its queue or overload breaks it."""
        latency, cost, scale, concurrency = tuned
        queued = instance.queue_length
        expected = latency
        # The Lambda tier's queue is its busy containers: an Active instance there has an idle
        # container holding it, and busy ones delay it no more than another worker's queue
        # delays a worker's instance.
        if queued > 0 and not on_lambda:
            expected += queue_wait_ms(scored.variant, queued, instance.batch_limit, scale, concurrency)
        if instance.state is InstanceState.OVERLOADED:
            # Skipped (INFaaS), unless nothing meets the budget and nothing new can start
            # (``_late_answer``): then its queue is the quickest way to an answer.
            late = _Late(expected, worker.worker_id, scored, worker)
            if _quicker(late, walk.overloaded):
                walk.overloaded = late
            return
        if not expected <= budget:  # its queue (its profiled latency meets the budget)
            late = _Late(expected, worker.worker_id, scored, worker)
            if _quicker(late, walk.queued):
                walk.queued = late
            return
        if on_lambda and not self._is_lambda(scored.variant.pool):
            # A worker variant spilled to the Lambda tier runs at Lambda's price there.
            cost = self._lambda_cost(scored.variant, targets.batch)
        # Among equal instances, the shortest queue (the gateway lays its own queries in flight
        # over the reports), then the least-utilised worker.
        cold_risk = (
            on_lambda and lambda_tier is not None and budget < lambda_tier.cold_start_ms + scored.cold_ms
        )
        agreement = -(scored.variant.agreement or 0.0)  # equal otherwise: closer to the original
        key = (cold_risk, cost, latency, queued, agreement, worker.utilisation, worker.worker_id)
        if walk.best_key is None or key < walk.best_key:
            walk.best, walk.best_worker, walk.best_key, walk.best_expected = scored, worker, key, expected

    def _quickest_new_instance(
        self,
        targets: QueryTargets,
        table: BatchTable,
        workers: Sequence[WorkerState],
        lambda_tier: LambdaTierState | None,
        budget: float,
    ) -> Decision | None:
        """Inactive (or only Overloaded/Interfered): a new instance must be loaded first, so the
        load latency counts against the budget. The table is in the order of the key (load +
        inference latency, cost, id): without cold starts to count, the first eligible one within
        budget is the min. A Lambda placement with no idle container adds the tier's cold start:
        the search goes on while a later variant could still be quicker (its load + inference
        under the best expected latency so far). A variant whose load + inference meets the budget
        is still served when only a cold start breaks it: the quickest of them, late (a cold start
        is a transient; refusing would not make it faster)."""
        chosen: Decision | None = None
        for scored in table.by_cold:
            if not scored.cold_ms <= budget or (
                chosen is not None and scored.cold_ms >= chosen.expected_latency_ms
            ):
                break
            variant = scored.variant
            if not _eligible_by_accuracy(variant, targets):
                continue
            placed = self._place(
                variant,
                workers,
                "no active variant meets the targets; "
                "inactive variant with the lowest load+inference latency",
                scored.cold_ms,
            )
            if placed is None:
                continue
            placed = _counting_a_cold_start(placed, lambda_tier)
            if chosen is None or placed.expected_latency_ms < chosen.expected_latency_ms:
                chosen = placed
        return chosen

    def _active(self, scored: Scored, worker: WorkerState, expected: float, reason: str) -> Decision:
        """The decision for a live instance of ``scored`` on ``worker``, expected in ``expected``
        ms (its profiled latency and the wait for its queue)."""
        return Decision(
            variant=scored.variant,
            tier=Tier.LAMBDA if self._is_lambda(worker.pool) else Tier.WORKER,
            worker_id=worker.worker_id,
            state=InstanceState.ACTIVE,
            expected_latency_ms=expected,
            worker_address=worker.address or None,
            reason=reason,
        )

    def warmup(
        self,
        targets: QueryTargets,
        candidates: Sequence[VariantProfile],
        workers: Sequence[WorkerState],
    ) -> Decision | None:
        """After a miss: the variant that would meet the targets were it loaded, and where to
        load it, so that the next such query finds it Active. None if none would."""
        budget = _budget(targets)
        eligible = _eligible(targets, candidates, self._tolerance)
        fits = [v for v in eligible if v.latency_ms(targets.batch) <= budget]
        if not fits:
            return None
        for variant in sorted(
            fits, key=lambda v: (v.cost_per_query(targets.batch), v.load_latency_ms, v.variant_id)
        ):
            expected = variant.load_latency_ms + variant.latency_ms(targets.batch)
            placed = self._place(
                variant, workers, "loaded ahead of the next query with these targets", expected
            )
            if placed is not None:
                return placed
        return None

    def _place(
        self,
        variant: VariantProfile,
        workers: Sequence[WorkerState],
        reason: str,
        expected: float,
    ) -> Decision | None:
        """Where a new instance of ``variant`` goes (expected to take ``expected`` ms, load
        included): the least-utilised worker of its pool with room that does not already hold
        it, else the Lambda tier; None for an accelerator variant with no room (the Lambda tier
        has no GPU or Inferentia: its profile would not hold there)."""
        if self._is_lambda(variant.pool):
            return Decision(variant, Tier.LAMBDA, None, InstanceState.INACTIVE, expected, reason)
        with_room = [
            w
            for w in workers
            if w.pool == variant.pool
            and w.free_slots > 0
            and all(i.variant_id != variant.variant_id for i in w.instances)
        ]
        if with_room:
            worker = min(with_room, key=lambda w: (w.utilisation, w.worker_id))
            return Decision(
                variant,
                Tier.WORKER,
                worker.worker_id,
                InstanceState.INACTIVE,
                expected,
                reason,
                worker.address,
            )
        spec = self._pools.get(variant.pool)
        if spec is not None and spec.device != "cpu":
            return None
        return Decision(
            variant,
            Tier.LAMBDA,
            None,
            InstanceState.INACTIVE,
            expected,
            f"{reason}; no worker of pool {variant.pool!r} has room, spilled to the Lambda tier",
        )

    def _lambda_cost(self, variant: VariantProfile, batch: int) -> float:
        """What a query to ``variant`` costs on the Lambda tier (its smallest memory size)."""
        spec = next((p for p in self._pools.values() if p.kind is PoolKind.LAMBDA), None)
        if spec is None:
            return variant.cost_per_query(batch)
        per_second = spec.instance_price_per_second(1, min(spec.memory_options_mb, default=0))
        return per_second * variant.latency_ms(batch) / 1000 + spec.request_price

    def _is_lambda(self, pool: str) -> bool:
        spec = self._pools.get(pool)
        return spec is not None and spec.kind is PoolKind.LAMBDA


def _budget(targets: QueryTargets) -> float:
    return targets.latency_ms if targets.latency_ms is not None else math.inf


def _as_tuned(scored: Scored, instance: InstanceStats) -> _Tuned:
    """A live instance's latency and cost as its worker measured them (``tuned_scale``), with the
    scale and its concurrent runs: applied per live instance, as the tables hold the profiles."""
    latency, cost = scored.latency_ms, scored.cost
    scale, concurrency = tuned_scale(instance)
    if scale != 1.0:
        latency *= scale
        cost = scored.variant.price_per_second * latency / 1000.0 + scored.variant.request_price
    return latency, cost, scale, concurrency


def _eligible_by_accuracy(variant: VariantProfile, targets: QueryTargets) -> bool:
    """Whether ``variant`` meets the targets' accuracy and model (checked again: lists aren't trusted)."""
    return variant.accuracy >= targets.min_accuracy and (
        targets.model_name is None or variant.model_name == targets.model_name
    )


def _counting_a_cold_start(placed: Decision, lambda_tier: LambdaTierState | None) -> Decision:
    """``placed`` with the Lambda tier's cold start counted when the tier has no idle container
    for it (a worker's new instance never starts cold; a tier that cannot say is taken as warm)."""
    if placed.tier is not Tier.LAMBDA or lambda_tier is None or lambda_tier.has_idle(placed.variant):
        return placed
    cold_start_ms = lambda_tier.cold_start_ms
    return dataclasses.replace(
        placed,
        expected_latency_ms=placed.expected_latency_ms + cold_start_ms,
        reason=f"{placed.reason}; no idle Lambda container: a cold start (~{cold_start_ms:.0f} ms) counted"
        if math.isfinite(cold_start_ms)
        else f"{placed.reason}; but no Lambda tier is configured",
    )


def _none_starts_in_time(chosen: Decision | None, lambda_tier: LambdaTierState | None, budget: float) -> bool:
    """Stuck: no placement at all, or only one on a Lambda tier at its concurrency limit that
    misses the budget (it would wait for a busy container, for as long as that runs)."""
    return chosen is None or (
        not chosen.expected_latency_ms <= budget
        and chosen.tier is Tier.LAMBDA
        and lambda_tier is not None
        and lambda_tier.full
    )


def _late_answer(
    walk: _LiveWalk, chosen: Decision | None, lambda_tier: LambdaTierState | None, budget: float
) -> _Late | None:
    """The live instance to answer from, late: the quickest queued past the budget (Overloaded
    too when nothing new starts in time), if it answers before ``chosen`` or nothing new can."""
    stuck = _none_starts_in_time(chosen, lambda_tier, budget)
    late = walk.queued
    if walk.overloaded is not None and stuck and _quicker(walk.overloaded, late):
        late = walk.overloaded
    if late is not None and (stuck or chosen is None or late.expected_ms < chosen.expected_latency_ms):
        return late
    return None


def needs_warming(decision: Decision, targets: QueryTargets) -> bool:
    """Whether a served query should still start a warm-up (``SelectionPolicy.warmup``): it goes,
    late, to a worker's queue because nothing meets its budget now. Only a refusal used to warm
    anything, and selection prefers a late answer from a queue to a cold start, so a tier whose
    warm capacity a burst outgrew never grew: every query of the next burst was late again. (A
    late decision on the Lambda tier starts its container itself.)"""
    return decision.tier is Tier.WORKER and decision.expected_latency_ms > _budget(targets)


def _eligible(
    targets: QueryTargets, candidates: Sequence[VariantProfile], accuracy_tolerance: float | None = None
) -> list[VariantProfile]:
    return [v for v in for_targets(candidates, targets, accuracy_tolerance) if v.max_batch >= targets.batch]


def closest_variant(targets: QueryTargets, variants: Sequence[VariantProfile]) -> VariantProfile | None:
    """The variant that misses the targets by least: accuracy shortfall first, then the relative
    latency overshoot (what INFaaS suggests back to the developer)."""
    budget = targets.latency_ms if targets.latency_ms is not None else math.inf
    usable = [v for v in variants if v.max_batch >= targets.batch]
    if not usable:
        return None

    def shortfall(v: VariantProfile) -> tuple[float, float]:
        accuracy_gap = max(0.0, targets.min_accuracy - v.accuracy)
        latency = v.latency_ms(targets.batch)
        latency_gap = 0.0 if math.isinf(budget) else max(0.0, latency - budget) / budget
        return (round(accuracy_gap, 6), latency_gap)

    return min(usable, key=lambda v: (shortfall(v), v.variant_id))


def unreachable_error(targets: QueryTargets, variants: Sequence[VariantProfile]) -> TargetsUnreachableError:
    """The 4xx a query gets when nothing meets its targets, naming the closest variant."""
    closest = closest_variant(targets, variants)
    wanted = f"accuracy>={targets.min_accuracy:g}"
    if targets.latency_ms is not None:
        wanted += f" within {targets.latency_ms:g} ms"
    if closest is None:
        return TargetsUnreachableError(
            f"no variant can serve a batch of {targets.batch} ({wanted})", requested=_requested(targets)
        )
    achievable = {
        "variant": closest.variant_id,
        "model": closest.model_name,
        "accuracy": closest.accuracy,
        "latency_ms": round(closest.latency_ms(targets.batch), 3),
        "cold_latency_ms": round(closest.load_latency_ms + closest.latency_ms(targets.batch), 3),
    }
    return TargetsUnreachableError(
        f"no variant meets {wanted}; closest is {closest.variant_id} "
        f"(accuracy {closest.accuracy:.4f}, {achievable['latency_ms']} ms p99 when loaded)",
        requested=_requested(targets),
        closest=achievable,
    )


def _requested(targets: QueryTargets) -> dict[str, object]:
    return {
        "accuracy": targets.min_accuracy,
        "latency_ms": targets.latency_ms,
        "model": targets.model_name,
        "batch": targets.batch,
    }
