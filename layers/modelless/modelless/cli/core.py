"""What every command shares: the session (global options), the client, saved app keys, the
output modes and the one table of exit codes with the errors that map to them."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import httpx

from modelless.client import Client, ModellessClientError
from modelless.config import get_client_settings

DEFAULT_URL = "http://127.0.0.1:8080"

OutputFormat = Literal["table", "json"]


class ExitCode(IntEnum):
    """What a `modelless` command's exit status means (docs/OPERATIONS.md, `modelless --help`)."""

    OK = 0
    # The service refused the request (an API error 4xx other than 404), or the work it was asked
    # for ended failed (a registration or an offline job).
    REFUSED = 1
    # Bad options or arguments, or a local file that cannot be used; `register` (and a wait on an
    # offline job) also ends with 2 when it gives up waiting: the work goes on server-side.
    USAGE = 2
    # The service could not answer: no connection, a timeout, or a 5xx.
    UNAVAILABLE = 3
    # What the command names does not exist (404: an app, model, registration, job, pipeline).
    NOT_FOUND = 4


EXIT_CODES_HELP = """\b
Exit codes:
  0  ok
  1  the service refused the request (4xx), or the registration or job failed
  2  usage error: bad options, a local file that cannot be used; and register (or
     a --wait on a job) giving up waiting: the work goes on server-side
  3  the service is unavailable: no connection, a timeout, a 5xx
  4  not found (404): no such app, model, registration, job or pipeline"""


class CommandError(Exception):
    """A command that ends with ``exit_code``: ``message`` on stderr (or, with ``--output json``,
    the API's error shape with ``code`` and ``details``)."""

    def __init__(
        self,
        exit_code: int,
        message: str,
        code: str = "error",
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message
        self.code = code
        self.details = details or {}


class UsageProblem(CommandError):
    """Options that parse but do not go together, or a local file the command cannot use."""

    def __init__(self, message: str) -> None:
        super().__init__(ExitCode.USAGE, message, "usage_error")


def exit_code_for(error: BaseException) -> int:
    """The exit code of a command that ended with ``error``: the one mapping from the client's
    errors to exit codes."""
    if isinstance(error, CommandError):
        return error.exit_code
    if isinstance(error, ModellessClientError):
        if error.status == 404:
            return ExitCode.NOT_FOUND
        return ExitCode.UNAVAILABLE if error.status >= 500 else ExitCode.REFUSED
    if isinstance(error, httpx.HTTPError | TimeoutError | ConnectionError):
        return ExitCode.UNAVAILABLE
    return ExitCode.REFUSED


def error_body(error: BaseException) -> dict[str, Any]:
    """``error`` in the API's one error shape, ``{"error": {"code", "message", "details"?}}``."""
    if isinstance(error, ModellessClientError | CommandError):
        code, message, details = error.code, error.message, error.details
    elif isinstance(error, httpx.HTTPError | TimeoutError | ConnectionError):
        code, message, details = "unavailable", f"{type(error).__name__}: {error}", {}
    else:
        code, message, details = "error", str(error), {}
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return {"error": body}


def report_error(error: BaseException, output: OutputFormat) -> None:
    """``error`` on stderr: the API's error shape with ``--output json``, else a line (and the
    server's details, one per line)."""
    if output == "json":
        print(json.dumps(error_body(error)), file=sys.stderr, flush=True)
        return
    if isinstance(error, UsageProblem):
        print(f"error: {error.message}", file=sys.stderr, flush=True)
        return
    if isinstance(error, CommandError):
        print(error.message, file=sys.stderr, flush=True)
        return
    if isinstance(error, httpx.HTTPError):
        print(f"error: could not reach the server ({type(error).__name__}: {error})", file=sys.stderr)
        return
    print(f"error: {error}", file=sys.stderr)
    for key, value in getattr(error, "details", {}).items():
        print(f"  {key}: {value}", file=sys.stderr)


# --- the session: global options, what a command's handler gets -------------------------------


Handler = Callable[[Any], None]


@dataclass
class Session:
    """One run of the command: the global options, and (``capture``) whether to record the
    handler and its arguments instead of running it (``modelless.cli.parse_args``)."""

    url: str | None = None
    api_key: str | None = None
    output: OutputFormat = "table"
    capture: bool = False
    captured: SimpleNamespace | None = field(default=None, repr=False)

    def run(self, command: str, handler: Handler, **values: Any) -> None:
        """Run ``handler`` with the arguments of ``command``: the global options and its own
        (``--json`` of the commands that had it before ``--output`` is ``--output json``)."""
        if values.get("json"):
            self.output = "json"
        args = SimpleNamespace(command=command, url=self.url, api_key=self.api_key, output_format=self.output)
        vars(args).update(values)
        if self.capture:
            args.run = handler
            self.captured = args
            return
        handler(args)


def wants_json(args: Any) -> bool:
    return bool(args.output_format == "json")


# --- the client and saved keys -----------------------------------------------------------------


def state_dir() -> Path:
    return get_client_settings().state_dir


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def save_app_key(app_id: str, key: str) -> None:
    path = state_dir() / "credentials.json"
    keys = _read_json(path)
    keys[app_id] = key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(keys, indent=2))
    os.chmod(path, 0o600)


def load_app_key(app_id: str) -> str | None:
    return get_client_settings().api_key or _read_json(state_dir() / "credentials.json").get(app_id)


def client_for(args: Any) -> Client:
    """The client a command's arguments name: the server URL from --url, $MODELLESS_URL or the
    embedded stack's stack.json; the app key from --api-key, $MODELLESS_API_KEY or the one
    create-app saved; the admin key from $MODELLESS_ADMIN_KEY or the embedded stack's."""
    settings = get_client_settings()
    stack = _read_json(settings.state_dir / "stack.json")
    url = args.url or settings.url or stack.get("url") or DEFAULT_URL
    admin_key = settings.admin_key or stack.get("admin_key")
    api_key = args.api_key or (load_app_key(args.app) if getattr(args, "app", None) else None)
    return Client(url, api_key=api_key, admin_key=admin_key)


def open_client(args: Any) -> Client:
    """``modelless.cli._client(args)``, looked up on each call: the one place tests put a fake
    client (or one over an in-process API) in front of every command."""
    from modelless import cli

    client: Client = cli._client(args)
    return client


# --- output --------------------------------------------------------------------------------------


def print_json(value: Any) -> None:
    """``value`` as JSON on stdout, nothing else: what ``--output json`` scripts read."""
    sys.stdout.write(json.dumps(value, indent=2) + "\n")
    sys.stdout.flush()


def print_table(rows: list[dict[str, Any]], columns: list[str], empty: str | None = None) -> None:
    """A table on stdout: a rich table on a terminal; elsewhere (a file, a pipe) the plain padded
    columns of ``format_table``, one row a line, whatever the width, for scripts that read it.
    ``empty``: the line printed instead of a table without rows (None: the header alone)."""
    from modelless.cli.text import format_table

    if not rows and empty is not None:
        print(empty)
        return
    if not sys.stdout.isatty():
        print(format_table(rows, columns))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(*columns, header_style="bold", show_edge=False, pad_edge=False)
    for row in rows:
        # Text, not markup: cells hold names and messages, whose brackets are theirs.
        table.add_row(*(Text(str(row.get(column, ""))) for column in columns))
    Console(highlight=False).print(table)
