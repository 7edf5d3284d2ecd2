"""S3 ObjectCreated events into offline jobs.

Two kinds of object feed jobs:

- a **manifest** (a key ending in ``.job.json``: a JSON object with ``appID``, ``inputPath``,
  ``outputPath`` and ``accuracy`` or ``modelName``; a path without ``s3://`` is a prefix in the
  manifest's bucket) starts a job over its input prefix. The job's id is derived from the object
  (bucket, key, ETag), so every delivery of one event names the same job: S3 delivers at least
  once, and a duplicate finds the job and at most resumes it. A manifest that cannot run (bad
  JSON, bad fields, a refused path) is recorded as a failed job of its app, with the reason, so
  that ``job status`` and ``jobs`` say why nothing ran (only a manifest naming no existing app
  is left to the function's log);
- an object created under a **watched prefix** (``MODELLESS_OFFLINE_WATCHES``) becomes one more
  input of the watch's standing job (once per key, whatever the number of deliveries), which is
  queued again if it had caught up.

In the offline function, Powertools' idempotency utility (Redis persistence) sits in front of
this, so that a duplicate delivered while the first is being handled does nothing at all.

Events arrive straight from S3 or through an SQS queue (S3 → SQS → Lambda, or the embedded
stack's ``SqsEventPoller``); both shapes are read with Powertools' event data classes.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard, cast
from urllib.parse import parse_qs, unquote_plus, urlsplit, urlunsplit

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.data_classes import S3Event, SQSEvent
from aws_lambda_powertools.utilities.data_classes.s3_event import S3EventRecord
from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.persistence.cache import CachePersistenceLayer

from modelless.exceptions import InvalidJobError, ModellessError, NotFoundError
from modelless.offline.jobs import (
    MANIFEST_SUFFIX,
    S3_SCHEME,
    JobSpec,
    S3Path,
    Watch,
    is_input,
    job_id_for_object,
)
from modelless.offline.service import OfflineService

logger = Logger(service="offline", child=True)

MAX_MANIFEST_BYTES = 64 * 1024
# jmespath over one S3 event record: what makes two deliveries "the same event".
EVENT_KEY_JMESPATH = "[s3.bucket.name, s3.object.key, s3.object.eTag]"


@dataclass(frozen=True)
class StartResult:
    """What became of one S3 record (JSON-able: the idempotency utility stores it)."""

    status: str  # "started" | "exists" | "refused" | "ignored"
    job_id: str | None = None
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def s3_records(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The S3 event records in a Lambda event: straight from S3, or in SQS message bodies (S3's
    own test message, sent when a notification is configured, holds none)."""
    records: list[dict[str, Any]] = []
    for raw in event.get("Records") or []:
        source = raw.get("eventSource")
        if source == "aws:s3":
            records.extend(r.raw_event for r in S3Event({"Records": [raw]}).records)
        elif source == "aws:sqs":
            for message in SQSEvent({"Records": [raw]}).records:
                body = message.json_body if message.body else {}
                if isinstance(body, dict) and body.get("Records"):
                    records.extend(r.raw_event for r in message.decoded_nested_s3_event.records)
    return records


