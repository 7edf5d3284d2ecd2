"""template.yaml's operations: X-Ray tracing of every function (and each handler's Powertools
Tracer), log groups with a retention, the HTTP API's throttling and access log, and the alarms
(API 5xx, function errors and throttles, the failure queues' depth). scripts/sam-build --lint
checks the template against CloudFormation's and SAM's schemas; this checks that it says what
the project means."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from infra.build.lambda_artifacts import load_template

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template(ROOT / "template.yaml")


def of_type(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == kind}


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = of_type(template, "AWS::Serverless::Function")
    assert len(found) >= 6  # the gateway, two Lambda tiers, the scaler, the registrar, offline
    return found


def test_every_function_is_traced_with_xray(template: dict[str, Any]) -> None:
    assert template["Globals"]["Function"]["Tracing"] == "Active"
    for name, function in functions(template).items():
        assert function["Properties"].get("Tracing", "Active") == "Active", name


def decorators(app: Path) -> list[str]:
    tree = ast.parse(app.read_text())
    [handler] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "handler"]
    return [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in handler.decorator_list]


def test_every_deployed_handler_opens_its_segment_with_the_powertools_tracer(
    template: dict[str, Any],
) -> None:
    code_dirs = {function["Properties"]["CodeUri"] for function in functions(template).values()}
    assert code_dirs == {f"functions/{app.parent.name}/" for app in (ROOT / "functions").glob("*/app.py")}
    for code_dir in code_dirs:
        assert "tracer.capture_lambda_handler" in decorators(ROOT / code_dir / "app.py"), code_dir


def test_every_function_logs_to_a_log_group_with_the_retention_parameter(template: dict[str, Any]) -> None:
    groups = of_type(template, "AWS::Logs::LogGroup")
    retention = template["Parameters"]["LogRetentionDays"]
    assert retention["Default"] in retention["AllowedValues"]
    for name, group in groups.items():
        assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}, name
    used: list[str] = []
    for name, function in functions(template).items():
        group = function["Properties"]["LoggingConfig"]["LogGroup"]
        assert group["Ref"] in groups, name
        used.append(group["Ref"])
    assert len(set(used)) == len(used)  # one group per function


def test_the_http_api_is_throttled_and_logs_its_requests(template: dict[str, Any]) -> None:
    api = template["Globals"]["HttpApi"]
    assert api["DefaultRouteSettings"] == {
        "ThrottlingRateLimit": {"Ref": "ApiThrottlingRateLimit"},
        "ThrottlingBurstLimit": {"Ref": "ApiThrottlingBurstLimit"},
    }
    parameters = template["Parameters"]
    assert parameters["ApiThrottlingBurstLimit"]["Default"] >= parameters["ApiThrottlingRateLimit"]["Default"]
    [group, attribute] = api["AccessLogSettings"]["DestinationArn"]["Fn::GetAtt"].split(".")
    assert attribute == "Arn"
    assert template["Resources"][group]["Type"] == "AWS::Logs::LogGroup"
    assert "$context.requestId" in api["AccessLogSettings"]["Format"]
    # The gateway's event is the implicit API those globals apply to.
    assert template["Resources"]["Gateway"]["Properties"]["Events"]["Api"]["Type"] == "HttpApi"


def alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: r["Properties"] for name, r in of_type(template, "AWS::CloudWatch::Alarm").items()}


def test_every_alarm_notifies_the_alarm_topic_when_it_fires_and_clears(template: dict[str, Any]) -> None:
    assert template["Resources"]["AlarmTopic"]["Type"] == "AWS::SNS::Topic"
    found = alarms(template)
    assert found
    for name, alarm in found.items():
        assert alarm["AlarmActions"] == [{"Ref": "AlarmTopic"}], name
        assert alarm["OKActions"] == [{"Ref": "AlarmTopic"}], name
        assert alarm["TreatMissingData"] == "notBreaching", name  # no traffic is no fault


def test_the_api_5xx_alarm_watches_the_gateways_api(template: dict[str, Any]) -> None:
    [alarm] = [a for a in alarms(template).values() if a.get("Namespace") == "AWS/ApiGateway"]
    assert alarm["MetricName"] == "5xx"
    assert {"Name": "ApiId", "Value": {"Ref": "ServerlessHttpApi"}} in alarm["Dimensions"]
    assert alarm["Threshold"] == {"Ref": "Api5xxAlarmThreshold"}


@pytest.mark.parametrize("metric", ["Errors", "Throttles"])
def test_function_errors_and_throttles_alarms_cover_every_function(
    template: dict[str, Any], metric: str
) -> None:
    covering = []
    for alarm in alarms(template).values():
        stats = [m["MetricStat"]["Metric"] for m in alarm.get("Metrics", []) if "MetricStat" in m]
        if stats and all(s["Namespace"] == "AWS/Lambda" and s["MetricName"] == metric for s in stats):
            covering.append(alarm)
    [alarm] = covering
    watched = {
        s["MetricStat"]["Metric"]["Dimensions"][0]["Value"]["Ref"]
        for s in alarm["Metrics"]
        if "MetricStat" in s
    }
    assert watched == set(functions(template))
    [expression] = [m for m in alarm["Metrics"] if "Expression" in m]
    assert expression["ReturnData"] is True
    ids = {m["Id"] for m in alarm["Metrics"] if "MetricStat" in m}
    assert all(metric_id in expression["Expression"] for metric_id in ids)


def test_every_failure_queue_has_a_depth_alarm(template: dict[str, Any]) -> None:
    queues = set(of_type(template, "AWS::SQS::Queue"))
    assert queues >= {"RegistrarFailures", "OfflineFailures"}
    watched = {
        alarm["Dimensions"][0]["Value"]["Fn::GetAtt"].split(".")[0]
        for alarm in alarms(template).values()
        if alarm.get("Namespace") == "AWS/SQS"
    }
    assert watched == queues
    for alarm in alarms(template).values():
        if alarm.get("Namespace") == "AWS/SQS":
            assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
            assert alarm["Threshold"] == 1 and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
