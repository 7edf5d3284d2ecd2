"""The simulator's command line (``python -m sim``): a user's variants file and load in, a cost and
SLO forecast out; bad arguments are refused with a message, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from sim.cli import main
from sim.problems import POOLS, _profile


def write_variants(path: Path, accuracies: tuple[float, ...] = (0.80, 0.85, 0.90, 0.95)) -> Path:
    rng = random.Random(1)
    rows = []
    for index, accuracy in enumerate(accuracies):
        profile = _profile(rng, 0, POOLS[0], index, 20.0, 100.0)
        profile = dataclasses.replace(
            profile,
            app_id="demo",
            model_name="m",
            pool="cpu",
            variant_id=f"m/v{index}/cpu",
            accuracy=accuracy,
            saturation_qps=1000 / profile.latency_p50_ms[1],
            max_useful_batch=1,
            price_per_second=0.0000236,
        )
        rows.append(dataclasses.asdict(profile))
    path.write_text(json.dumps({"appID": "demo", "variants": rows}))
    return path


def test_a_flat_load_is_forecast_with_costs_and_violations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = write_variants(tmp_path / "variants.json")
    code = main(
        ["--variants", str(variants), "--rate", "20", "--duration", "60", "--latency-ms", "100",
         "--accuracy", "0.85", "--output", "json"]
    )  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["load"]["mean_qps"] == pytest.approx(20.0)
    assert 900 <= report["queries"] <= 1500  # Poisson arrivals at 20 q/s for 60 s
    assert 0 <= report["violations"] <= report["queries"]
    assert report["cost_aws_dollars"] > 0
    assert report["variants_not_measured_on_target"] == 4


def test_an_unreachable_accuracy_shows_as_violations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = write_variants(tmp_path / "variants.json")
    main(
        [
            "--variants",
            str(variants),
            "--rate",
            "5",
            "--duration",
            "30",
            "--accuracy",
            "0.99",
            "--output",
            "json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["queries"] > 0
    assert report["violations"] == report["queries"]  # no variant is that accurate: every query refused


def test_a_trace_is_replayed_at_the_mean_rate_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = write_variants(tmp_path / "variants.json")
    trace = tmp_path / "arrivals.csv"
    stamps = [
        f"2024-05-10 00:00:{s:02d}.{ms:03d}"
        for s in range(30)
        for ms in range(0, 1000, 250 if s < 15 else 500)
    ]
    trace.write_text("TIMESTAMP,ContextTokens\n" + "".join(f"{t},1\n" for t in stamps))
    main(["--variants", str(variants), "--trace", str(trace), "--mean-qps", "12", "--latency-ms", "100",
          "--output", "json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["load"]["mean_qps"] == pytest.approx(12.0)
    assert report["load"]["peak_qps"] > report["load"]["mean_qps"]  # the trace's shape is kept


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rate", "-1"], "--rate must be a positive number"),
        (["--mean-qps", "5"], "--mean-qps scales a --trace"),
        (["--model", "nope"], "is not among the variants' models"),
        (["--max-workers", "tpu=2"], "expected POOL=N"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    variants = write_variants(tmp_path / "variants.json")
    with pytest.raises(SystemExit) as stopped:
        main(["--variants", str(variants), *extra])
    assert stopped.value.code != 0
    assert message in capsys.readouterr().err + str(stopped.value.code)


def test_a_file_without_profiles_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "variants.json"
    empty.write_text('{"appID": "demo", "variants": []}')
    with pytest.raises(SystemExit, match="holds no variant profiles"):
        main(["--variants", str(empty)])
