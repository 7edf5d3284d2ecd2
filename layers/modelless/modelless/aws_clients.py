"""The boto3 clients the library makes (S3, SQS, Lambda, Auto Scaling), all from ``client``: the
one place that decides which AWS they talk to.

- By default, boto3's own client: its endpoint, region and credentials come from the standard AWS
  settings (``AWS_ENDPOINT_URL`` and ``AWS_ENDPOINT_URL_<SERVICE>`` included: an emulator such as
  moto's server or a LocalStack is reached that way too).
- ``MODELLESS_AWS=localstack``: a LocalStack, through ``localstack-client``'s session, whose
  endpoint is ``AWS_ENDPOINT_URL`` when set, else ``LOCALSTACK_HOST`` (default
  ``localhost:4566``), with the standard region and credentials when set, else LocalStack's test
  ones: nothing else needs configuring to run against a LocalStack (docs/OPERATIONS.md).

Read at each call, not once per process: a client is made once per object that holds it, and the
tests switch targets between tests.
"""

from __future__ import annotations

import os
from typing import Any, Literal, cast, get_args

from modelless.exceptions import SettingsError

AwsTarget = Literal["aws", "localstack"]
TARGET_VARIABLE = "MODELLESS_AWS"
# localstack-client's defaults where the standard variables are unset: any key is accepted by
# LocalStack (one that is not a 12-digit account id maps to its default account).
LOCALSTACK_DEFAULTS = {
    "aws_access_key_id": ("AWS_ACCESS_KEY_ID", "test"),
    "aws_secret_access_key": ("AWS_SECRET_ACCESS_KEY", "test"),
    "aws_session_token": ("AWS_SESSION_TOKEN", None),
    "region_name": ("AWS_DEFAULT_REGION", "us-east-1"),
}


def aws_target() -> AwsTarget:
    """Which AWS the clients talk to, from ``MODELLESS_AWS`` (default ``aws``: boto3's standard
    settings decide)."""
    value = os.environ.get(TARGET_VARIABLE, "").strip().lower() or "aws"
    if value not in get_args(AwsTarget):
        allowed = " or ".join(repr(v) for v in get_args(AwsTarget))
        raise SettingsError(f"{TARGET_VARIABLE} must be {allowed}, got {value!r}")
    return cast(AwsTarget, value)


def client(service_name: str, **options: Any) -> Any:
    """A boto3 client for ``service_name``, of the AWS ``MODELLESS_AWS`` names; ``options`` go to
    boto3 as they are (``config``, ``endpoint_url``…)."""
    if aws_target() == "localstack":
        return localstack_session().client(service_name, **options)
    import boto3  # here, not at the top: importing this module needs no boto3

    return boto3.client(service_name, **options)  # type: ignore[call-overload]


def localstack_session() -> Any:
    """localstack-client's session, with the standard region and credentials where they are set."""
    try:
        from localstack_client.session import Session
    except ImportError as missing:
        raise SettingsError(
            f"{TARGET_VARIABLE}=localstack needs the localstack-client package (modelless[aws])"
        ) from missing
    settings = {
        name: os.environ.get(variable) or default for name, (variable, default) in LOCALSTACK_DEFAULTS.items()
    }
    if region := os.environ.get("AWS_REGION"):
        settings["region_name"] = region
    return Session(**settings)
