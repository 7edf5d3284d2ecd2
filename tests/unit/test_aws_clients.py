"""``modelless.aws_clients.client``: boto3's own client by default, localstack-client's session
when ``MODELLESS_AWS=localstack``; the endpoint, region and credentials each one ends up with (no
request is made)."""

from __future__ import annotations

import pytest

from modelless import aws_clients
from modelless.exceptions import SettingsError


@pytest.fixture(autouse=True)
def no_aws_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODELLESS_AWS", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "LOCALSTACK_HOST", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_a_client_is_by_default_boto3s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    s3 = aws_clients.client("s3")
    assert s3.meta.endpoint_url == "https://s3.eu-west-1.amazonaws.com"
    assert s3.meta.region_name == "eu-west-1"

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")  # moto's server in the tests
    assert aws_clients.client("sqs").meta.endpoint_url == "http://127.0.0.1:5000"


def test_options_reach_boto3() -> None:
    sqs = aws_clients.client("sqs", region_name="ap-south-1", endpoint_url="http://127.0.0.1:9")
    assert (sqs.meta.region_name, sqs.meta.endpoint_url) == ("ap-south-1", "http://127.0.0.1:9")


def test_localstack_clients_go_to_localstacks_edge_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELLESS_AWS", "localstack")
    # Every service at the one edge endpoint (localstack-client's default), in the standard region
    # and with the standard credentials.
    for service in ("s3", "sqs", "lambda", "autoscaling"):
        made = aws_clients.client(service)
        assert made.meta.endpoint_url == "http://localhost:4566", service
        assert made.meta.region_name == "eu-west-1"
    credentials = aws_clients.client("s3")._request_signer._credentials
    assert (credentials.access_key, credentials.secret_key) == ("testing", "testing")

    monkeypatch.setenv("LOCALSTACK_HOST", "127.0.0.1:4599")
    assert aws_clients.client("s3").meta.endpoint_url == "http://127.0.0.1:4599"
    # The standard variable wins: the tests name their LocalStack with it, as with moto.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4566")
    assert aws_clients.client("s3").meta.endpoint_url == "http://127.0.0.1:4566"


def test_localstack_without_standard_settings_uses_its_test_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELLESS_AWS", "LocalStack")  # any case
    for name in ("AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    s3 = aws_clients.client("s3")
    assert s3.meta.region_name == "us-east-1"
    assert s3._request_signer._credentials.access_key == "test"
    monkeypatch.setenv("AWS_REGION", "eu-central-1")  # the Lambda runtime's variable
    assert aws_clients.client("s3").meta.region_name == "eu-central-1"


@pytest.mark.parametrize("value", ["", "aws", " AWS "])
def test_aws_is_the_default_target(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MODELLESS_AWS", value)
    assert aws_clients.aws_target() == "aws"


def test_an_unknown_target_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELLESS_AWS", "moto")
    with pytest.raises(SettingsError, match=r"MODELLESS_AWS must be 'aws' or 'localstack', got 'moto'"):
        aws_clients.client("s3")
