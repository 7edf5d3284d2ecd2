"""The `modelless` command's contract with scripts and shells (typer's CliRunner, a fake client):
``--output json`` prints only JSON on stdout and errors in the API's shape on stderr, each kind
of failure has its exit code (``modelless.cli.ExitCode``), tables are plain text off a terminal
and rich ones on it, and shell completion is there."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from modelless import cli
from modelless.cli.core import print_table
from modelless.client import ModellessClientError

JOB = {
    "jobId": "job-1",
    "status": "completed",
    "done": 4,
    "total": 4,
    "errors": 0,
    "succeeded": 4,
    "throughput": 2.0,
    "elapsedSeconds": 2.0,
    "activeSeconds": 2.0,
    "runs": 1,
    "variant": "a/m/fp32/cpu-1t",
    "inputPath": "s3://b/in/",
    "outputPath": "s3://b/out/",
    "message": "done",
    "source": "api",
}


class FakeClient:
    """Answers the calls the tests make; ``error``: what every call raises instead."""

    def __init__(self, error: BaseException | None = None, job: dict[str, Any] | None = None) -> None:
        self.error = error
        self.job_reply = job or JOB

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def _answer(self, value: Any) -> Any:
        if self.error is not None:
            raise self.error
        return value

    def jobs(self) -> list[dict[str, Any]]:
        return list(self._answer([JOB]))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self._answer(self.job_reply))

    def wait_for_job(self, job_id: str, on_progress: Any, poll_s: float) -> dict[str, Any]:
        on_progress({**self.job_reply, "status": "running", "done": 2})
        on_progress(self._answer(self.job_reply))
        return dict(self.job_reply)

    def registration(self, registration_id: str) -> dict[str, Any]:
        return dict(
            self._answer({"status": "profiling", "done": 1, "total": 4, "message": "profiling variants"})
        )

    def selection(self, app_id: str) -> str:
        return str(self._answer("exp3"))

    def offline_query(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.offline_call = (args, kwargs)
        return dict(self._answer({"jobId": "job-1", "status": "queued"}))

    def register_model(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(self._answer({"registrationId": "r1", "status": "queued"}))


def invoke(monkeypatch: pytest.MonkeyPatch, client: FakeClient, *argv: str) -> tuple[int, str, str]:
    """``modelless ARGV`` with ``client``: exit code, stdout, stderr."""
    monkeypatch.setattr(cli, "_client", lambda args: client)
    result = CliRunner().invoke(cli.app, list(argv))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


# --- --output json ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["jobs", "--app", "a"], {"jobs": [JOB]}),
        (["job", "status", "job-1", "--app", "a"], JOB),
        (["selection", "--app", "a"], {"appID": "a", "policy": "exp3"}),
        (
            ["status", "r1", "--app", "a"],
            {"status": "profiling", "done": 1, "total": 4, "message": "profiling variants"},
        ),
    ],
)
def test_output_json_prints_only_the_json_on_stdout(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: Any
) -> None:
    for flag in (["--output", "json"], ["-o", "json"], ["--output=json"]):
        code, out, err = invoke(monkeypatch, FakeClient(), *flag, *argv)
        assert (code, json.loads(out), err) == (0, expected, "")


def test_a_commands_own_json_flag_is_the_same_as_output_json(monkeypatch: pytest.MonkeyPatch) -> None:
    _, by_flag, _ = invoke(monkeypatch, FakeClient(), "job", "status", "job-1", "--app", "a", "--json")
    _, by_option, _ = invoke(monkeypatch, FakeClient(), "-o", "json", "job", "status", "job-1", "--app", "a")
    assert json.loads(by_flag) == json.loads(by_option) == JOB


def test_waiting_in_json_mode_keeps_progress_on_stderr_and_the_result_on_stdout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = invoke(
        monkeypatch,
        FakeClient(),
        "-o",
        "json",
        "job",
        "status",
        "job-1",
        "--app",
        "a",
        "--wait",
        "--interval",
        "0",
    )
    assert code == 0 and json.loads(out) == JOB
    assert "2/4" in err and "4/4 100% completed" in err


def test_the_table_output_is_plain_text_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(monkeypatch, FakeClient(), "jobs", "--app", "a")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == [
        "job",
        "status",
        "done",
        "failed",
        "inputs/s",
        "input",
        "source",
    ]
    assert lines[1].split() == ["job-1", "completed", "4/4", "0", "2.0", "s3://b/in/", "api"]
    assert "\x1b" not in out and "━" not in out


def test_on_a_terminal_a_table_is_a_rich_one(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr("sys.stdout", screen)
    monkeypatch.setenv("COLUMNS", "120")
    print_table([{"variant": "a/m/v1[active]", "accuracy": "0.91"}], ["variant", "accuracy"])
    text = screen.getvalue()
    assert "━" in text  # rich's header rule
    assert "a/m/v1[active]" in text  # a cell's brackets are text, not markup
    assert "accuracy" in text and "0.91" in text


# --- exit codes and errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "exit_code", "code"),
    [
        (
            ModellessClientError(400, "invalid_request", "bad", {"field": "x"}),
            cli.ExitCode.REFUSED,
            "invalid_request",
        ),
        (ModellessClientError(403, "forbidden", "not yours"), cli.ExitCode.REFUSED, "forbidden"),
        (
            ModellessClientError(422, "targets_unreachable", "no variant"),
            cli.ExitCode.REFUSED,
            "targets_unreachable",
        ),
        (ModellessClientError(404, "not_found", "no job job-1"), cli.ExitCode.NOT_FOUND, "not_found"),
        (ModellessClientError(503, "unavailable", "store down"), cli.ExitCode.UNAVAILABLE, "unavailable"),
        (httpx.ConnectError("connection refused"), cli.ExitCode.UNAVAILABLE, "unavailable"),
        (httpx.ReadTimeout("timed out"), cli.ExitCode.UNAVAILABLE, "unavailable"),
    ],
)
def test_each_failure_has_its_exit_code_and_its_error_in_the_apis_shape(
    monkeypatch: pytest.MonkeyPatch, error: BaseException, exit_code: int, code: str
) -> None:
    got, out, err = invoke(
        monkeypatch, FakeClient(error), "-o", "json", "job", "status", "job-1", "--app", "a"
    )
    assert (got, out) == (exit_code, "")
    body = json.loads(err)
    assert set(body) == {"error"} and body["error"]["code"] == code and body["error"]["message"]
    assert set(body["error"]) <= {"code", "message", "details"}
    if isinstance(error, ModellessClientError) and error.details:
        assert body["error"]["details"] == error.details

    got, out, err = invoke(monkeypatch, FakeClient(error), "job", "status", "job-1", "--app", "a")
    assert (got, out) == (exit_code, "")
    assert err.startswith("error: ") and "Traceback" not in err


def test_exit_codes_are_documented_in_the_help(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, _ = invoke(monkeypatch, FakeClient(), "--help")
    assert code == 0 and "Exit codes:" in out
    for exit_code in cli.ExitCode:
        assert f"\n    {int(exit_code)}  " in out  # a line of the table


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["query", "--app", "a"],  # no --inputs
        ["query", "--app", "a", "--inputs", "x.npy", "--latency", "fast"],
        ["register", "--app", "a", "--name", "n", "--model", "m", "--valset", "v", "--metric", "top3"],
        ["--output", "yaml", "jobs", "--app", "a"],
        ["offline-query", "--app", "a", "--input", "s3://b/i/", "--output", "s3://b/o/"],  # no target
        ["feedback", "--app", "a", "q1", "3"],  # a label without --label
        ["feedback", "--app", "a", "q1"],  # neither a label nor a reward
        ["query", "--app", "a", "--inputs", "x.txt"],
    ],
)
def test_usage_errors_exit_2_with_the_reason(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    code, out, err = invoke(monkeypatch, FakeClient(), *argv)
    assert code == 2 and out == ""  # cli.ExitCode.USAGE
    assert "error:" in err and "Traceback" not in err
    code, out, err = invoke(monkeypatch, FakeClient(), "-o", "json", *argv)
    assert code == 2 and out == "" and json.loads(err)["error"]["code"] == "usage_error"


def test_watch_is_for_people(monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = invoke(monkeypatch, FakeClient(), "-o", "json", "variants", "--app", "a", "--watch")
    assert (code, out) == (2, "") and "--watch" in json.loads(err)["error"]["message"]


def test_a_failed_job_exits_1_after_its_report(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = {**JOB, "status": "failed", "message": "no variant meets 0.99"}
    code, out, err = invoke(
        monkeypatch, FakeClient(job=failed), "job", "status", "job-1", "--app", "a", "--wait"
    )
    assert code == cli.ExitCode.REFUSED and out.startswith("job job-1: failed (no variant meets 0.99)")
    assert "job job-1 failed" in err
    code, out, err = invoke(
        monkeypatch, FakeClient(job=failed), "-o", "json", "job", "status", "job-1", "--app", "a", "--wait"
    )
    assert code == 1 and json.loads(out) == failed
    assert json.loads(err.splitlines()[-1])["error"]["code"] == "job_failed"  # after the progress lines


def test_register_no_wait_in_json_prints_the_accepted_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["register", "--app", "a", "--name", "m", "--model", "s3://b/m.onnx", "--valset", "s3://b/v.npz"]
    code, out, _ = invoke(monkeypatch, FakeClient(), "-o", "json", *argv, "--no-wait")
    assert code == 0 and json.loads(out) == {"registrationId": "r1", "status": "queued"}


def test_an_offline_query_through_a_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient()
    argv = ["offline-query", "--app", "a", "--input", "s3://b/i/", "--output", "s3://b/o/", "--pipeline", "p"]
    code, out, _ = invoke(monkeypatch, client, "-o", "json", *argv)
    assert code == 0 and json.loads(out) == {"jobId": "job-1", "status": "queued"}
    assert client.offline_call == (
        ("s3://b/i/", "s3://b/o/", "a"),
        {"accuracy": None, "model_name": None, "pipeline": "p"},
    )


def test_feedback_takes_one_label_per_row_after_label() -> None:
    assert cli.parse_args(["feedback", "--app", "a", "q1", "--label", "3", "1", "4"]).label == [3, 1, 4]
    assert cli.parse_args(["feedback", "--app", "a", "q1", "--label", "3"]).label == [3]
    assert cli.parse_args(["feedback", "--app", "a", "--stats"]).label is None


def test_offline_querys_output_prefix_is_not_the_output_format() -> None:
    args = cli.parse_args(
        [
            "-o",
            "json",
            "offline-query",
            "--app",
            "a",
            "--input",
            "s3://b/i/",
            "--output",
            "s3://b/o/",
            "--model",
            "m",
        ]
    )
    assert (args.output, args.output_format) == ("s3://b/o/", "json")


# --- shell completion -----------------------------------------------------------------------------


def test_shell_completion_script_and_completions() -> None:
    shown = CliRunner().invoke(cli.app, ["--show-completion", "bash"])
    assert shown.exit_code == 0 and "_MODELLESS_COMPLETE=complete_bash" in shown.stdout
    completed = CliRunner().invoke(
        cli.app,
        [],
        env={"_MODELLESS_COMPLETE": "complete_bash", "COMP_WORDS": "modelless reg", "COMP_CWORD": "1"},
    )
    assert completed.stdout.split() == ["register", "registrations"]
    options = CliRunner().invoke(
        cli.app,
        [],
        env={
            "_MODELLESS_COMPLETE": "complete_bash",
            "COMP_WORDS": "modelless register --me",
            "COMP_CWORD": "2",
        },
    )
    assert options.stdout.split() == ["--metric"]
