"""The `modelless` command: its typer app, the global options, and the one place where a
command's end becomes its exit code (``ModellessGroup.main``)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Annotated, Any

import httpx
import typer
from typer.core import TyperGroup

from modelless.cli.core import (
    DEFAULT_URL,
    EXIT_CODES_HELP,
    CommandError,
    ExitCode,
    OutputFormat,
    Session,
    exit_code_for,
    report_error,
)
from modelless.client import ModellessClientError

HELP = f"""The command-line tool over the modelless HTTP API.

\b
    modelless create-app digits
    modelless register --app digits --name digits-cnn --model cnn.onnx --valset val.npz
    modelless query --app digits --latency 5 --accuracy 0.95 --inputs sample.npy
    modelless variants --app digits
    modelless --output json jobs --app digits
    modelless offline-query --app digits --input s3://b/in/ --output s3://b/out/ --accuracy 0.9 --wait
    modelless job status JOB_ID --app digits --wait

The server URL comes from --url, $MODELLESS_URL or the embedded stack's .modelless/stack.json;
app keys from --api-key, $MODELLESS_API_KEY or .modelless/credentials.json (written by create-app).
With --output json every command prints only JSON on stdout (errors as the API's
{{"error": {{...}}}} on stderr); progress goes to stderr.

{EXIT_CODES_HELP}
"""


class ModellessGroup(TyperGroup):
    """The root command: whatever a command ends with (a result, a usage error, an API error, a
    lost server) becomes one line (or JSON) on stderr and an exit code from ``ExitCode``, here
    only, for ``main`` and for ``typer.testing.CliRunner`` alike."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        session = extra.pop("obj", None) or Session()
        argv = list(sys.argv[1:] if args is None else args)
        try:
            result = super().main(
                argv, prog_name or "modelless", complete_var, standalone_mode=False, obj=session, **extra
            )
            code = result if isinstance(result, int) else ExitCode.OK
        except typer.Abort:
            code = ExitCode.REFUSED
        except typer.TyperException as error:  # click's UsageError and the like
            _report_usage(error, _output_of(session, argv))
            code = getattr(error, "exit_code", ExitCode.USAGE)
        except (CommandError, ModellessClientError, httpx.HTTPError, TimeoutError) as error:
            report_error(error, _output_of(session, argv))
            code = exit_code_for(error)
        if standalone_mode:
            sys.exit(code)
        return code


def _output_of(session: Session, argv: list[str]) -> OutputFormat:
    """The output format, also of a command whose options did not parse (the global options
    had not been read yet): ``--output json`` / ``-o json`` anywhere before the command."""
    if session.output == "json":
        return "json"
    for flag, value in itertools.pairwise(argv):
        if flag in {"--output", "-o"} and value == "json":
            return "json"
    return "json" if "--output=json" in argv else "table"


def _report_usage(error: typer.TyperException, output: OutputFormat) -> None:
    message = error.format_message()
    if output == "json":
        report_error(CommandError(ExitCode.USAGE, message, "usage_error"), output)
        return
    context = getattr(error, "ctx", None)
    if context is not None:
        print(context.get_usage(), file=sys.stderr)
        print(f"Try '{context.command_path} --help' for help.", file=sys.stderr)
    print(f"error: {message}", file=sys.stderr, flush=True)


app = typer.Typer(
    name="modelless",
    cls=ModellessGroup,
    help=HELP,
    no_args_is_help=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def root(
    context: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(help=f"server URL (default: $MODELLESS_URL, .modelless/stack.json, {DEFAULT_URL})"),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(help="the app's API key (default: $MODELLESS_API_KEY or saved credentials)"),
    ] = None,
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--output",
            "-o",
            help="table: text and tables for people; json: only JSON on stdout, for scripts",
        ),
    ] = "table",
) -> None:
    session: Session = context.obj
    session.url, session.api_key, session.output = url, api_key, output


def session_of(context: typer.Context) -> Session:
    session: Session = context.find_root().obj
    return session


def main(argv: list[str] | None = None) -> None:
    """`modelless ...`: returns when the command succeeds; else raises ``SystemExit`` with its
    exit code (``ExitCode``), its error already on stderr."""
    code = typer.main.get_command(app).main(argv, "modelless", standalone_mode=False)
    if code:
        raise SystemExit(code)


def parse_args(argv: list[str]) -> SimpleNamespace:
    """What ``argv``'s command would run with, without running it: its arguments (global ones
    included) and ``run``, its handler. A usage error raises ``SystemExit(2)`` after its message."""
    session = Session(capture=True)
    code = typer.main.get_command(app).main(argv, "modelless", standalone_mode=False, obj=session)
    if code or session.captured is None:
        raise SystemExit(code or ExitCode.USAGE)
    return session.captured
