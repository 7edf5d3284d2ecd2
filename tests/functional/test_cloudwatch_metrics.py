"""The gateway's EMF metrics are valid CloudWatch metrics: a real query's EMF record (what
Powertools prints in Lambda, and CloudWatch Logs turns into metrics) is put to an emulated
CloudWatch (moto, and LocalStack in its lane) by the rules of the embedded metric format, and read
back by name, dimension and unit through CloudWatch's own API. A name, unit or dimension that
CloudWatch refuses, or a record that does not say what it measures, fails here, not in AWS."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from modelless import aws_clients
from tests.unit.test_api import Api, images, seed_digits
from tests.unit.test_api import api as api

pytestmark = pytest.mark.localstack

APP = "metrics-app"


def emf_records(text: str) -> list[dict[str, Any]]:
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "_aws" in record:
            records.append(record)
    return records


def metric_data(record: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """CloudWatch's reading of one EMF record: per directive, each metric with its dimension set's
    values, its unit and its value(s) (the embedded metric format's specification)."""
    [directive] = record["_aws"]["CloudWatchMetrics"]
    [dimension_set] = directive["Dimensions"]
    dimensions = [{"Name": name, "Value": str(record[name])} for name in dimension_set]
    data = []
    for metric in directive["Metrics"]:
        values = record[metric["Name"]]
        for value in values if isinstance(values, list) else [values]:
            data.append(
                {
                    "MetricName": metric["Name"],
                    "Dimensions": dimensions,
                    "Unit": metric.get("Unit", "None"),
                    "Value": float(value),
                    "Timestamp": datetime.fromtimestamp(record["_aws"]["Timestamp"] / 1000, UTC),
                }
            )
    return directive["Namespace"], data


def test_a_querys_emf_metrics_are_accepted_and_read_back_by_cloudwatch(
    api: Api, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    headers = api.create_app(APP)
    seed_digits(api, APP)
    capsys.readouterr()
    reply = api.client.post(
        "/v1/online_query",
        json={"appID": APP, "inputs": images(1).tolist(), "accuracy": 0.8},
        headers=headers,
    )
    assert reply.status_code == 200, reply.text
    variant = reply.json()["variant"]

    [record] = [r for r in emf_records(capsys.readouterr().out) if "QueryLatency" in r]
    namespace, data = metric_data(record)
    assert namespace == "Modelless"
    # A namespace of this test's own, so that reruns against one emulator never mix.
    namespace = f"Modelless-test-{uuid.uuid4().hex[:8]}"
    cloudwatch = aws_clients.client("cloudwatch", region_name="us-east-1")
    cloudwatch.put_metric_data(Namespace=namespace, MetricData=data)

    listed = cloudwatch.list_metrics(Namespace=namespace)["Metrics"]
    names = {m["MetricName"] for m in listed}
    assert {"QueryLatency", "SelectionLatency"} <= names
    latency = next(d for d in data if d["MetricName"] == "QueryLatency")
    assert latency["Unit"] == "Milliseconds" and latency["Dimensions"][0]["Value"] == variant
    stats = cloudwatch.get_metric_statistics(
        Namespace=namespace,
        MetricName="QueryLatency",
        Dimensions=latency["Dimensions"],
        StartTime=latency["Timestamp"] - timedelta(minutes=5),
        EndTime=latency["Timestamp"] + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum", "SampleCount"],
        Unit="Milliseconds",
    )["Datapoints"]
    assert stats, "CloudWatch holds the query's latency under its variant"
    assert stats[0]["Maximum"] == pytest.approx(latency["Value"]) and stats[0]["SampleCount"] == 1
