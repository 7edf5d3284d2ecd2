"""``modelless``: the command-line tool over the HTTP API (typer; ``modelless --help``, whose
text, with examples and where the server URL and keys come from, is ``modelless.cli.app.HELP``).
Exit codes: ``ExitCode`` (modelless.cli.core); docs/OPERATIONS.md ("The CLI").

Modules: ``app`` (the typer app, global options, exit codes), ``core`` (session, client, output,
errors), ``text`` (pure formatting), ``progress`` (progress bars and waits), ``files`` (local
inputs), and one per command group: ``models``, ``jobs``, ``pipelines``, ``admin``.
"""

from __future__ import annotations

# Each command module registers its commands on ``app`` when imported.
from modelless.cli import admin, jobs, models, pipelines
from modelless.cli.admin import _cmd_allow_buckets, _cmd_cache, _cmd_create_app, _cmd_workers
from modelless.cli.app import app, main, parse_args
from modelless.cli.core import (
    DEFAULT_URL,
    CommandError,
    ExitCode,
    UsageProblem,
    client_for,
    exit_code_for,
    load_app_key,
    save_app_key,
)
from modelless.cli.files import load_inputs
from modelless.cli.jobs import _cmd_job_status, _cmd_jobs, _cmd_offline_query
from modelless.cli.models import (
    _cmd_feedback,
    _cmd_import_profiles,
    _cmd_query,
    _cmd_register,
    _cmd_registrations,
    _cmd_selection,
    _cmd_status,
    _cmd_variants,
)
from modelless.cli.pipelines import _cmd_pipelines
from modelless.cli.progress import JobDisplay, RegistrationDisplay, follow_job, follow_registration
from modelless.cli.text import (
    format_duration,
    format_table,
    instance_summary,
    job_progress_line,
    job_report,
    progress_bar,
    registration_lines,
    registration_outcome,
    variant_rows,
    variant_states,
)

# The client every command opens (``core.open_client`` looks it up here on each call): tests
# replace it with a fake, or with a client over an in-process API.
_client = client_for

__all__ = [
    "DEFAULT_URL",
    "CommandError",
    "ExitCode",
    "JobDisplay",
    "RegistrationDisplay",
    "UsageProblem",
    "_cmd_allow_buckets",
    "_cmd_cache",
    "_cmd_create_app",
    "_cmd_feedback",
    "_cmd_import_profiles",
    "_cmd_job_status",
    "_cmd_jobs",
    "_cmd_offline_query",
    "_cmd_pipelines",
    "_cmd_query",
    "_cmd_register",
    "_cmd_registrations",
    "_cmd_selection",
    "_cmd_status",
    "_cmd_variants",
    "_cmd_workers",
    "admin",
    "app",
    "exit_code_for",
    "follow_job",
    "follow_registration",
    "format_duration",
    "format_table",
    "instance_summary",
    "job_progress_line",
    "job_report",
    "jobs",
    "load_app_key",
    "load_inputs",
    "main",
    "models",
    "parse_args",
    "pipelines",
    "progress_bar",
    "registration_lines",
    "registration_outcome",
    "save_app_key",
    "variant_rows",
    "variant_states",
]