def _is_accuracy(value: Any) -> TypeGuard[int | float]:
    """A JSON number in [0, 1], compared before any conversion: ``float`` of an integer of 400
    digits raises, and NaN compares false."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1


def refused_manifest_spec(data: bytes, bucket: str) -> JobSpec | None:
    """What a manifest that cannot run says, as far as it says it: enough to record its refusal
    under its app (None when it names no app)."""
    try:
        body = json.loads(data)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("appID"), str):
        return None

    def path(value: Any) -> str:
        if not isinstance(value, str):
            return ""
        return value if value.startswith(S3_SCHEME) else f"{S3_SCHEME}{bucket}/{value.lstrip('/')}"

    accuracy = body.get("accuracy")
    model_name = body.get("modelName")
    pipeline = body.get("pipeline")
    return JobSpec(
        app_id=body["appID"],
        input_path=path(body.get("inputPath")),
        output_path=path(body.get("outputPath")),
        min_accuracy=float(accuracy) if _is_accuracy(accuracy) else 0.0,
        model_name=model_name if isinstance(model_name, str) else None,
        pipeline=pipeline if isinstance(pipeline, str) else None,
    )


def parse_manifest(data: bytes, bucket: str) -> JobSpec:
    """A manifest's job. Paths without ``s3://`` are prefixes in the manifest's own bucket."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidJobError(f"manifest of {len(data)} bytes exceeds {MAX_MANIFEST_BYTES}")
    try:
        body = json.loads(data)
    except ValueError as error:
        raise InvalidJobError(f"manifest is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise InvalidJobError("manifest must be a JSON object")
    unknown = set(body) - {"appID", "inputPath", "outputPath", "accuracy", "modelName", "pipeline"}
    if unknown:
        raise InvalidJobError(f"manifest has unknown fields {sorted(unknown)}")
    missing = {"appID", "inputPath", "outputPath"} - set(body)
    if missing:
        raise InvalidJobError(f"manifest lacks {sorted(missing)}")
    if body.get("accuracy") is None and body.get("modelName") is None and body.get("pipeline") is None:
        raise InvalidJobError("manifest needs an accuracy target, a modelName or a pipeline")

    def path(value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise InvalidJobError(f"manifest {what} must be a string")
        return value if value.startswith(S3_SCHEME) else f"{S3_SCHEME}{bucket}/{value.lstrip('/')}"

    accuracy = body.get("accuracy")
    if accuracy is not None and not _is_accuracy(accuracy):
        raise InvalidJobError(f"manifest accuracy must be a number in [0, 1], not {str(accuracy)[:40]}")
    model_name = body.get("modelName")
    if model_name is not None and not isinstance(model_name, str):
        raise InvalidJobError("manifest modelName must be a string")
    pipeline = body.get("pipeline")
    if pipeline is not None and not isinstance(pipeline, str):
        raise InvalidJobError("manifest pipeline must be a string")
    return JobSpec(
        app_id=str(body["appID"]),
        input_path=path(body["inputPath"], "inputPath"),
        output_path=path(body["outputPath"], "outputPath"),
        min_accuracy=float(accuracy or 0.0),
        model_name=model_name,
        pipeline=pipeline,
    )


class S3JobStarter:
    """One S3 event record into a job: created (or, for a watch, given one more input) and
    launched, found again (a duplicate), refused (recorded as a failed job of its app, with the
    reason), or ignored (not a job's object)."""

    def __init__(self, service: OfflineService, launch: bool = True) -> None:
        self._service = service
        self._launch = launch

    def start(self, record: dict[str, Any]) -> dict[str, Any]:
        return self._start(S3EventRecord(record)).to_dict()

    def _start(self, record: S3EventRecord) -> StartResult:
        if not record.event_name.startswith("ObjectCreated"):
            return StartResult("ignored", message=f"event {record.event_name}")
        bucket = record.s3.bucket.name
        key = unquote_plus(record.s3.get_object.key)  # event keys are URL-encoded ('+' for spaces)
        source = f"{S3_SCHEME}{bucket}/{key}"
        if key.endswith(MANIFEST_SUFFIX):
            return self._start_manifest(bucket, key, record.s3.get_object.etag, source)
        watch = self._service.watch_for(S3Path(bucket, key))
        if watch is not None and is_input(key):
            return self._add_to_watch(watch, key, source)
        return StartResult("ignored", message=f"{source} is neither a manifest nor a watched input")

    def _start_manifest(self, bucket: str, key: str, etag: str, source: str) -> StartResult:
        job_id = job_id_for_object(bucket, key, etag)
        existing = self._service.store.get_job(job_id)
        if existing is not None:
            # A duplicate delivery: the job exists. Launched again only if unfinished and free
            # (a runner that crashed); a runner holding it makes the launch a no-op.
            if self._launch and not existing.status.finished:
                self._service.launch(job_id)
            return StartResult("exists", job_id, existing.status.value)
        try:
            data = self._service.objects.get(bucket, key)
        except NotFoundError:
            return StartResult("ignored", message=f"{source} was deleted before its event was handled")
        except ModellessError as error:  # S3's 403: the service may not read the manifest
            logger.warning("manifest unreadable", extra={"source": source, "error": error.message})
            return StartResult("refused", job_id, error.message)
        try:
            spec = parse_manifest(data, bucket)
        except InvalidJobError as error:
            named = refused_manifest_spec(data, bucket)
            recorded = self._service.record_refusal(named, job_id, source, error.message) if named else None
            logger.warning(
                "manifest refused",
                extra={"source": source, "error": error.message, "recorded": recorded is not None},
            )
            return StartResult("refused", job_id, error.message)
        try:
            job = self._service.submit(spec, job_id=job_id, source=source, launch=self._launch)
        except ModellessError as error:
            self._service.record_refusal(spec, job_id, source, error.message)
            logger.warning("S3-started job refused", extra={"source": source, "error": error.message})
            return StartResult("refused", job_id, error.message)
        logger.info("offline job started by S3", extra={"job_id": job.job_id, "source": source})
        return StartResult("started", job.job_id, job.status.value)

    def _add_to_watch(self, watch: Watch, key: str, source: str) -> StartResult:
        try:
            job, added = self._service.add_watched_input(watch, key)
        except ModellessError as error:
            self._service.record_refusal(watch.spec(), watch.job_id, watch.source, error.message)
            logger.warning("watch refused", extra={"source": source, "error": error.message})
            return StartResult("refused", watch.job_id, error.message)
        if self._launch and not job.status.finished:
            self._service.launch(job.job_id)
        logger.info("watched object added", extra={"job_id": job.job_id, "source": source, "new": added})
        return StartResult("started" if added else "exists", job.job_id, job.status.value)


def idempotency_layer(metadata_url: str) -> tuple[CachePersistenceLayer, str]:
    """Powertools' Redis (cache) persistence on the metadata store's Redis, its records under the
    store's key prefix; an in-process cache for ``memory://``. Returns the layer and key prefix."""
    if metadata_url.startswith("memory://"):
        return cache_layer(InProcessCache()), "modelless:idempotency:offline-event"
    import redis

    parts = urlsplit(metadata_url)
    query = parse_qs(parts.query)
    prefix = query.pop("prefix", ["modelless:"])[0]
    remaining = "&".join(f"{k}={v[0]}" for k, v in query.items())
    client = redis.Redis.from_url(urlunsplit((parts.scheme, parts.netloc, parts.path, remaining, "")))
    return cache_layer(client), f"{prefix}idempotency:offline-event"


def cache_layer(client: Any) -> CachePersistenceLayer:
    """``CachePersistenceLayer`` over a Redis client. In Powertools 3.x it is an alias of
    ``RedisCachePersistenceLayer``, whose constructor warns about its own rename whichever name
    is used; the warning says nothing about this code, so it is silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # redis-py's stubs and Powertools' client protocol disagree only on argument types.
        return CachePersistenceLayer(client=cast(Any, client))


def idempotent_start(
    starter: S3JobStarter,
    persistence: CachePersistenceLayer,
    key_prefix: str,
    config: IdempotencyConfig | None = None,
) -> tuple[Callable[..., dict[str, Any]], IdempotencyConfig]:
    """``starter.start`` behind Powertools' idempotency utility, keyed on (bucket, key, ETag):
    a duplicate delivery gets the first one's result, and one delivered while the first is
    still being handled raises ``IdempotencyAlreadyInProgressError``. Returns the function
    (call it as ``start(record=…)``) and its config (register the Lambda context on it)."""
    config = config or IdempotencyConfig(
        event_key_jmespath=EVENT_KEY_JMESPATH,
        raise_on_no_idempotency_key=True,
        expires_after_seconds=24 * 3600,
    )

    def start(record: dict[str, Any]) -> dict[str, Any]:
        return starter.start(record)

    guarded: Callable[..., dict[str, Any]] = idempotent_function(
        start,
        data_keyword_argument="record",
        persistence_store=persistence,
        config=config,
        key_prefix=key_prefix,
    )
    return guarded, config


class InProcessCache:
    """A Redis-like get/set/delete in a dict with expiry: Powertools' cache persistence layer
    for the in-memory metadata store (one process; unit tests)."""

    def __init__(self) -> None:
        self._values: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    def get(self, name: Any) -> bytes | None:
        with self._lock:
            found = self._values.get(str(name))
            if found is None or found[1] < time.monotonic():
                return None
            return found[0]

    def set(
        self, name: Any, value: Any, ex: Any = None, px: Any = None, nx: bool = False, **_: Any
    ) -> bool | None:
        key = str(name)
        data = value if isinstance(value, bytes) else str(value).encode()
        ttl = float(ex) if ex is not None else (float(px) / 1000 if px is not None else 1e12)
        with self._lock:
            found = self._values.get(key)
            if nx and found is not None and found[1] >= time.monotonic():
                return None
            self._values[key] = (data, time.monotonic() + ttl)
            return True

    def delete(self, *names: Any) -> int:
        with self._lock:
            return sum(1 for name in names if self._values.pop(str(name), None) is not None)


class SqsEventPoller:
    """The embedded stack's S3 → SQS → handler path: long-polls a queue that S3 notifications
    feed, hands each message's event to ``handle`` and deletes it once handled (a message whose
    handling failed comes back after its visibility timeout: at-least-once, as in Lambda)."""

    def __init__(
        self, queue_url: str, handle: Callable[[dict[str, Any]], Any], client: Any | None = None
    ) -> None:
        if client is None:
            from modelless import aws_clients

            client = aws_clients.client("sqs")
        self._queue_url = queue_url
        self._handle = handle
        self._sqs = client
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self, wait_s: int = 1) -> int:
        reply = self._sqs.receive_message(
            QueueUrl=self._queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=wait_s, AttributeNames=["All"]
        )
        handled = 0
        for message in reply.get("Messages", []):
            event = {
                "Records": [
                    {
                        "eventSource": "aws:sqs",
                        "messageId": message["MessageId"],
                        "receiptHandle": message["ReceiptHandle"],
                        "body": message["Body"],
                        "attributes": message.get("Attributes", {}),
                        "messageAttributes": {},
                        "md5OfBody": message.get("MD5OfBody", ""),
                        "eventSourceARN": "",
                        "awsRegion": "",
                    }
                ]
            }
            try:
                self._handle(event)
            except Exception:
                logger.exception("S3 event from SQS could not be handled; it will be redelivered")
                continue
            self._sqs.delete_message(QueueUrl=self._queue_url, ReceiptHandle=message["ReceiptHandle"])
            handled += 1
        return handled

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.poll_once(wait_s=1)
                except Exception:
                    logger.exception("polling the offline event queue failed")
                    self._stop.wait(1.0)

        self._thread = threading.Thread(target=loop, name="offline-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
