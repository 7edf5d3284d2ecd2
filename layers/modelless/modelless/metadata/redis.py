"""Redis metadata store: hashes for profiles, sorted sets for the accuracy/latency/load indexes.

Multi-key writes go through MULTI/EXEC pipelines so that a reader never sees half a model.

An unreachable Redis (refused, timed out, still loading its data) surfaces from every method as
the domain's ``StoreUnavailableError`` (a 503 with ``Retry-After``), never as a redis-py error,
and within ``Settings.metadata_timeout_s``: after the first such failure the store counts as
down and calls fail at once until a background probe finds it answering again (``_Outage``),
so that a stopped Redis costs each query nothing rather than a socket timeout.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qs, urlsplit

import redis
from aws_lambda_powertools import Logger
from redis.backoff import NoBackoff
from redis.retry import Retry

from modelless.config import get_settings
from modelless.exceptions import ConflictError, StoreUnavailableError, first_line
from modelless.metadata.base import (
    LOAD_RETENTION_S,
    WORKER_STALE_AFTER_S,
    IdempotentRequest,
    JobSave,
    mean_load,
)
from modelless.metadata.keys import KeySpace
from modelless.types import JobStatus, ModelRecord, OfflineJob, Registration, VariantProfile, WorkerState

logger = Logger(service="metadata")

# What redis-py raises when the server cannot be reached or does not answer in time (a server
# still loading its data raises BusyLoadingError, a ConnectionError): an outage, not a bad command.
UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
# While the store is down, a background probe pings it this often; its first answer ends the outage.
OUTAGE_PROBE_PERIOD_S = 0.5

T = TypeVar("T")
R = TypeVar("R")


class _Outage:
    """One store client's view of an outage. The first call that finds Redis unreachable starts
    it; while it lasts, calls fail at once, and one probe thread pings Redis every
    OUTAGE_PROBE_PERIOD_S until it answers. One warning when it starts, one line when it ends:
    a worker reporting every second through a long outage does not fill its log."""

    def __init__(self, client: redis.Redis, where: str) -> None:  # type: ignore[type-arg]
        self._client = client
        self.where = where
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic; None: the store answers
        self._cause = ""
        self._closed = threading.Event()

    def check(self) -> None:
        """Fail at once while the store is known to be down."""
        since = self._since
        if since is not None:
            raise self._error(time.monotonic() - since)

    def began(self, error: Exception) -> StoreUnavailableError:
        """``error`` (one of UNREACHABLE_ERRORS) ended a call: the outage starts, unless it had."""
        with self._lock:
            starting = self._since is None
            if starting:
                self._since = time.monotonic()
                self._cause = first_line(error)
        if starting:
            logger.warning(
                "metadata store unreachable: calls fail at once until it answers again",
                extra={"store": self.where, "error": self._cause},
            )
            threading.Thread(target=self._probe, name="metadata-probe", daemon=True).start()
        return self._error(0.0)

    def close(self) -> None:
        self._closed.set()

    def _probe(self) -> None:
        while not self._closed.wait(OUTAGE_PROBE_PERIOD_S):
            try:
                self._client.ping()
            except UNREACHABLE_ERRORS:
                continue
            except redis.RedisError:
                pass  # it answered, if only to refuse: reachable again
            with self._lock:
                since, self._since = self._since, None
            logger.warning(
                "metadata store answers again",
                extra={"store": self.where, "outage_s": round(time.monotonic() - (since or 0.0), 1)},
            )
            return

    def _error(self, for_s: float) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"the metadata store ({self.where}) does not answer ({self._cause}); try again shortly",
            address=self.where,
            down_for_s=round(for_s, 1),
        )


def _translating_outages(cls: type[T]) -> type[T]:
    """Every public method of ``cls`` raises StoreUnavailableError, not redis-py's errors, when
    Redis cannot be reached, and fails at once during a known outage (``_Outage``). Applied to the
    class as a whole so that methods added later are covered too."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and name != "close" and inspect.isfunction(member):
            setattr(cls, name, outage_checked(member))
    return cls


