"""Request-body limits enforced as the body arrives, declared Content-Length or not.

A declared size over the limit is refused before anything is read; a chunked body is counted as
it streams and refused the moment it passes the limit, so an oversized upload never gets parsed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    """``setting_for_path``: the setting (environment variable) that sets a path's limit, named in
    its 413 so that the caller knows what to raise (None: the 413 names none)."""

    def __init__(
        self,
        app: ASGIApp,
        limit_for_path: Callable[[str], int],
        setting_for_path: Callable[[str], str | None] = lambda path: None,
    ) -> None:
        self.app = app
        self.limit_for_path = limit_for_path
        self.setting_for_path = setting_for_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for_path(scope["path"])
        setting = self.setting_for_path(scope["path"])
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(
                send,
                f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes",
                limit,
                setting,
            )
            return
        received = 0
        started = False
        refused = False

        async def counting_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit and not refused:
                    # Answer 413 now and tell the app the client went away, so that it stops
                    # reading; whatever it tries to send afterwards is dropped.
                    refused = True
                    if not started:
                        await _refuse(
                            send, f"request body exceeds the limit of {limit} bytes", limit, setting
                        )
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, counting_receive, guarded_send)


async def _refuse(send: Send, message: str, limit: int, setting: str | None = None) -> None:
    details: dict[str, Any] = {"limit": limit}
    if setting is not None:
        message += f" (set by {setting})"
        details["setting"] = setting
    # Connection: close, or the server would go on reading (and dropping) the whole body.
    await send_error(
        send, 413, {"code": "payload_too_large", "message": message, "details": details}, close=True
    )


async def send_error(send: Send, status: int, error: dict[str, Any], close: bool = False) -> None:
    """A whole reply in the API's error shape (``{"error": error}``), sent by a middleware
    before any route runs."""
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
