"""Each Lambda function's handler, invoked in-process with its real event shape (the samples under
events/), against a real Redis and the emulated AWS endpoint, through the boto3 code paths the
functions use in AWS: the gateway with HTTP API v2 events (health, app creation with the admin key
from Secrets Manager, a query served by the Lambda tier, a registration handed to the registrar),
the Lambda tier with its invocation payload and its variant in S3, the registrar with its job, the
scaler with a scheduled event against emulated Auto Scaling groups set up as template.yaml sets
them, and the offline function with an S3 ObjectCreated event straight from S3 (as template.yaml
wires the jobs bucket) and with its resume schedule's EventBridge event, its inputs and results in
the jobs bucket named as template.yaml names it and a real worker process running the inference.

The functions' own Lambda invocations (the gateway invoking the Lambda tier and the registrar) go
through ``InProcessLambda`` (see aws_kit): moto cannot run Lambda code without Docker.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import numpy as np
import onnxruntime as ort
import pytest

from infra.build.lambda_artifacts import load_template
from modelless.auth import hash_key
from modelless.catalog import LAMBDA_POOL, Placement, lambda_threads
from modelless.metadata.redis import RedisMetadataStore
from modelless.offline.jobs import RESULT_SUFFIX, JobSpec, output_key, summary_key
from modelless.scaling.ticks import MIN_TICK_RESERVE_S, SCHEDULE_S
from modelless.serving.invocation import Invocation, Reply
from modelless.types import JobStatus, ModelRecord, Registration, RegistrationStatus, VariantProfile
from tests.conftest import service_url
from tests.functional.aws_kit import (
    InProcessLambda,
    LambdaContext,
    fresh_import,
    multipart_parts,
    sample_event,
)
from tests.functional.offline_fixtures import Buckets, _empty_and_delete, redis_url
from tests.functional.test_scaler_function import seed as seed_scaling_load
from tests.functional.workers_kit import APP as OFFLINE_APP
from tests.functional.workers_kit import expected_logits, sample_inputs
from tests.models import linear_model

ROOT = Path(__file__).resolve().parents[2]
ADMIN_KEY = "admin-key-sample-0123456789abcdef"  # the key in events/http_api_create_app.json
APP_KEY = "mlk_sample-app-key-digits-0123456789abcdefghijk"  # events/http_api_online_query.json
APP, MODEL = "digits", "linear"
ARN = "arn:aws:lambda:us-east-1:123456789012:function"
# As template.yaml names them: the live alias of each memory size's function.
LAMBDA_TIER = {1769: f"{ARN}:modelless-CpuWorker1769:live", 3538: f"{ARN}:modelless-CpuWorker3538:live"}
REGISTRAR = "modelless-Registrar"


@dataclass
class Deployment:
    store: RedisMetadataStore
    s3: Any
    bucket: str
    lambdas: InProcessLambda

    def repository_keys(self, prefix: str) -> list[str]:
        listed = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=f"repository/{prefix}")
        return sorted(item["Key"].removeprefix("repository/") for item in listed.get("Contents", []))

    def create_app(self) -> None:
        self.store.create_app(APP, hash_key(APP_KEY))

    def lambda_tier(self) -> float:
        """The Lambda tier's two functions, each its own container (module instance); returns the
        longest container import, in ms."""
        longest = 0.0
        for memory in (1769, 3538):
            started = time.perf_counter()
            self.lambdas.register(LAMBDA_TIER[memory], fresh_import("functions.cpu_worker.app").handler)
            longest = max(longest, (time.perf_counter() - started) * 1000)
        return longest


@pytest.fixture
def deployment(
    aws_endpoint: str, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Deployment]:
    url = f"{service_url('MODELLESS_TEST_REDIS_URL')}?prefix=aws-{uuid.uuid4().hex[:10]}:"
    store = RedisMetadataStore.from_url(url)
    # The gateway's settings, as template.yaml gives them (in the Gateway function's environment).
    monkeypatch.setenv("MODELLESS_METADATA_URL", url)
    monkeypatch.setenv("MODELLESS_REPOSITORY_URL", f"s3://{s3_bucket}/repository")
    monkeypatch.setenv("MODELLESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MODELLESS_ADMIN_KEY", ADMIN_KEY)
    monkeypatch.setenv("MODELLESS_LAMBDA_FUNCTION", ",".join(f"{m}={f}" for m, f in LAMBDA_TIER.items()))
    monkeypatch.setenv("MODELLESS_REGISTRAR_FUNCTION", REGISTRAR)
    monkeypatch.setenv("MODELLESS_PROFILE_RUNS", "5")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    lambdas = InProcessLambda()
    lambdas.install()
    try:
        yield Deployment(store, boto3.client("s3", endpoint_url=aws_endpoint), s3_bucket, lambdas)
    finally:
        store.flush_namespace()
        store.close()


def gateway_call(gateway: Any, event: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    reply = gateway.handler(event, LambdaContext("modelless-Gateway", 1769))
    return reply["statusCode"], json.loads(reply["body"]), reply["headers"]


def get_event(path: str, key: str) -> dict[str, Any]:
    """A GET through the HTTP API: the health sample's shape, another path and the app's key."""
    event = sample_event("http_api_health.json")
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["headers"] = {**event["headers"], "x-api-key": key}
    return event


def query_event(latency: float) -> dict[str, Any]:
    event = sample_event("http_api_online_query.json")
    body = json.loads(event["body"])
    event["body"] = json.dumps({**body, "latency": latency})
    return event


def logits(model: bytes, inputs: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out: np.ndarray = session.run(None, {session.get_inputs()[0].name: inputs.astype(np.float32)})[0]
    return out


# --- gateway ----------------------------------------------------------------------------------


@pytest.mark.localstack
def test_gateway_answers_health_and_creates_apps(deployment: Deployment) -> None:
    gateway = fresh_import("functions.gateway.app")

    status, body, headers = gateway_call(gateway, sample_event("http_api_health.json"))
    assert (status, body) == (200, {"status": "ok"})
    assert headers["x-correlation-id"] == "corr-health-1"

    status, body, headers = gateway_call(gateway, sample_event("http_api_create_app.json"))
    assert status == 201, body
    assert body["appID"] == APP
    assert deployment.store.app_for_key(hash_key(body["apiKey"])) == APP  # only its hash is stored
    # No X-Correlation-Id header: API Gateway's request id stands for it.
    assert headers["x-correlation-id"] == "req-create-app-1"

    status, body, _ = gateway_call(gateway, sample_event("http_api_create_app.json"))
    assert status == 409, body
    refused = sample_event("http_api_create_app.json")
    refused["headers"]["authorization"] = "Bearer not-the-admin-key"
    assert gateway_call(gateway, refused)[0] == 401


@pytest.mark.localstack
def test_gateway_reads_the_admin_key_from_secrets_manager(
    deployment: Deployment, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As template.yaml deploys it: a generated secret, named to the gateway by its ARN.
    secrets = boto3.client("secretsmanager", endpoint_url=aws_endpoint)
    secret = secrets.create_secret(Name=f"modelless-admin-{uuid.uuid4().hex[:8]}", SecretString=ADMIN_KEY)
    monkeypatch.setenv("MODELLESS_ADMIN_KEY_SECRET", secret["ARN"])
    monkeypatch.delenv("MODELLESS_ADMIN_KEY")
    try:
        gateway = fresh_import("functions.gateway.app")

        status, body, _ = gateway_call(gateway, sample_event("http_api_create_app.json"))
        assert status == 201, body
        refused = sample_event("http_api_create_app.json")
        refused["headers"]["authorization"] = "Bearer not-the-admin-key"
        assert gateway_call(gateway, refused)[0] == 401
    finally:
        secrets.delete_secret(SecretId=secret["ARN"], ForceDeleteWithoutRecovery=True)


def lambda_variant(memory_mb: int, p99_ms: float, load_ms: float) -> VariantProfile:
    placement = Placement(LAMBDA_POOL, lambda_threads(memory_mb), memory_mb)
    return VariantProfile(
        variant_id=f"{APP}/{MODEL}/fp32_all/{placement.name}",
        app_id=APP,
        model_name=MODEL,
        pool=LAMBDA_POOL.name,
        precision="fp32",
        opt_level="all",
        threads=placement.threads,
        artifact_key=f"apps/{APP}/{MODEL}/variants/fp32_all.onnx",
        size_bytes=len(linear_model()),
        load_latency_ms=load_ms,
        latency_p50_ms={1: p99_ms / 2, 8: p99_ms},
        latency_p99_ms={1: p99_ms, 8: p99_ms * 2},
        peak_memory_mb=40.0,
        accuracy=0.93,
        price_per_second=placement.price_per_second,
        request_price=LAMBDA_POOL.request_price,
        hardware="test",
        measured_on_target=True,
        memory_mb=memory_mb,
        saturation_qps=1000.0,
        max_useful_batch=8,
    )


@pytest.mark.localstack
def test_gateway_query_is_served_by_the_lambda_tier_of_the_variants_memory(deployment: Deployment) -> None:
    # A model registered earlier: its record and profiles in Redis, its artifact in emulated S3.
    deployment.create_app()
    slow, fast = (
        lambda_variant(1769, p99_ms=15.0, load_ms=10.0),
        lambda_variant(3538, p99_ms=1.0, load_ms=10.0),
    )
    record = ModelRecord(APP, MODEL, "input", [1, 8, 8], "float32", 10, "reg-1", "src", True)
    registration = Registration("reg-1", APP, MODEL, RegistrationStatus.READY)
    deployment.store.add_model(record, registration)
    deployment.store.publish_variants(record, [slow, fast], registration)
    deployment.s3.put_object(
        Bucket=deployment.bucket, Key=f"repository/{slow.artifact_key}", Body=linear_model()
    )
    container_import_ms = deployment.lambda_tier()
    gateway = fresh_import("functions.gateway.app")
    inputs = np.asarray(json.loads(sample_event("http_api_online_query.json")["body"])["inputs"])
    expected = logits(linear_model(), inputs[None])

    status, first, headers = gateway_call(gateway, sample_event("http_api_online_query.json"))
    assert status == 200, first
    assert headers["x-correlation-id"] == "corr-query-1"
    assert first["tier"] == "lambda"
    chosen = next(v for v in (slow, fast) if v.variant_id == first["variant"])
    # The function of the chosen variant's memory size ran it, with the gateway's payload.
    invocation = deployment.lambdas.invocations[-1]
    assert (invocation.function, invocation.invocation_type) == (
        LAMBDA_TIER[chosen.memory_mb],
        "RequestResponse",
    )
    assert invocation.event["memory_mb"] == chosen.memory_mb
    assert invocation.event["correlation_id"] == "corr-query-1"
    # The container's init, as it measured it: its module's import, not this test process's age.
    assert first["coldStart"] is True and 0 < first["timingsMs"]["cold_start_ms"] <= container_import_ms
    assert first["predictions"] == [int(np.argmax(expected))]
    np.testing.assert_allclose(first["outputs"], expected, rtol=1e-4, atol=1e-4)

    # 12 ms: only the 3,538 MB variant (10 ms load + 1 ms) meets it, so its function serves it.
    status, tight, _ = gateway_call(gateway, query_event(latency=12))
    assert status == 200, tight
    assert tight["variant"] == fast.variant_id
    assert deployment.lambdas.invocations[-1].function == LAMBDA_TIER[3538]

    # Warm: the same container again, its session reused.
    status, again, _ = gateway_call(gateway, query_event(latency=12))
    assert status == 200, again
    assert again["coldStart"] is False and again["timingsMs"]["load_ms"] == 0

    # Targets nothing meets: 422 naming the closest variant, nothing invoked.
    invoked = len(deployment.lambdas.invocations)
    status, body, _ = gateway_call(gateway, query_event(latency=0.01))
    assert status == 422, body
    assert len(deployment.lambdas.invocations) == invoked


# --- registration: gateway -> S3 + Redis -> registrar -------------------------------------------


@pytest.mark.localstack
def test_registration_is_stored_in_s3_and_handed_to_the_registrar(deployment: Deployment) -> None:
    deployment.create_app()
    registrar = fresh_import("functions.registrar.app")
    deployment.lambdas.register(REGISTRAR, registrar.handler)
    gateway = fresh_import("functions.gateway.app")
    event = sample_event("http_api_register_model.json")

    status, body, _ = gateway_call(gateway, event)
    assert status == 202, body
    assert body["status"] == "queued"
    # The upload is in the model repository (emulated S3), byte for byte.
    uploaded = multipart_parts(event)
    prefix = f"apps/{APP}/{MODEL}/"
    assert deployment.repository_keys(prefix) == [f"{prefix}source.onnx", f"{prefix}valset.npz"]
    stored = deployment.s3.get_object(Bucket=deployment.bucket, Key=f"repository/{prefix}source.onnx")
    assert stored["Body"].read() == uploaded["model"]
    # ...and the registrar was invoked asynchronously with the job: the sample's shape.
    [job] = deployment.lambdas.queued
    assert (job.function, job.invocation_type) == (REGISTRAR, "Event")
    assert set(job.event) == set(sample_event("registrar_job.json"))
    assert job.event["registrationId"] == body["registrationId"]
    assert job.event["correlationId"] == "corr-register-1"

    # Lambda's event queue delivers it: variants built, profiled, pruned and published.
    started = time.monotonic()
    [result] = deployment.lambdas.deliver()
    assert result["status"] == "ready", result["message"]
    registered_in_s = time.monotonic() - started
    variants = deployment.store.list_variants(APP, MODEL)
    assert variants and len(variants) == result["variants"]
    keys = set(deployment.repository_keys(prefix))
    assert all(v.artifact_key in keys for v in variants)
    assert {v.pool for v in variants} >= {"cpu", "lambda-cpu"}

    # Its progress, read through the gateway, as the CLI reads it.
    status, progress, _ = gateway_call(
        gateway, get_event(f"/v1/registrations/{body['registrationId']}", APP_KEY)
    )
    assert status == 200, progress
    assert progress["status"] == "ready" and progress["done"] == progress["total"] > 0

    # A duplicate delivery of the same event does not profile again.
    again = registrar.handler(job.event, LambdaContext(REGISTRAR))
    assert again["status"] == "ready"
    assert time.monotonic() - started < registered_in_s + 5


@pytest.mark.localstack
def test_registration_that_cannot_reach_the_registrar_leaves_nothing_behind(deployment: Deployment) -> None:
    deployment.create_app()  # no registrar function: the asynchronous invoke is refused (404)
    gateway = fresh_import("functions.gateway.app")

    status, body, _ = gateway_call(gateway, sample_event("http_api_register_model.json"))

    assert status == 503, body
    registration_id = body["error"]["details"]["registration_id"]
    registration = deployment.store.get_registration(registration_id)
    assert registration is not None and registration.status is RegistrationStatus.FAILED
    assert deployment.store.get_model(APP, MODEL) is None
    assert deployment.repository_keys(f"apps/{APP}/") == []


@pytest.mark.localstack
def test_registrar_refuses_a_job_for_no_registration(deployment: Deployment) -> None:
    registrar = fresh_import("functions.registrar.app")
    reply = registrar.handler(sample_event("registrar_job.json"), LambdaContext(REGISTRAR))
    assert reply["statusCode"] == 404
    assert reply["error"]["code"] == "not_found"
    malformed = registrar.handler({"appID": APP}, LambdaContext(REGISTRAR))
    assert malformed["statusCode"] == 400


# --- the Lambda tier --------------------------------------------------------------------------


@pytest.mark.localstack
def test_cpu_worker_runs_its_payload_with_the_variant_from_s3(deployment: Deployment) -> None:
    event = sample_event("cpu_worker_invoke.json")
    variant = VariantProfile.from_json(event["variant"])
    deployment.s3.put_object(
        Bucket=deployment.bucket, Key=f"repository/{variant.artifact_key}", Body=linear_model()
    )
    imported_at = time.perf_counter()
    worker = fresh_import("functions.cpu_worker.app")
    import_ms = (time.perf_counter() - imported_at) * 1000

    first = worker.handler(event, LambdaContext("modelless-CpuWorker1769", variant.memory_mb))
    second = worker.handler(event, LambdaContext("modelless-CpuWorker1769", variant.memory_mb))

    assert first["statusCode"] == 200, first
    assert second["statusCode"] == 200, second
    cold, warm = Reply.from_message(first), Reply.from_message(second)
    assert cold.cold_start is True and cold.load_ms > 0
    # Imported into this (long-running) process, the container's init is the module's own import
    # and set-up, never this process's age.
    assert 0 < cold.init_ms <= import_ms
    assert warm.cold_start is False and warm.init_ms == 0 and warm.load_ms == 0
    inputs = Invocation.from_message(event).inputs
    np.testing.assert_allclose(cold.outputs, logits(linear_model(), inputs), rtol=1e-5)
    gone = VariantProfile.from_json(event["variant"].replace(variant.artifact_key, "apps/none/model.onnx"))
    gone = dataclasses.replace(gone, variant_id=f"{variant.variant_id}-gone")
    missing = {**event, "variant_id": gone.variant_id, "variant": gone.to_json()}
    refused = worker.handler(missing, LambdaContext("modelless-CpuWorker1769", variant.memory_mb))
    assert refused["statusCode"] == 404


# --- the scaler, with the template's settings -------------------------------------------------


def template_environment(function: str, values: dict[str, str]) -> dict[str, str]:
    """A function's environment in template.yaml, as CloudFormation would resolve it: parameters
    at their defaults unless ``values`` names them, ``values`` for resources and pseudo
    parameters (``StackUuid`` for the stack id's UUID), and the intrinsic functions the template
    uses evaluated; what ``values`` does not name stays a ``${...}`` reference."""
    template = load_template(ROOT / "template.yaml")
    defaults = {name: spec.get("Default", "") for name, spec in template.get("Parameters", {}).items()}
    names: dict[str, Any] = {"AWS::Partition": "aws", **defaults, **values}
    if "StackUuid" in values:
        stack_id = f"arn:aws:cloudformation:us-east-1:123456789012:stack/x/{values['StackUuid']}"
        names.setdefault("AWS::StackId", stack_id)

    def ref(name: str) -> Any:
        value = names.get(name, f"${{{name}}}")
        kind = template.get("Parameters", {}).get(name, {}).get("Type", "")
        if kind == "CommaDelimitedList" and isinstance(value, str):
            return value.split(",") if value else [""]
        return value

    def substitute(text: str, local: dict[str, Any]) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            return str(local[name]) if name in local else str(ref(name))

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def evaluate(node: Any) -> Any:
        if isinstance(node, list):
            return [evaluate(item) for item in node]
        if not isinstance(node, dict) or len(node) != 1:
            return node
        ((function_name, argument),) = node.items()
        if function_name == "Ref":
            return ref(argument)
        if function_name == "Fn::Sub":
            if isinstance(argument, list):
                local = {name: evaluate(value) for name, value in argument[1].items()}
                return substitute(argument[0], local)
            return substitute(argument, {})
        if function_name == "Fn::Join":
            delimiter, items = argument
            joined = evaluate(items)
            return delimiter.join(str(item) for item in joined)
        if function_name == "Fn::Split":
            delimiter, text = argument
            return str(evaluate(text)).split(delimiter)
        if function_name == "Fn::Select":
            index, items = argument
            return evaluate(items)[int(index)]
        if function_name == "Fn::GetAtt":
            return f"${{{argument if isinstance(argument, str) else '.'.join(argument)}}}"
        return node

    variables = template["Resources"][function]["Properties"]["Environment"]["Variables"]
    return {name: str(evaluate(value)) for name, value in variables.items()}


@pytest.fixture
def pool_groups(aws_endpoint: str) -> Iterator[dict[str, str]]:
    """One Auto Scaling group per pool, as template.yaml makes them (gpu and accel empty)."""
    ec2 = boto3.client("ec2", endpoint_url=aws_endpoint)
    autoscaling = boto3.client("autoscaling", endpoint_url=aws_endpoint)
    suffix = uuid.uuid4().hex[:8]
    template = ec2.create_launch_template(
        LaunchTemplateName=f"modelless-{suffix}",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "c5.large"},
    )["LaunchTemplate"]
    groups = {pool: f"modelless-{pool}-{suffix}" for pool in ("cpu", "gpu", "accel")}
    for pool, name in groups.items():
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name,
            LaunchTemplate={"LaunchTemplateId": template["LaunchTemplateId"], "Version": "$Latest"},
            MinSize=0,
            MaxSize=4 if pool == "cpu" else 0,
            AvailabilityZones=["us-east-1a"],
            Tags=[{"Key": "modelless:pool", "Value": pool, "PropagateAtLaunch": True}],
        )
    try:
        yield groups
    finally:
        for name in groups.values():
            autoscaling.delete_auto_scaling_group(AutoScalingGroupName=name, ForceDelete=True)
        ec2.delete_launch_template(LaunchTemplateId=template["LaunchTemplateId"])


def test_scaler_scales_the_template_pools_on_its_schedule(
    deployment: Deployment, pool_groups: dict[str, str], monkeypatch: pytest.MonkeyPatch, aws_endpoint: str
) -> None:
    seed_scaling_load(deployment.store)
    parameters = {"CpuPoolMaxSize": "4", "GpuPoolMaxSize": "0", "AccelPoolMaxSize": "0"}
    parameters |= {"CpuPoolMinSize": "0", "GpuPoolMinSize": "0", "AccelPoolMinSize": "0"}
    parameters |= {
        "CpuPool": pool_groups["cpu"],
        "GpuPool": pool_groups["gpu"],
        "AccelPool": pool_groups["accel"],
    }
    environment = template_environment("Scaler", parameters)
    for name in (
        "MODELLESS_POOL_GROUPS",
        "MODELLESS_MAX_WORKERS",
        "MODELLESS_MIN_WORKERS",
        "MODELLESS_SCALER_PERIOD_S",
    ):
        monkeypatch.setenv(name, environment[name])
    scaler = fresh_import("functions.scaler.app")
    # Ticks every 10 s until the next minute's invocation, which the timeout leaves room for:
    # a tick starting 50 s in, with a tick's reserve after it.
    assert scaler.scaler.ticks.period_s == 10.0
    properties = load_template(ROOT / "template.yaml")["Resources"]["Scaler"]["Properties"]
    assert properties["Timeout"] >= SCHEDULE_S - scaler.scaler.ticks.period_s + 2 * MIN_TICK_RESERVE_S
    assert properties["Events"]["Tick"]["Properties"]["Schedule"] == f"rate({SCHEDULE_S / 60:.0f} minute)"
    assert properties["EventInvokeConfig"]["MaximumRetryAttempts"] == 0  # no second run of a window

    summary = scaler.handler(sample_event("scheduled.json"), LambdaContext("modelless-Scaler", 1769))

    autoscaling = boto3.client("autoscaling", endpoint_url=aws_endpoint)
    sizes = {
        pool: autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0][
            "DesiredCapacity"
        ]
        for pool, name in pool_groups.items()
    }
    assert summary["ticks"] == 1, summary  # the sample event's schedule is past: it ticks once
    assert summary["status"] == "optimal", summary
    assert sizes["cpu"] == summary["workers"]["cpu"] >= 2
    assert sizes["gpu"] == sizes["accel"] == 0
    # No worker reports yet (the new instances are booting): the plan's instances wait for them.
    assert summary["unplaced"]["cpu"]["app/m/fp32_all/cpu-1t"] >= 2


# --- offline jobs: S3 events straight from the jobs bucket, and the resume schedule -------------

OFFLINE_FUNCTION = "modelless-offline"  # template.yaml: ${AWS::StackName}-offline


@pytest.fixture
def buckets(aws_endpoint: str) -> Iterator[Buckets]:
    """The jobs bucket, named as template.yaml names it (modelless-jobs- and the stack id's UUID),
    versioned so that a second write of a result would show (overrides the offline fixtures')."""
    s3 = boto3.client("s3", endpoint_url=aws_endpoint)
    name = f"modelless-jobs-{uuid.uuid4()}"
    s3.create_bucket(Bucket=name)
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    try:
        yield Buckets(s3, name)
    finally:
        _empty_and_delete(s3, name)


@dataclass
class OfflineDeployment:
    function: ModuleType
    lambdas: InProcessLambda
    buckets: Buckets

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        context = LambdaContext(OFFLINE_FUNCTION, 1024, remaining_ms=120_000)
        result: dict[str, Any] = self.function.handler(event, context)
        return result


@pytest.fixture
def offline(
    redis_store: RedisMetadataStore,
    buckets: Buckets,
    served: VariantProfile,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[OfflineDeployment]:
    """The offline function with template.yaml's environment (its Redis: the test's namespace),
    the linear model served by one real worker, and the jobs bucket allowed for its app."""
    environment = template_environment(
        "Offline",
        {"AWS::StackName": "modelless", "StackUuid": buckets.data.removeprefix("modelless-jobs-")},
    )
    assert [b for b in environment["MODELLESS_OFFLINE_BUCKETS"].split(",") if b] == [buckets.data]
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MODELLESS_METADATA_URL", redis_url(redis_store))
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    lambdas = InProcessLambda()
    lambdas.install()
    function = fresh_import("functions.offline.app")
    lambdas.register(environment["MODELLESS_OFFLINE_FUNCTION"], function.handler)
    try:
        yield OfflineDeployment(function, lambdas, buckets)
    finally:
        function.offline.close()


def manifest_created(buckets: Buckets, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Upload a manifest; the S3 event the jobs bucket's notification delivers for it."""
    body = json.dumps(manifest).encode()
    put = buckets.s3.put_object(Bucket=buckets.data, Key=key, Body=body)
    event = sample_event("s3_job_manifest_created.json")
    record = event["Records"][0]["s3"]
    record["bucket"]["name"] = buckets.data
    record["bucket"]["arn"] = f"arn:aws:s3:::{buckets.data}"
    record["object"].update(key=key, size=len(body), eTag=put["ETag"].strip('"'), versionId=put["VersionId"])
    return event


def copy_of(event: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(event))
    return copied


@pytest.mark.localstack
def test_offline_runs_the_job_of_a_manifests_s3_event_once(
    offline: OfflineDeployment, redis_store: RedisMetadataStore
) -> None:
    buckets = offline.buckets
    keys = buckets.upload_inputs("in/", 6)
    event = manifest_created(
        buckets,
        "jobs/nightly.job.json",
        {"appID": OFFLINE_APP, "inputPath": "in/", "outputPath": "out/", "accuracy": 0.5},
    )

    first = offline.invoke(event)
    duplicate = offline.invoke(copy_of(event))

    [started] = first["events"]
    assert started["status"] == "started", started
    assert first["runs"] == [{"jobId": started["job_id"], "outcome": "completed", "processed": 6}]
    # S3 delivers at least once: the duplicate is answered from the idempotency record in Redis.
    assert duplicate["events"] == first["events"]
    assert duplicate["runs"][0]["processed"] == 0
    job = redis_store.get_job(started["job_id"])
    assert job is not None and job.status is JobStatus.COMPLETED and (job.done, job.total) == (6, 6)
    assert job.source == f"s3://{buckets.data}/jobs/nightly.job.json"
    # Every result exactly once, and right.
    versions = buckets.versions("out/")
    assert {k for k in versions if k.endswith(RESULT_SUFFIX)} == {output_key("in/", "out/", k) for k in keys}
    assert set(versions.values()) == {1}
    assert summary_key("out/", job.job_id) in versions
    np.testing.assert_allclose(
        buckets.read_json(output_key("in/", "out/", keys[2]))["outputs"],
        expected_logits(sample_inputs(3)[2:3]),
        rtol=1e-4,
        atol=1e-4,
    )
    assert offline.lambdas.invocations == []  # it ran here: nothing handed on


@pytest.mark.localstack
def test_offline_schedule_resumes_a_job_whose_runner_never_ran(
    offline: OfflineDeployment, redis_store: RedisMetadataStore
) -> None:
    buckets = offline.buckets
    buckets.upload_inputs("in/", 4)
    # A job submitted through the API: the function invocation that should run it was launched
    # (asynchronously, to this function) but never delivered, as if its runner died at once.
    job = offline.function.offline.service.submit(
        JobSpec(OFFLINE_APP, f"s3://{buckets.data}/in/", f"s3://{buckets.data}/out/", 0.5)
    )
    [launched] = offline.lambdas.queued
    assert (launched.function, launched.invocation_type, launched.event) == (
        OFFLINE_FUNCTION,
        "Event",
        {"jobId": job.job_id},
    )
    offline.lambdas.queued.clear()

    result = offline.invoke(sample_event("offline_resume_schedule.json"))

    assert result["runs"] == [{"jobId": job.job_id, "outcome": "completed", "processed": 4}]
    finished = redis_store.get_job(job.job_id)
    assert finished is not None and finished.status is JobStatus.COMPLETED
    # Nothing left for the next tick.
    assert offline.invoke(sample_event("offline_resume_schedule.json"))["runs"] == []


def test_sample_events_are_the_shapes_the_functions_read() -> None:
    """The samples stay parseable by the Powertools data classes the handlers use."""
    from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2, EventBridgeEvent, S3Event

    from modelless.lambda_events import InvocationEvent, RegistrationEvent

    for name in ("http_api_health.json", "http_api_create_app.json", "http_api_online_query.json"):
        http = APIGatewayProxyEventV2(sample_event(name))
        assert http.version == "2.0" and http.request_context.http.method in {"GET", "POST"}
    register = APIGatewayProxyEventV2(sample_event("http_api_register_model.json"))
    assert register.is_base64_encoded and base64.b64decode(register.body or "").startswith(b"--")
    np.load(io.BytesIO(multipart_parts(sample_event("http_api_register_model.json"))["valSet"]))
    assert EventBridgeEvent(sample_event("scheduled.json")).detail_type == "Scheduled Event"
    resume = EventBridgeEvent(sample_event("offline_resume_schedule.json"))
    assert (resume.source, resume.detail_type) == ("aws.events", "Scheduled Event")
    [record] = S3Event(sample_event("s3_job_manifest_created.json")).records
    assert record.event_source == "aws:s3" and record.event_name.startswith("ObjectCreated:")
    # What the template's S3 notification lets through: a manifest under jobs/.
    assert record.s3.get_object.key.startswith("jobs/") and record.s3.get_object.key.endswith(".job.json")
    assert RegistrationEvent(sample_event("registrar_job.json")).job.model_name == MODEL
    assert InvocationEvent(sample_event("cpu_worker_invoke.json")).memory_mb == 1769