def outage_checked(method: Callable[..., R]) -> Callable[..., R]:
    """``method`` of an object over Redis with an ``_Outage`` (``self._outage``): it fails at once
    during a known outage, and an unreachable Redis starts one (StoreUnavailableError, never
    redis-py's errors). The metadata store applies it to every public method; other stores on the
    same Redis (the prediction cache) to theirs."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> R:
        self._outage.check()
        try:
            return method(self, *args, **kwargs)
        except UNREACHABLE_ERRORS as error:
            raise self._outage.began(error) from error

    return call


def connect(url: str) -> tuple[redis.Redis, KeySpace]:  # type: ignore[type-arg]
    """A client for ``redis://host:port/db?prefix=name:`` (or ``unix:///path.sock?db=0&prefix=
    name:``) and the key space its prefix names, with the store's timeouts
    (``Settings.metadata_timeout_s``/``metadata_connect_timeout_s``; ``socket_timeout``/
    ``socket_connect_timeout`` in the URL win). Shared with the prediction cache."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    prefix = query.pop("prefix", ["modelless:"])[0]
    remaining = "&".join(f"{k}={v[0]}" for k, v in query.items())
    # Not urlunsplit: it writes unix:///path.sock (no host) as unix:/path.sock.
    client_url = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{remaining}" if remaining else "")
    settings = get_settings()
    client = redis.Redis.from_url(
        client_url,
        socket_timeout=settings.metadata_timeout_s,
        socket_connect_timeout=settings.metadata_connect_timeout_s,
        # One immediate retry on a broken connection (a pooled one that a restarted Redis
        # dropped reconnects); none on a timeout (redis-py's default retries three times with
        # backoff, which made a stopped Redis cost four timeouts per call).
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )
    return client, KeySpace(prefix)


