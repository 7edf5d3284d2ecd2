"""Domain errors. Each carries the HTTP status it maps to; the API maps them in one place."""

from __future__ import annotations

from typing import Any


class ModellessError(Exception):
    """Base of every error a caller can cause or observe."""

    status_code = 500
    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

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


class TargetsUnreachableError(ModellessError):
    """No variant meets the query's latency and accuracy (INFaaS §4.1): names the closest one."""

    status_code = 422
    code = "targets_unreachable"


class NotReadyError(ModellessError):
    """The model exists but its variants are still being generated and profiled."""

    status_code = 409
    code = "not_ready"


class ServiceUnavailableError(ModellessError):
    status_code = 503
    code = "unavailable"
