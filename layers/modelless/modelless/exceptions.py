"""Domain errors. Each carries the HTTP status it maps to; the API maps them in one place."""

from __future__ import annotations

from typing import Any


def first_line(error: BaseException) -> str:
    """An error's first line, at most 300 characters (its type when it has no message): what a
    domain error quotes of a library's exception, whose full text may run to pages."""
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


class ModellessError(Exception):
    """Base of every error a caller can cause or observe."""

    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def within(self, context: str, **details: Any) -> ModellessError:
        """The same error, said of a part of something larger (a pipeline's stage): ``context``
        leads its message, ``details`` join its own (without replacing them)."""
        self.message = f"{context}: {self.message}"
        self.args = (self.message,)
        for key, value in details.items():
            self.details.setdefault(key, value)
        return self

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class BadRequestError(ModellessError):
    status_code = 400
    code = "bad_request"


class InvalidInputError(BadRequestError):
    """Query inputs of the wrong shape, dtype or content (NaN, inf)."""

    code = "invalid_input"


class InvalidModelError(BadRequestError):
    """A model file or validation set that cannot be served."""

    code = "invalid_model"


class UnauthorizedError(ModellessError):
    status_code = 401
    code = "unauthorized"


class ForbiddenError(ModellessError):
    status_code = 403
    code = "forbidden"


class NotFoundError(ModellessError):
    status_code = 404
    code = "not_found"


class ConflictError(ModellessError):
    status_code = 409
    code = "conflict"


class PayloadTooLargeError(ModellessError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaTypeError(ModellessError):
    """A request body of a content type the endpoint (or this model) does not take."""

    status_code = 415
    code = "unsupported_media_type"


class TargetsUnreachableError(ModellessError):
    """No variant meets the query's latency and accuracy (INFaaS §4.1): names the closest one."""

    status_code = 422
    code = "targets_unreachable"


class IdempotencyConflictError(ConflictError):
    """An ``Idempotency-Key`` already used by this app for a different request, or for one still
    running: nothing is done for this one (docs/REGISTRATION.md, "Retries")."""

    code = "idempotency_conflict"


class NotReadyError(ModellessError):
    """The model exists but its variants are still being generated and profiled."""

    status_code = 409
    code = "not_ready"


class ProtocolMismatchError(ModellessError):
    """An invocation or a reply of another protocol version (``modelless.serving.invocation``): the
    gateway and a worker of different releases, which refuse each other rather than misread."""

    status_code = 502
    code = "protocol_mismatch"


class ServiceUnavailableError(ModellessError):
    """Something the request needs is down or busy now: worth retrying. The API answers 503 with
    a ``Retry-After`` header of ``retry_after_s`` (a ``retry_after_s`` detail where the error
    gives one, else the class's)."""

    status_code = 503
    code = "unavailable"
    retry_after_s = 1


class PlannerUnavailableError(ModellessError):
    """The pipeline planner cannot run in this process: its solver is not installed (the AWS
    gateway's package leaves scipy out to keep its cold start short)."""

    status_code = 501
    code = "planner_unavailable"


# --- The metadata store --------------------------------------------------------------------------


class StoreUnavailableError(ServiceUnavailableError):
    """The metadata store did not answer (refused, timed out, still loading its data): what was
    asked could not be read or written. Requests that need only what this process read earlier
    (a known app's key, profiles and workers) are served from it meanwhile."""

    code = "store_unavailable"
    retry_after_s = 2


class StoreEmptiedError(ServiceUnavailableError):
    """The metadata store answers but has lost what was registered in it (it came back empty,
    without persistence): serving on would treat every app, key and model as never registered."""

    code = "store_emptied"
    retry_after_s = 30


# --- Serving: the worker, its batches, the dispatcher's attempts ---------------------------------


class NoFreeSlotError(ConflictError):
    code = "no_free_slot"


class InstanceDrainingError(ServiceUnavailableError):
    """The instance is being unloaded (or just was): another instance or the Lambda tier serves
    the query (a 503, which the dispatcher retries elsewhere)."""

    code = "instance_draining"


class BatchTimeoutError(ServiceUnavailableError):
    """A request's batch did not complete within the batcher's bounded wait."""

    code = "batch_timeout"


class BatcherClosedError(ServiceUnavailableError):
    """The variant's batcher was closed (its instance was unloaded) before the request entered."""

    code = "batcher_closed"


class WorkerUnreachableError(ServiceUnavailableError):
    """The chosen worker did not answer: the dispatcher may retry elsewhere."""

    code = "worker_unreachable"


class WorkerBusyError(ServiceUnavailableError):
    """The worker answered 503 (its batch did not complete in time, it is overloaded or shutting
    down): another place may serve the query. Keeps the worker's own error code."""

    code = "worker_busy"


class QueryFailedError(ServiceUnavailableError):
    """Every attempt to run a query failed and nowhere else could take it: names each attempt."""

    code = "compute_unavailable"


class DeadlineExceededError(ServiceUnavailableError):
    """The query's budget plus its grace passed before any attempt answered."""

    code = "deadline_exceeded"


# --- Offline jobs --------------------------------------------------------------------------------


class InvalidJobError(BadRequestError):
    """An offline job that cannot run as asked (bad paths, outputs that would re-trigger it)."""

    code = "invalid_job"


class S3AccessDeniedError(ForbiddenError):
    """S3 answered 403: this deployment's credentials may not use the bucket (or the object)."""

    code = "s3_access_denied"

    def __init__(self, bucket: str, action: str, key: str | None = None) -> None:
        where = f"s3://{bucket}/{key}" if key is not None else f"bucket {bucket!r}"
        super().__init__(
            f"the service may not {action} {where} (S3 answered 403 Access Denied): grant this "
            f"deployment's role (the offline function's, or the gateway's in the embedded stack) "
            f"s3:ListBucket on the bucket and s3:GetObject/s3:PutObject on its objects, or use a "
            f"bucket it may already use (`modelless allow-buckets` only says which buckets an app "
            f"may ask for; it grants no S3 permission)",
            bucket=bucket,
        )


class OfflineInputError(Exception):
    """One offline input that cannot be used: recorded in the job's summary, the job goes on (not an
    API error: no request fails for it)."""


class SettingsError(ValueError):
    """A setting (``MODELLESS_*`` in the environment) whose value cannot be used: the message names
    the variable, what it must be and what it was (``modelless.config``). Raised where settings
    are read, before anything is served."""