@_translating_outages
class RedisMetadataStore:
    kind: ClassVar[str] = "redis"

    def __init__(self, client: redis.Redis, keys: KeySpace | None = None) -> None:  # type: ignore[type-arg]
        self._redis = client
        self.keys = keys or KeySpace()
        self._outage = _Outage(client, _where(client))
        # Parsed records by the bytes they were parsed from, so that bytes read again unchanged
        # are not parsed again: the workers' reports as last read (workers report every second,
        # selection reads more often), and each app's profiles as last listed whole (a gateway
        # re-reads them all when one model is published, or when its cache TTL passes). The
        # records are immutable and shared, as the in-memory store shares its own.
        self._parsed_workers: dict[bytes, WorkerState] = {}
        self._parsed_variants: dict[str, dict[bytes, VariantProfile]] = {}

    @classmethod
    def from_url(cls, url: str) -> RedisMetadataStore:
        """``redis://host:port/db?prefix=name:`` (or ``unix:///path.sock?db=0&prefix=name:``) —
        the prefix namespaces every key. Timeouts: ``Settings.metadata_timeout_s`` and
        ``metadata_connect_timeout_s`` (``socket_timeout``/``socket_connect_timeout`` in the URL
        win)."""
        client, keys = connect(url)
        return cls(client, keys)

    # --- the store itself -----------------------------------------------------------------------
    def ping(self) -> None:
        self._redis.ping()

    def epoch(self) -> str | None:
        raw = self._redis.get(self.keys.epoch())
        return raw.decode() if isinstance(raw, bytes) else None

    def set_epoch(self, epoch: str) -> str:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.epoch(), epoch, nx=True)
            pipe.get(self.keys.epoch())
            _, held = pipe.execute()
        return str(held.decode())

    # --- apps -----------------------------------------------------------------------------------
    def create_app(self, app_id: str, key_hash: str) -> None:
        created = self._redis.hsetnx(self.keys.app(app_id), "key_hash", key_hash)
        if not created:
            raise ConflictError(f"app {app_id!r} already exists", app_id=app_id)
        self._redis.set(self.keys.api_key(key_hash), app_id)

    def app_exists(self, app_id: str) -> bool:
        return bool(self._redis.exists(self.keys.app(app_id)))

    def app_for_key(self, key_hash: str) -> str | None:
        raw = self._redis.get(self.keys.api_key(key_hash))
        return raw.decode() if isinstance(raw, bytes) else None

    def list_apps(self) -> list[str]:
        # A scan of the app records rather than a set kept beside them: it finds every app a
        # store holds, those created before it was asked for too. It walks the keyspace, which
        # only the admin's dashboard (a poll every few seconds) can afford.
        marker = self.keys.app("")
        found = self._redis.scan_iter(match=f"{_glob_escaped(marker)}*", count=1000)
        return sorted(key.decode()[len(marker) :] for key in found)

    # --- models and registrations ---------------------------------------------------------------
    def add_model(self, model: ModelRecord, registration: Registration) -> None:
        model_key = self.keys.model(model.app_id, model.model_name)
        if not self._redis.set(model_key, model.to_json(), nx=True):
            raise ConflictError(
                f"model {model.model_name!r} is already registered in app {model.app_id!r}",
                model_name=model.model_name,
            )
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(self.keys.models(model.app_id), model.model_name)
            pipe.set(self.keys.registration(registration.registration_id), registration.to_json())
            pipe.execute()

    def get_model(self, app_id: str, model_name: str) -> ModelRecord | None:
        raw = self._redis.get(self.keys.model(app_id, model_name))
        return ModelRecord.from_json(raw) if isinstance(raw, bytes) else None

    def list_models(self, app_id: str) -> list[ModelRecord]:
        names = sorted(n.decode() for n in self._redis.smembers(self.keys.models(app_id)))
        if not names:
            return []
        raws = self._redis.mget([self.keys.model(app_id, name) for name in names])
        return [ModelRecord.from_json(raw) for raw in raws if raw is not None]

    def delete_model(self, app_id: str, model_name: str) -> None:
        variant_ids = [v.variant_id for v in self.list_variants(app_id, model_name)]
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.model(app_id, model_name))
            pipe.srem(self.keys.models(app_id), model_name)
            pipe.incr(self.keys.profiles_version(app_id))
            pipe.delete(self.keys.accuracy_index(app_id, model_name))
            if variant_ids:
                pipe.hdel(self.keys.variants(app_id), *variant_ids)
                pipe.zrem(self.keys.accuracy_index(app_id), *variant_ids)
                pipe.zrem(self.keys.latency_index(app_id), *variant_ids)
            pipe.execute()

    def put_registration(self, registration: Registration) -> None:
        self._redis.set(self.keys.registration(registration.registration_id), registration.to_json())

    def get_registration(self, registration_id: str) -> Registration | None:
        raw = self._redis.get(self.keys.registration(registration_id))
        return Registration.from_json(raw) if isinstance(raw, bytes) else None

    def publish_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        app_id = model.app_id
        with self._redis.pipeline(transaction=True) as pipe:
            if variants:
                pipe.hset(self.keys.variants(app_id), mapping={v.variant_id: v.to_json() for v in variants})
                accuracy: dict[str | bytes, float] = {v.variant_id: v.accuracy for v in variants}
                pipe.zadd(self.keys.accuracy_index(app_id), accuracy)
                pipe.zadd(self.keys.accuracy_index(app_id, model.model_name), accuracy)
                pipe.zadd(self.keys.latency_index(app_id), {v.variant_id: v.latency_ms(1) for v in variants})
            pipe.set(self.keys.model(app_id, model.model_name), model.to_json())
            pipe.set(self.keys.registration(registration.registration_id), registration.to_json())
            pipe.incr(self.keys.profiles_version(app_id))
            pipe.execute()

    def add_variants(
        self, model: ModelRecord, variants: list[VariantProfile], registration: Registration
    ) -> None:
        # HSET and ZADD replace what a profile's id held and leave the others: publishing is
        # incremental already, in one MULTI/EXEC with the model, registration and version.
        self.publish_variants(model, variants, registration)

    def remove_variants(self, app_id: str, variant_ids: list[str], registration: Registration) -> None:
        by_model: dict[str, list[str]] = {}
        for variant in self.list_variants(app_id):
            if variant.variant_id in variant_ids:
                by_model.setdefault(variant.model_name, []).append(variant.variant_id)
        with self._redis.pipeline(transaction=True) as pipe:
            if variant_ids:
                pipe.hdel(self.keys.variants(app_id), *variant_ids)
                pipe.zrem(self.keys.accuracy_index(app_id), *variant_ids)
                pipe.zrem(self.keys.latency_index(app_id), *variant_ids)
            for model_name, ids in by_model.items():
                pipe.zrem(self.keys.accuracy_index(app_id, model_name), *ids)
            pipe.set(self.keys.registration(registration.registration_id), registration.to_json())
            pipe.incr(self.keys.profiles_version(app_id))
            pipe.execute()

    # --- variants -------------------------------------------------------------------------------
    def list_variants(self, app_id: str, model_name: str | None = None) -> list[VariantProfile]:
        if model_name is None:
            raws = self._redis.hvals(self.keys.variants(app_id))
            profiles = self._parse_variants(app_id, raws, remember=True)
        else:
            ids = self._redis.zrange(self.keys.accuracy_index(app_id, model_name), 0, -1)
            raws = self._redis.hmget(self.keys.variants(app_id), ids) if ids else []
            profiles = self._parse_variants(app_id, raws)
        return sorted(profiles, key=lambda v: v.variant_id)

    def candidate_variants(
        self, app_id: str, min_accuracy: float, model_name: str | None = None
    ) -> list[VariantProfile]:
        index = self.keys.accuracy_index(app_id, model_name)
        ids = self._redis.zrangebyscore(index, min_accuracy, "+inf")
        if not ids:
            return []
        return self._parse_variants(app_id, self._redis.hmget(self.keys.variants(app_id), ids))

    def _parse_variants(
        self, app_id: str, raws: list[bytes | None], remember: bool = False
    ) -> list[VariantProfile]:
        """Profiles parsed, or reused where the same bytes were parsed by the app's last whole
        listing; ``remember`` (a whole listing): these become the app's remembered ones."""
        known = self._parsed_variants.get(app_id, {})
        parsed = {raw: known.get(raw) or VariantProfile.from_json(raw) for raw in raws if raw is not None}
        if remember:
            self._parsed_variants[app_id] = parsed
        return list(parsed.values())

    # --- live worker state ----------------------------------------------------------------------
    def put_worker_state(self, state: WorkerState) -> None:
        # One hash for all workers: selection reads the whole live state in a single round trip.
        # A worker that stops reporting is filtered out by its report time.
        self._redis.hset(self.keys.workers(), state.worker_id, state.to_json())

    def remove_worker(self, worker_id: str) -> None:
        self._redis.hdel(self.keys.workers(), worker_id)

    def add_load(self, counts: dict[str, int], second: int, peaks: dict[str, int] | None = None) -> None:
        if not counts and not peaks:
            return
        with self._redis.pipeline(transaction=True) as pipe:
            for key, added in ((self.keys.load(second), counts), (self.keys.load_peaks(second), peaks or {})):
                if added:
                    for group, count in added.items():
                        pipe.hincrby(key, group, count)
                    pipe.expire(key, LOAD_RETENTION_S)
            pipe.execute()

    def recent_load(self, window_s: int, now: float) -> dict[str, float]:
        return mean_load(self.load_series(window_s, now), window_s)

    def load_series(self, window_s: int, now: float) -> dict[str, list[int]]:
        return self._series(self.keys.load, window_s, now)

    def peak_series(self, window_s: int, now: float) -> dict[str, list[int]]:
        return self._series(self.keys.load_peaks, window_s, now)

    def _series(self, key_of: Callable[[int], str], window_s: int, now: float) -> dict[str, list[int]]:
        last = int(now) - 1  # the current second is still being counted
        with self._redis.pipeline(transaction=False) as pipe:
            for second in range(last - window_s + 1, last + 1):
                pipe.hgetall(key_of(second))
            buckets = pipe.execute()
        series: dict[str, list[int]] = {}
        for position, bucket in enumerate(buckets):
            for group, count in bucket.items():
                series.setdefault(group.decode(), [0] * window_s)[position] += int(count)
        return series

    def list_workers(self, pool: str | None = None) -> list[WorkerState]:
        return _live(self._parse_workers(self._redis.hvals(self.keys.workers())), pool)

    def list_worker_reports(self, pool: str | None = None) -> list[WorkerState]:
        reports = self._parse_workers(self._redis.hvals(self.keys.workers()))
        return [state for state in reports if pool is None or state.pool == pool]

    def profiles_version(self, app_id: str) -> int:
        raw = self._redis.get(self.keys.profiles_version(app_id))
        return int(raw) if raw is not None else 0

    def selection_state(self, app_id: str) -> tuple[int, list[WorkerState]]:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.profiles_version(app_id))
            pipe.hvals(self.keys.workers())
            version, raws = pipe.execute()
        return (int(version) if version is not None else 0), _live(self._parse_workers(raws), None)

    def _parse_workers(self, raws: list[bytes]) -> list[WorkerState]:
        """The reports parsed, reusing the last read's objects for the bytes that did not change
        (a WorkerState is immutable, so callers may share it)."""
        previous = self._parsed_workers
        parsed = {raw: previous.get(raw) or WorkerState.from_json(raw) for raw in raws}
        self._parsed_workers = parsed  # only the current reports are kept
        return list(parsed.values())

    def flush_namespace(self) -> None:
        """Delete every key under this store's prefix (tests and `modelless reset`)."""
        keys = list(self._redis.scan_iter(match=self.keys.pattern(), count=500))
        if keys:
            self._redis.delete(*keys)

    def close(self) -> None:
        self._outage.close()
        self._redis.close()

    # ============================================================================================
    # Offline jobs (docs/ARCHITECTURE.md §6). A separate block, owned by the offline-jobs work: records, the
    # fixed input list, done markers set once (a Lua script counts only new markers), and the
    # runner's lease (compare-and-set scripts, so that a runner never renews or drops a lease
    # another runner took after its own expired).
    # ============================================================================================
    def set_offline_buckets(self, app_id: str, buckets: list[str]) -> None:
        self._redis.set(self.keys.offline_buckets(app_id), json.dumps(sorted(set(buckets))))

    def offline_buckets(self, app_id: str) -> list[str] | None:
        raw = self._redis.get(self.keys.offline_buckets(app_id))
        return [str(b) for b in json.loads(raw)] if raw is not None else None

    def create_job(self, job: OfflineJob) -> bool:
        if not self._redis.set(self.keys.job(job.job_id), job.to_json(), nx=True):
            return False
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self.keys.app_jobs(job.app_id), {job.job_id: job.created_at})
            if not job.status.finished:
                pipe.sadd(self.keys.unfinished_jobs(), job.job_id)
            pipe.execute()
        return True

    def put_job(self, job: OfflineJob) -> None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.job(job.job_id), job.to_json())
            pipe.zadd(self.keys.app_jobs(job.app_id), {job.job_id: job.created_at})
            if job.status.finished:
                pipe.srem(self.keys.unfinished_jobs(), job.job_id)
            else:
                pipe.sadd(self.keys.unfinished_jobs(), job.job_id)
            pipe.execute()

    def save_job(self, job: OfflineJob, owner: str) -> JobSave:
        keys = [
            self.keys.job_lease(job.job_id),
            self.keys.job(job.job_id),
            self.keys.app_jobs(job.app_id),
            self.keys.unfinished_jobs(),
            self.keys.job_items(job.job_id),
            self.keys.job_done(job.job_id),
        ]
        args = [
            owner,
            job.to_json(),
            job.job_id,
            repr(job.created_at),
            "1" if job.status.finished else "0",
            "1" if job.status is JobStatus.COMPLETED else "0",
        ]
        saved = int(self._redis.eval(_SAVE_JOB, len(keys), *keys, *args))  # type: ignore[no-untyped-call]
        return {1: JobSave.SAVED, 0: JobSave.NOT_HOLDER}.get(saved, JobSave.NEW_INPUTS)

    def add_job_items(self, job_id: str, keys: list[str], reopen_message: str) -> int:
        if not keys:
            return 0
        added = int(
            self._redis.eval(  # type: ignore[no-untyped-call]
                _ADD_ITEMS, 2, self.keys.job_items(job_id), self.keys.job_item_set(job_id), *keys
            )
        )
        if added:
            self._reopen_job(job_id, reopen_message)
        return added

    def _reopen_job(self, job_id: str, message: str) -> None:
        """A completed job that gained inputs: queued again. Optimistic (WATCH): a runner's
        ``save_job`` landing in between makes it read the record again."""
        key = self.keys.job(job_id)
        with self._redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    job = OfflineJob.from_json(raw) if isinstance(raw, bytes) else None
                    if job is None or job.status is not JobStatus.COMPLETED:
                        pipe.unwatch()
                        return
                    job.status, job.finished_at, job.message = JobStatus.QUEUED, None, message
                    pipe.multi()
                    pipe.set(key, job.to_json())
                    pipe.sadd(self.keys.unfinished_jobs(), job_id)
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    def job_item_count(self, job_id: str) -> int:
        return int(self._redis.llen(self.keys.job_items(job_id)))

    def get_job(self, job_id: str) -> OfflineJob | None:
        raw = self._redis.get(self.keys.job(job_id))
        return OfflineJob.from_json(raw) if isinstance(raw, bytes) else None

    def list_jobs(self, app_id: str) -> list[OfflineJob]:
        ids = self._redis.zrevrange(self.keys.app_jobs(app_id), 0, -1)
        if not ids:
            return []
        raws = self._redis.mget([self.keys.job(i.decode()) for i in ids])
        return [OfflineJob.from_json(raw) for raw in raws if raw is not None]

    def unfinished_jobs(self) -> list[str]:
        return sorted(i.decode() for i in self._redis.smembers(self.keys.unfinished_jobs()))

    def fix_job_items(self, job_id: str, keys: list[str]) -> list[str]:
        final = self.keys.job_items(job_id)
        if keys and not self._redis.exists(final):
            # Written whole under a temporary name, then renamed only if no list exists yet: a
            # reader never sees half a list, and of two racing runners the first list wins.
            staging = f"{final}:staging:{uuid.uuid4().hex}"
            with self._redis.pipeline(transaction=True) as pipe:
                for start in range(0, len(keys), 1000):
                    pipe.rpush(staging, *keys[start : start + 1000])
                pipe.execute()
            try:
                self._redis.renamenx(staging, final)  # type: ignore[no-untyped-call]
            finally:
                self._redis.delete(staging)
        return self.job_items(job_id)

    def job_items(self, job_id: str) -> list[str]:
        return [k.decode() for k in self._redis.lrange(self.keys.job_items(job_id), 0, -1)]

    def mark_items(self, job_id: str, outcomes: dict[str, tuple[str, str]]) -> int:
        if not outcomes:
            return 0
        args: list[str] = []
        for item, (output_key, error) in outcomes.items():
            args += [item, output_key, error]
        added = self._redis.eval(  # type: ignore[no-untyped-call]
            _MARK_ITEMS, 2, self.keys.job_done(job_id), self.keys.job_errors(job_id), *args
        )
        return int(added)

    def done_items(self, job_id: str) -> set[str]:
        return {k.decode() for k in self._redis.hkeys(self.keys.job_done(job_id))}

    def job_progress(self, job_id: str) -> tuple[int, int]:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hlen(self.keys.job_done(job_id))
            pipe.hlen(self.keys.job_errors(job_id))
            done, errors = pipe.execute()
        return int(done), int(errors)

    def job_errors(self, job_id: str, limit: int) -> dict[str, str]:
        errors = {
            k.decode(): v.decode() for k, v in self._redis.hgetall(self.keys.job_errors(job_id)).items()
        }
        return {key: errors[key] for key in sorted(errors)[:limit]}

    def acquire_job_lease(self, job_id: str, owner: str, ttl_s: float) -> bool:
        lease = self.keys.job_lease(job_id)
        return bool(self._redis.eval(_ACQUIRE_LEASE, 1, lease, owner, _ms(ttl_s)))  # type: ignore[no-untyped-call]

    def renew_job_lease(self, job_id: str, owner: str, ttl_s: float) -> bool:
        lease = self.keys.job_lease(job_id)
        return bool(self._redis.eval(_RENEW_LEASE, 1, lease, owner, _ms(ttl_s)))  # type: ignore[no-untyped-call]

    def release_job_lease(self, job_id: str, owner: str) -> None:
        self._redis.eval(_RELEASE_LEASE, 1, self.keys.job_lease(job_id), owner)  # type: ignore[no-untyped-call]

    def job_lease_holder(self, job_id: str) -> str | None:
        raw = self._redis.get(self.keys.job_lease(job_id))
        return raw.decode() if isinstance(raw, bytes) else None

    def job_lease_expires_in_s(self, job_id: str) -> float | None:
        left_ms = int(self._redis.pttl(self.keys.job_lease(job_id)))
        return left_ms / 1000.0 if left_ms > 0 else None  # -2: no lease (-1, no TTL, cannot happen)

    # --- the scaler's lease: the job leases' scripts (SET NX PX; extend and drop by the holder) --
    def acquire_scaler_lease(self, owner: str, ttl_s: float) -> bool:
        lease = self.keys.scaler_lease()
        return bool(self._redis.eval(_ACQUIRE_LEASE, 1, lease, owner, _ms(ttl_s)))  # type: ignore[no-untyped-call]

    def release_scaler_lease(self, owner: str) -> None:
        self._redis.eval(_RELEASE_LEASE, 1, self.keys.scaler_lease(), owner)  # type: ignore[no-untyped-call]

    def scaler_lease_holder(self) -> str | None:
        raw = self._redis.get(self.keys.scaler_lease())
        return raw.decode() if isinstance(raw, bytes) else None

    def put_scaling_plan(self, plan: str) -> None:
        self._redis.set(self.keys.scaling_plan(), plan)

    def scaling_plan(self) -> str | None:
        raw = self._redis.get(self.keys.scaling_plan())
        return raw.decode() if isinstance(raw, bytes) else None

    def expire_job_progress(self, job_id: str, after_s: float) -> None:
        seconds = max(1, int(after_s))
        with self._redis.pipeline(transaction=True) as pipe:
            for key in (
                self.keys.job_items(job_id),
                self.keys.job_item_set(job_id),
                self.keys.job_done(job_id),
                self.keys.job_errors(job_id),
            ):
                pipe.expire(key, seconds)
            pipe.execute()

    # --- idempotency keys: SET NX PX takes a key, one script step answers who holds it ------------
    def claim_request(
        self, app_id: str, operation: str, key: str, pending: IdempotentRequest, ttl_s: float
    ) -> IdempotentRequest | None:
        name = self.keys.request_key(app_id, operation, key)
        held = self._redis.eval(_CLAIM_REQUEST, 1, name, pending.to_json(), _ms(ttl_s))  # type: ignore[no-untyped-call]
        return IdempotentRequest.from_json(held) if isinstance(held, bytes) else None

    def complete_request(
        self, app_id: str, operation: str, key: str, done: IdempotentRequest, ttl_s: float
    ) -> None:
        self._redis.set(self.keys.request_key(app_id, operation, key), done.to_json(), px=_ms(ttl_s))

    def release_request(self, app_id: str, operation: str, key: str, pending: IdempotentRequest) -> None:
        # The lease's compare-and-delete: only the record this claim wrote is dropped.
        name = self.keys.request_key(app_id, operation, key)
        self._redis.eval(_RELEASE_LEASE, 1, name, pending.to_json())  # type: ignore[no-untyped-call]


