"""Settings: their defaults, the environment over them, values refused naming their variable, the
JSON mappings and comma lists the environment holds, and one read per process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from modelless.config import ClientSettings, MiB, Settings, get_client_settings, get_settings
from modelless.exceptions import SettingsError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No MODELLESS_* variable of the host's (or of scripts/test) leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("MODELLESS_") or name == "AWS_LAMBDA_FUNCTION_NAME":
            monkeypatch.delenv(name)


def test_defaults() -> None:
    settings = Settings()
    assert settings.metadata_url == "memory://"
    assert settings.repository_url == ".modelless/repo"
    assert settings.cache_dir == Path("/tmp/modelless-cache") and isinstance(settings.cache_dir, Path)
    assert settings.admin_key == "" and settings.admin_key_secret == ""
    assert (settings.max_model_bytes, settings.max_valset_bytes) == (1024 * MiB, 256 * MiB)
    assert settings.max_register_body_bytes == 0  # derived from the two
    assert settings.register_body_limit == 1280 * MiB + 64 * 1024
    assert settings.register_body_setting == "MODELLESS_MAX_MODEL_BYTES + MODELLESS_MAX_VALSET_BYTES"
    behind_a_proxy = settings.with_overrides(max_register_body_bytes=4 * MiB)
    assert behind_a_proxy.register_body_limit == 4 * MiB
    assert behind_a_proxy.register_body_setting == "MODELLESS_MAX_REGISTER_BODY_BYTES"
    assert (settings.max_batch, settings.profile_runs, settings.profile_cache_ttl_s) == (64, 200, 60.0)
    # Profiling until stable: the median's 95 % interval within +-3 %, 10..200 runs, 3 s per batch.
    assert (settings.profile_min_runs, settings.profile_stability_pct) == (10, 3.0)
    assert (settings.profile_batch_budget_s, settings.profile_latency_ceiling_ms) == (3.0, 2000.0)
    assert settings.profile_parallelism == (os.cpu_count() or 1)
    assert settings.accuracy_tolerance == 0.02
    assert settings.offline_buckets == () and settings.offline_watches == "[]"
    assert settings.offline_runner == "auto" and settings.offline_pause_utilisation == 0.40
    assert settings.offline_function == settings.function_name == ""
    # The scaler's.
    assert settings.pool_groups == {} and settings.min_workers == {}
    assert settings.max_workers == {"cpu": 4}
    assert settings.scaler_period_s == 10.0


def test_the_input_limits_default_from_the_existing_ones() -> None:
    settings = Settings()
    # A validation set's arrays unpacked: 4 times the file's own limit unless set.
    assert settings.max_valset_unpacked_bytes == 0 and settings.valset_unpacked_limit == 1024 * MiB
    assert settings.with_overrides(max_valset_bytes=10 * MiB).valset_unpacked_limit == 40 * MiB
    assert settings.with_overrides(max_valset_unpacked_bytes=3 * MiB).valset_unpacked_limit == 3 * MiB
    assert settings.max_ingest_memory_bytes == 0  # derived from each registration's files
    assert settings.idempotency_ttl_s == 24 * 3600.0
    with pytest.raises(SettingsError, match="MODELLESS_IDEMPOTENCY_TTL_S"):
        Settings(idempotency_ttl_s=0)


def test_the_environment_overrides_the_defaults_and_keywords_override_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODELLESS_MAX_BATCH", "8")
    monkeypatch.setenv("MODELLESS_CACHE_DIR", "/var/cache/m")
    monkeypatch.setenv("MODELLESS_PROFILE_CACHE_TTL_S", "2.5")
    monkeypatch.setenv("MODELLESS_ADMIN_KEY_SECRET", "arn:aws:secretsmanager:us-east-1:1:secret:admin")
    settings = Settings()
    assert settings.max_batch == 8 and settings.profile_cache_ttl_s == 2.5
    assert settings.cache_dir == Path("/var/cache/m")
    assert settings.admin_key_secret.endswith(":secret:admin")
    assert Settings(max_batch=3, cache_dir=Path("/c")).max_batch == 3  # tests build their own
    assert Settings(max_batch=3).cache_dir == Path("/var/cache/m")  # the rest from the environment


def test_settings_are_immutable_and_copied_with_overrides() -> None:
    settings = Settings(max_batch=8)
    with pytest.raises(ValueError, match="frozen"):
        settings.max_batch = 9  # type: ignore[misc]
    changed = settings.with_overrides(offline_buckets=("b",), cache_dir="/elsewhere")
    assert (changed.max_batch, changed.offline_buckets, changed.cache_dir) == (8, ("b",), Path("/elsewhere"))
    assert settings.offline_buckets == ()
    with pytest.raises(SettingsError, match="MODELLESS_MAX_BATCH must be an integer, got 'many'"):
        settings.with_overrides(max_batch="many")


def test_the_json_mappings_and_the_comma_list_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELLESS_POOL_GROUPS", '{"cpu": "modelless-cpu", "gpu": "modelless-gpu"}')
    monkeypatch.setenv("MODELLESS_MAX_WORKERS", '{"cpu": 4, "gpu": 0, "accel": 0}')
    monkeypatch.setenv("MODELLESS_MIN_WORKERS", '{"cpu": 1}')
    monkeypatch.setenv("MODELLESS_SCALER_PERIOD_S", "15")
    monkeypatch.setenv("MODELLESS_OFFLINE_BUCKETS", "jobs-bucket, data-a,,data-b ")
    settings = Settings()
    assert settings.pool_groups == {"cpu": "modelless-cpu", "gpu": "modelless-gpu"}
    assert settings.max_workers == {"cpu": 4, "gpu": 0, "accel": 0}
    assert settings.min_workers == {"cpu": 1}
    assert settings.scaler_period_s == 15.0
    assert settings.offline_buckets == ("jobs-bucket", "data-a", "data-b")
    monkeypatch.setenv("MODELLESS_OFFLINE_BUCKETS", "")
    assert Settings().offline_buckets == ()


WORKER_COUNTS = 'a JSON object of pool name to worker count, e.g. {"cpu": 4}'


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MODELLESS_MAX_BATCH", "abc", "MODELLESS_MAX_BATCH must be an integer, got 'abc'"),
        (
            "MODELLESS_MAX_MODEL_BYTES",
            "64MB",
            "MODELLESS_MAX_MODEL_BYTES must be a whole number of bytes, got '64MB'",
        ),
        (
            "MODELLESS_SCALER_PERIOD_S",
            "soon",
            "MODELLESS_SCALER_PERIOD_S must be a number of seconds, got 'soon'",
        ),
        ("MODELLESS_OFFLINE_RUN_MS", "", "MODELLESS_OFFLINE_RUN_MS must be a number of milliseconds, got ''"),
        (
            "MODELLESS_MAX_WORKERS",
            "not json",
            f"MODELLESS_MAX_WORKERS must be {WORKER_COUNTS} (not JSON), got 'not json'",
        ),
        (
            "MODELLESS_MAX_WORKERS",
            "[4]",
            f"MODELLESS_MAX_WORKERS must be {WORKER_COUNTS} (not a JSON object), got '[4]'",
        ),
        (
            "MODELLESS_MAX_WORKERS",
            '{"cpu": "four"}',
            f"MODELLESS_MAX_WORKERS must be {WORKER_COUNTS}: [\"cpu\"] must be an integer, got 'four'",
        ),
        (
            "MODELLESS_POOL_GROUPS",
            '{"cpu": 7}',
            "MODELLESS_POOL_GROUPS must be a JSON object of pool name to Auto Scaling group name, "
            'e.g. {"cpu": "asg-name"}: ["cpu"] must be a string, got 7',
        ),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as refused:
        get_settings()
    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)


def test_every_bad_value_is_named_at_once() -> None:
    values: dict[str, Any] = {"max_batch": "x", "offline_lease_s": "y", "max_batchh": 1}
    with pytest.raises(SettingsError) as refused:
        Settings(**values)
    assert str(refused.value) == (
        "MODELLESS_MAX_BATCH must be an integer, got 'x'; "
        "MODELLESS_OFFLINE_LEASE_S must be a number of seconds, got 'y'; "
        "MODELLESS_MAX_BATCHH is not a setting"
    )


def test_settings_are_read_once_per_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    first = get_settings()
    assert get_settings() is first  # read once
    monkeypatch.setenv("MODELLESS_MAX_BATCH", "16")
    changed = get_settings()  # a changed environment (a test's) is read again
    assert changed is not first and changed.max_batch == 16
    assert get_settings() is changed
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    assert get_settings() is changed


def test_the_offline_function_falls_back_to_its_own_lambda_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().offline_function_or_own().offline_function == ""  # not in Lambda: none
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "modelless-offline")
    own = Settings()
    assert own.function_name == "modelless-offline" and own.offline_function == ""
    assert own.offline_function_or_own().offline_function == "modelless-offline"
    monkeypatch.setenv("MODELLESS_OFFLINE_FUNCTION", "named")
    assert Settings().offline_function_or_own().offline_function == "named"  # a name set wins


def test_the_clients_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert ClientSettings() == ClientSettings(url="", api_key="", admin_key="", state_dir=Path(".modelless"))
    monkeypatch.setenv("MODELLESS_URL", "http://gateway:8080")
    monkeypatch.setenv("MODELLESS_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("MODELLESS_MAX_BATCH", "not read by the client")
    client = get_client_settings()
    assert (client.url, client.state_dir) == ("http://gateway:8080", tmp_path)
