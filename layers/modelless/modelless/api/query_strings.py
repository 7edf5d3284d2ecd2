"""One strict reading of every request's query string: a parameter given twice is a 400.

No operation takes a list in its query string, and Starlette (hence FastAPI and
``request.query_params``) resolves a repeated parameter silently by its last value, so
``?latency=5&latency=500`` would run with a target the caller may not have meant. The docs promise
that no target is silently ignored; this refuses the request, naming the parameter, before any
route reads it.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import parse_qsl

from modelless.api.limits import ASGIApp, Receive, Scope, Send, send_error
from modelless.exceptions import BadRequestError


def repeated_parameters(query_string: bytes) -> list[str]:
    """The names given more than once in ``query_string`` (as parsed by Starlette: ``&``
    separated, percent-decoded, blank values kept), in order of first appearance."""
    names = Counter(name for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))
    return [name for name, count in names.items() if count > 1]


def repeated_parameter_error(names: list[str]) -> BadRequestError:
    listed = ", ".join(repr(name) for name in names)
    return BadRequestError(
        f"query parameter {listed} is given more than once; give each at most once (no parameter "
        "takes a list, and none is resolved by picking one of its values)",
        parameters=names,
    )


class StrictQueryStringMiddleware:
    """Refuses (400, in the API's error shape) a request whose query string repeats a parameter."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            repeated = repeated_parameters(scope.get("query_string", b""))
            if repeated:
                await send_error(send, 400, repeated_parameter_error(repeated).to_dict())
                return
        await self.app(scope, receive, send)