# KEYS: an idempotency key; ARGV: the pending record, its ttl (ms). Written when free (nil back);
# else the record that holds it, untouched: claiming and reading the holder are one step.
_CLAIM_REQUEST = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return redis.call('GET', KEYS[1])
"""
# KEYS: done hash, errors hash; ARGV: (input key, output key, error) triples. A marker is set only
# once; only newly set ones are counted, and only their errors recorded.
_MARK_ITEMS = """
local added = 0
for i = 1, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    added = added + 1
    if ARGV[i + 2] ~= '' then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2]) end
  end
end
return added
"""
# KEYS: lease, job record, app's jobs, unfinished set, inputs list, done hash; ARGV: owner, record,
# job id, created at, finished (1/0), completed (1/0). The record is written only while the owner
# holds the lease (1); else 0. A completed record only with every recorded input done; else -1.
_SAVE_JOB = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[6] == '1' and redis.call('HLEN', KEYS[6]) < redis.call('LLEN', KEYS[5]) then return -1 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
if ARGV[5] == '1' then redis.call('SREM', KEYS[4], ARGV[3]) else redis.call('SADD', KEYS[4], ARGV[3]) end
return 1
"""
# KEYS: inputs list, inputs set; ARGV: input keys. Appends the ones not yet there; returns how many.
_ADD_ITEMS = """
local added = 0
for i = 1, #ARGV do
  if redis.call('SADD', KEYS[2], ARGV[i]) == 1 then
    redis.call('RPUSH', KEYS[1], ARGV[i])
    added = added + 1
  end
end
return added
"""
# KEYS: the lease; ARGV: owner, ttl (ms). Taken when free; extended when the caller holds it.
_ACQUIRE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
_RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _where(client: redis.Redis) -> str:  # type: ignore[type-arg]
    """The server a client talks to, for messages (never its password)."""
    options = client.connection_pool.connection_kwargs
    if "path" in options:
        return f"redis at {options['path']}"
    return f"redis at {options.get('host', 'localhost')}:{options.get('port', 6379)}"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _live(states: list[WorkerState], pool: str | None) -> list[WorkerState]:
    fresh_after = time.time() - WORKER_STALE_AFTER_S
    live = [s for s in states if s.reported_at >= fresh_after and (pool is None or s.pool == pool)]
    return sorted(live, key=lambda w: (w.utilisation, w.worker_id))


def _glob_escaped(text: str) -> str:
    """``text`` matched literally in a SCAN pattern (a test's key prefix may hold glob characters)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
