"""The command-line tool's pure helpers and its argument parsing (no server involved)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from modelless import cli
from modelless.cli import (
    format_table,
    load_inputs,
    parse_args,
    progress_bar,
    registration_lines,
    variant_rows,
)
from modelless.types import VariantProfile


def variant_json(
    variant_id: str,
    *,
    model: str = "m",
    p50: dict[int, float] | None = None,
    p99: dict[int, float] | None = None,
    accuracy: float = 0.91234,
    load_ms: float = 12.34,
    size_bytes: int = 2_500_000,
    peak_mb: float = 33.33,
    price_per_second: float = 0.001,
    request_price: float = 2e-7,
    hardware: str = "cpu-x",
    on_target: bool = True,
) -> dict[str, Any]:
    """A variant as the API returns it: JSON, so batch-size keys are strings."""
    profile = VariantProfile(
        variant_id=variant_id,
        app_id="app",
        model_name=model,
        pool="cpu",
        precision="fp32",
        opt_level="all",
        threads=1,
        artifact_key="k",
        size_bytes=size_bytes,
        load_latency_ms=load_ms,
        latency_p50_ms=p50 or {1: 0.5, 8: 2.0},
        latency_p99_ms=p99 or {1: 1.0, 8: 4.0},
        peak_memory_mb=peak_mb,
        accuracy=accuracy,
        price_per_second=price_per_second,
        request_price=request_price,
        hardware=hardware,
        measured_on_target=on_target,
    )
    data: dict[str, Any] = json.loads(profile.to_json())
    return data


# --- progress_bar -----------------------------------------------------------------------------


def test_progress_bar_partway() -> None:
    status = {"total": 4, "done": 1, "status": "profiling", "message": "profiled fp32 at 1 thread(s)"}
    assert progress_bar(status, width=8) == "[##......] 1/4 profiling: profiled fp32 at 1 thread(s)"


def test_progress_bar_complete() -> None:
    status = {"total": 6, "done": 6, "status": "ready", "message": "6 variants profiled"}
    assert progress_bar(status, width=10) == "[##########] 6/6 ready: 6 variants profiled"


@pytest.mark.parametrize("total", [0, None])
def test_progress_bar_unknown_total(total: int | None) -> None:
    status = {"total": total, "done": 0, "status": "queued", "message": "queued for variant generation"}
    assert progress_bar(status, width=5) == "[.....] 0/? queued: queued for variant generation"


def test_progress_bar_default_width() -> None:
    bar = progress_bar({"total": 2, "done": 1, "status": "profiling", "message": ""})
    assert bar.startswith("[" + "#" * 15 + "." * 15 + "]")


# --- format_table -----------------------------------------------------------------------------


def test_format_table_pads_columns_to_the_widest_cell() -> None:
    rows = [{"name": "a", "value": "1"}, {"name": "longer", "value": "22"}]
    assert format_table(rows, ["name", "value"]).splitlines() == [
        "name    value",
        "a       1    ",
        "longer  22   ",
    ]


def test_format_table_missing_cells_are_blank_and_extra_keys_ignored() -> None:
    rows = [{"a": "x", "ignored": "zzzzzzzz"}, {"b": "yy"}]
    assert format_table(rows, ["a", "b"]).splitlines() == ["a  b ", "x    ", "   yy"]


def test_format_table_with_no_rows_is_the_header() -> None:
    assert format_table([], ["variant", "accuracy"]) == "variant  accuracy"


def test_format_table_stringifies_values() -> None:
    assert format_table([{"n": 12345, "f": 0.5}], ["n", "f"]).splitlines()[1] == "12345  0.5"


# --- variant_rows -----------------------------------------------------------------------------


def test_variant_rows_formats_one_variant() -> None:
    [row] = variant_rows([variant_json("app/m/fp32-all/cpu", on_target=False)])

    assert row == {
        "variant": "app/m/fp32-all/cpu",
        "accuracy": "0.9123",
        "p50@1 ms": "0.500",
        "p99@1 ms": "1.000",
        "p50@8 ms": "2.000",
        "sat q/s": "0",
        "best batch": "-",
        "load ms": "12.3",
        "MB": "2.50",
        "peak MB": "33.3",
        # (0.001 $/s * 1.0 ms p99 / 1000 + 2e-7 $) per query, per million queries: the same
        # p99-based cost that selection ranks variants by
        "$/1M q": "1.2000",
        "measured on": "cpu-x (not target hw)",
    }


def test_variant_rows_show_throughput_best_batch_and_imported_profiles() -> None:
    imported = variant_json("gpu", hardware="g4dn.xlarge T4")
    imported.update(saturation_qps=12345.6, max_useful_batch=32, imported=True)
    [row] = variant_rows([imported])
    assert row["sat q/s"] == "12346"
    assert row["best batch"] == "32"
    assert row["measured on"] == "g4dn.xlarge T4 (imported)"


def test_registration_lines_show_each_model_with_its_bar() -> None:
    lines = registration_lines(
        [{"modelName": "m1", "status": "profiling", "done": 3, "total": 6, "message": "profiled x"}]
    )
    assert lines[0].startswith("m1 ")
    assert "3/6 profiling: profiled x" in lines[0]


def test_parser_knows_watch_registrations_and_import() -> None:
    watch = parse_args(["variants", "--app", "a", "--watch", "--interval", "0.5"])
    assert watch.watch and watch.interval == 0.5
    assert parse_args(["registrations", "--app", "a"]).app == "a"
    imported = parse_args(["import-profiles", "--app", "a", "--model", "m", "gpu.json"])
    assert (imported.model, imported.file) == ("m", "gpu.json")
    assert (
        parse_args(
            ["register", "--app", "a", "--name", "n", "--model", "f", "--valset", "v", "--metric", "top5"]
        ).metric
        == "top5"
    )


def test_variant_rows_on_target_hardware_has_no_note() -> None:
    [row] = variant_rows([variant_json("v", hardware="c5.large")])
    assert row["measured on"] == "c5.large"


def test_variant_rows_largest_batch_column_follows_the_profile() -> None:
    [row] = variant_rows([variant_json("v", p50={1: 0.1, 64: 3.25}, p99={1: 0.2, 64: 4.0})])
    assert row["p50@64 ms"] == "3.250"
    assert "p50@8 ms" not in row


def test_variant_rows_sorted_by_model_then_p99_at_batch_one() -> None:
    variants = [
        variant_json("b-slow", model="b", p99={1: 9.0, 8: 20.0}),
        variant_json("a-slow", model="a", p99={1: 5.0, 8: 10.0}),
        variant_json("b-fast", model="b", p99={1: 1.0, 8: 2.0}),
        variant_json("a-fast", model="a", p99={1: 2.0, 8: 4.0}),
    ]
    assert [r["variant"] for r in variant_rows(variants)] == ["a-fast", "a-slow", "b-fast", "b-slow"]


def test_variant_rows_of_nothing() -> None:
    assert variant_rows([]) == []


def test_variant_rows_render_as_a_table() -> None:
    rows = variant_rows([variant_json("v1"), variant_json("v2")])
    table = format_table(rows, list(rows[0])).splitlines()
    assert len(table) == 3
    assert table[0].split()[:2] == ["variant", "accuracy"]
    assert table[1].startswith("v1") and table[2].startswith("v2")


# --- parse_args -------------------------------------------------------------------------------


def parse(*argv: str) -> Any:
    return parse_args(list(argv))


def test_parse_create_app() -> None:
    args = parse("create-app", "digits")
    assert (args.command, args.app_id, args.url, args.api_key) == ("create-app", "digits", None, None)
    assert args.run is cli._cmd_create_app


def test_parse_global_options_before_the_command() -> None:
    args = parse("--url", "http://h:1", "--api-key", "mlk_x", "variants", "--app", "digits")
    assert (args.url, args.api_key, args.command) == ("http://h:1", "mlk_x", "variants")


def test_parse_register() -> None:
    args = parse("register", "--app", "digits", "--name", "cnn", "--model", "cnn.onnx", "--valset", "val.npz")
    assert (args.app, args.name, args.model, args.valset, args.no_wait) == (
        "digits",
        "cnn",
        "cnn.onnx",
        "val.npz",
        False,
    )
    assert args.run is cli._cmd_register
    assert parse(
        "register", "--app", "a", "--name", "n", "--model", "m", "--valset", "v", "--no-wait"
    ).no_wait


def test_parse_status() -> None:
    args = parse("status", "abc123", "--app", "digits")
    assert (args.registration_id, args.app) == ("abc123", "digits")
    assert args.run is cli._cmd_status


def test_parse_query_with_targets() -> None:
    args = parse("query", "--app", "digits", "--inputs", "x.npy", "--latency", "5", "--accuracy", "0.95")
    assert (args.app, args.inputs, args.latency, args.accuracy, args.model, args.json) == (
        "digits",
        "x.npy",
        5.0,
        0.95,
        None,
        False,
    )
    assert isinstance(args.latency, float)
    assert args.run is cli._cmd_query


def test_parse_query_naming_the_model() -> None:
    args = parse("query", "--app", "digits", "--inputs", "x.json", "--model", "cnn", "--json")
    assert (args.model, args.json, args.latency, args.accuracy) == ("cnn", True, None, None)


def test_parse_variants() -> None:
    args = parse("variants", "--app", "digits", "--model", "cnn")
    assert (args.app, args.model) == ("digits", "cnn")
    assert args.run is cli._cmd_variants
    assert parse("variants", "--app", "digits").model is None


def test_parse_workers() -> None:
    args = parse("workers", "--app", "digits")
    assert args.app == "digits"
    assert args.run is cli._cmd_workers
    assert parse("workers").app is None  # every worker, with the admin key


def test_workers_lines_show_the_tuned_configuration_and_scale() -> None:
    instance = {"variant_id": "digits/m/v1", "state": "active", "qps": 3.0}
    assert cli.instance_summary(instance) == "digits/m/v1[active 3.0qps]"  # an older worker's report
    untuned = {**instance, "intra_threads": 0, "inter_threads": 0, "concurrency": 0, "latency_scale": 0.0}
    assert cli.instance_summary(untuned) == "digits/m/v1[active 3.0qps]"
    unmeasured = {**untuned, "intra_threads": 2, "inter_threads": 1, "concurrency": 2}
    assert cli.instance_summary(unmeasured) == "digits/m/v1[active 3.0qps tuned 2x1x2]"
    measured = {**unmeasured, "latency_scale": 1.25}
    assert cli.instance_summary(measured) == "digits/m/v1[active 3.0qps tuned 2x1x2 1.25x profile]"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["create-app"],
        ["register", "--app", "a", "--name", "n", "--model", "m"],  # no --valset
        ["status", "abc"],  # no --app
        ["query", "--app", "a"],  # no --inputs
        ["query", "--app", "a", "--inputs", "x", "--latency", "fast"],
        ["variants"],
    ],
)
def test_parse_refuses_incomplete_commands(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


# --- inputs and saved keys --------------------------------------------------------------------


def test_load_inputs_from_json_npy_and_npz(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "x.json").write_text(json.dumps(array.tolist()))
    np.save(tmp_path / "x.npy", array)
    np.savez(tmp_path / "x.npz", inputs=array, labels=np.array([0, 1]))

    assert load_inputs(tmp_path / "x.json") == array.tolist()
    np.testing.assert_array_equal(load_inputs(tmp_path / "x.npy"), array)
    np.testing.assert_array_equal(load_inputs(tmp_path / "x.npz"), array)


def test_load_inputs_never_unpickles(tmp_path: Path) -> None:
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        load_inputs(tmp_path / "objects.npy")


def test_saved_app_keys_are_private_and_per_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELLESS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MODELLESS_API_KEY", raising=False)

    cli.save_app_key("a", "mlk_a")
    cli.save_app_key("b", "mlk_b")

    path = tmp_path / "state" / "credentials.json"
    assert json.loads(path.read_text()) == {"a": "mlk_a", "b": "mlk_b"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert cli.load_app_key("a") == "mlk_a"
    assert cli.load_app_key("b") == "mlk_b"
    assert cli.load_app_key("c") is None
    monkeypatch.setenv("MODELLESS_API_KEY", "mlk_env")
    assert cli.load_app_key("a") == "mlk_env"
