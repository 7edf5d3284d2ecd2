"""``modelless register``'s sources: local files (streamed by the client), s3:// URIs (sent as
fields), the model's external data and the preprocessing recipe. No server: the client records
what it was asked to send."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modelless import cli


class RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __enter__(self) -> RecordingClient:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def register_model(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.calls.append((args, kwargs))
        return {"registrationId": "r1"}


def run_register(monkeypatch: pytest.MonkeyPatch, *options: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    client = RecordingClient()
    monkeypatch.setattr(cli, "_client", lambda args: client)
    args = cli.parse_args(["register", "--app", "a", "--name", "m", "--no-wait", *options])
    args.run(args)
    [call] = client.calls
    return call


def test_register_streams_local_files_and_sends_uris_as_they_are(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    (tmp_path / "m.onnx.data").write_bytes(b"weights")
    recipe = {"size": [224, 224], "channels": "RGB"}
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))

    args, kwargs = run_register(
        monkeypatch,
        "--model", str(tmp_path / "m.onnx"),
        "--model-data", str(tmp_path / "m.onnx.data"),
        "--valset", "s3://bucket/val.npz",
        "--preprocessing", str(tmp_path / "recipe.json"),
    )  # fmt: skip

    assert args == ("m", tmp_path / "m.onnx", "s3://bucket/val.npz", "a", "top1")
    assert kwargs == {"preprocessing": recipe, "model_data": tmp_path / "m.onnx.data"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--model", "missing.onnx", "--valset", "s3://b/v.npz"], "--model missing.onnx: no such file"),
        (
            ["--model", "s3://b/m.onnx", "--valset", "s3://b/v.npz", "--preprocessing", "none.json"],
            "none.json",
        ),
    ],
)
def test_register_refuses_what_it_cannot_send(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    with pytest.raises(cli.UsageProblem, match=message):
        run_register(monkeypatch, *options)
    # From the command line: the same message on stderr, a usage error's exit code, nothing sent.
    client = RecordingClient()
    monkeypatch.setattr(cli, "_client", lambda args: client)
    with pytest.raises(SystemExit) as caught:
        cli.main(["register", "--app", "a", "--name", "m", "--no-wait", *options])
    assert caught.value.code == 2  # cli.ExitCode.USAGE
    assert message in capsys.readouterr().err and client.calls == []
