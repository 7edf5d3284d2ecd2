"""The metadata store contract, checked against both backends (in-memory and a real Redis).

Every test in the first part runs twice through ``any_store``; the Redis-only tests at the end
check what only a shared server can get wrong: key namespacing and MULTI/EXEC atomicity.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

import pytest
import redis

from modelless.exceptions import ConflictError
from modelless.metadata.base import WORKER_STALE_AFTER_S, IdempotentRequest, MetadataStore
from modelless.metadata.redis import RedisMetadataStore
from modelless.types import (
    InstanceState,
    InstanceStats,
    ModelRecord,
    Registration,
    RegistrationStatus,
    VariantProfile,
    WorkerState,
)
from tests.waiting import scaled, wait_for

APP = "app-one"
OTHER_APP = "app-two"


# --- builders ---------------------------------------------------------------------------------


def make_model(app_id: str, name: str, ready: bool = False) -> ModelRecord:
    return ModelRecord(
        app_id=app_id,
        model_name=name,
        input_name="input",
        input_shape=[1, 8, 8],
        input_dtype="float32",
        num_classes=10,
        registration_id=f"reg-{app_id}-{name}",
        artifact_key=f"apps/{app_id}/{name}/source.onnx",
        ready=ready,
    )


def make_registration(model: ModelRecord) -> Registration:
    return Registration(
        registration_id=model.registration_id,
        app_id=model.app_id,
        model_name=model.model_name,
        created_at=1_700_000_000.0,
        message="queued",
    )


def make_variant(
    app_id: str, model_name: str, recipe: str, pool: str = "cpu", accuracy: float = 0.9, p99: float = 2.0
) -> VariantProfile:
    precision, opt_level = recipe.split("-", 1)
    return VariantProfile(
        variant_id=f"{app_id}/{model_name}/{recipe}/{pool}",
        app_id=app_id,
        model_name=model_name,
        pool=pool,
        precision=precision,
        opt_level=opt_level,
        threads=1,
        artifact_key=f"apps/{app_id}/{model_name}/variants/{recipe}.onnx",
        size_bytes=1234,
        load_latency_ms=15.5,
        latency_p50_ms={1: p99 / 2, 2: p99 / 2 + 0.1, 4: p99 / 2 + 0.2, 8: p99 / 2 + 0.3},
        latency_p99_ms={1: p99, 2: p99 + 0.1, 4: p99 + 0.2, 8: p99 + 0.3},
        peak_memory_mb=3.25,
        accuracy=accuracy,
        price_per_second=0.0000118,
        request_price=0.0,
        hardware="test cpu, 1 intra-op thread(s)",
        measured_on_target=True,
    )


def make_worker(
    worker_id: str,
    pool: str = "cpu",
    utilisation: float = 0.0,
    reported_at: float | None = None,
    instances: tuple[InstanceStats, ...] = (),
) -> WorkerState:
    return WorkerState(
        worker_id=worker_id,
        pool=pool,
        address=f"http://127.0.0.1:9/{worker_id}",
        utilisation=utilisation,
        free_slots=2 - len(instances),
        reported_at=time.time() if reported_at is None else reported_at,
        instances=instances,
    )


def register_and_publish(
    store: MetadataStore, app_id: str, name: str, variants: list[VariantProfile]
) -> tuple[ModelRecord, Registration]:
    """What a successful registration does to the store: add the model, then publish."""
    model = make_model(app_id, name)
    registration = make_registration(model)
    store.add_model(model, registration)
    registration.status = RegistrationStatus.READY
    registration.total = registration.done = len(variants)
    registration.variant_ids = [v.variant_id for v in variants]
    registration.finished_at = 1_700_000_010.0
    ready = make_model(app_id, name, ready=True)
    store.publish_variants(ready, variants, registration)
    return ready, registration


def register_and_publish_existing(
    store: MetadataStore, model: ModelRecord, registration: Registration, variants: list[VariantProfile]
) -> tuple[ModelRecord, Registration]:
    published = Registration.from_json(registration.to_json())
    published.status = RegistrationStatus.READY
    published.total = published.done = len(variants)
    published.variant_ids = [v.variant_id for v in variants]
    ready = ModelRecord(**{**model.__dict__, "ready": True})
    store.publish_variants(ready, variants, published)
    return ready, published


def ids(variants: list[VariantProfile]) -> set[str]:
    return {v.variant_id for v in variants}


# --- apps -------------------------------------------------------------------------------------


def test_create_app_then_look_it_up_by_id_and_key(any_store: MetadataStore) -> None:
    assert not any_store.app_exists(APP)
    assert any_store.app_for_key("hash-1") is None

    any_store.create_app(APP, "hash-1")

    assert any_store.app_exists(APP)
    assert any_store.app_for_key("hash-1") == APP
    assert not any_store.app_exists(OTHER_APP)
    assert any_store.app_for_key("hash-unknown") is None


def test_duplicate_app_conflicts_and_does_not_bind_the_new_key(any_store: MetadataStore) -> None:
    any_store.create_app(APP, "hash-1")

    with pytest.raises(ConflictError):
        any_store.create_app(APP, "hash-2")

    assert any_store.app_for_key("hash-1") == APP
    assert any_store.app_for_key("hash-2") is None
    any_store.create_app(OTHER_APP, "hash-3")  # other apps are unaffected
    assert any_store.app_for_key("hash-3") == OTHER_APP


def test_list_apps_names_every_app_sorted(any_store: MetadataStore) -> None:
    assert any_store.list_apps() == []

    any_store.create_app(OTHER_APP, "hash-2")
    any_store.create_app(APP, "hash-1")

    assert any_store.list_apps() == [APP, OTHER_APP]


def test_the_recorded_scaling_plan_is_the_last_one(any_store: MetadataStore) -> None:
    assert any_store.scaling_plan() is None

    any_store.put_scaling_plan('{"at": 1.0}')
    any_store.put_scaling_plan('{"at": 2.0}')

    assert any_store.scaling_plan() == '{"at": 2.0}'


# --- models and registrations -----------------------------------------------------------------


def test_add_model_records_model_and_its_registration(any_store: MetadataStore) -> None:
    model = make_model(APP, "resnet")
    registration = make_registration(model)

    any_store.add_model(model, registration)

    stored = any_store.get_model(APP, "resnet")
    assert stored == model
    assert stored is not None and not stored.ready
    assert any_store.list_models(APP) == [model]
    assert any_store.get_registration(registration.registration_id) == registration
    assert any_store.get_model(OTHER_APP, "resnet") is None
    assert any_store.list_models(OTHER_APP) == []


def test_duplicate_model_conflicts_and_keeps_the_first(any_store: MetadataStore) -> None:
    first = make_model(APP, "resnet")
    any_store.add_model(first, make_registration(first))
    second = ModelRecord(**{**first.__dict__, "registration_id": "reg-second", "num_classes": 5})
    second_registration = make_registration(second)

    with pytest.raises(ConflictError):
        any_store.add_model(second, second_registration)

    assert any_store.get_model(APP, "resnet") == first
    assert any_store.get_registration("reg-second") is None
    assert any_store.list_models(APP) == [first]
    # The same name in another app is a different model.
    elsewhere = make_model(OTHER_APP, "resnet")
    any_store.add_model(elsewhere, make_registration(elsewhere))
    assert any_store.get_model(OTHER_APP, "resnet") == elsewhere


def test_list_models_is_sorted_by_name(any_store: MetadataStore) -> None:
    for name in ("zeta", "alpha", "mid"):
        model = make_model(APP, name)
        any_store.add_model(model, make_registration(model))

    assert [m.model_name for m in any_store.list_models(APP)] == ["alpha", "mid", "zeta"]


def test_registration_round_trips_and_updates(any_store: MetadataStore) -> None:
    assert any_store.get_registration("missing") is None
    registration = Registration(
        registration_id="reg-1",
        app_id=APP,
        model_name="resnet",
        status=RegistrationStatus.PROFILING,
        total=8,
        done=3,
        message="profiling fp32-basic",
        created_at=1_700_000_000.5,
        variant_ids=["a", "b"],
    )

    any_store.put_registration(registration)
    stored = any_store.get_registration("reg-1")
    assert stored == registration
    assert stored is not registration
    assert stored is not None and stored.status is RegistrationStatus.PROFILING

    # A caller mutating its copy does not change what the store holds.
    stored.done = 99
    assert any_store.get_registration("reg-1") == registration

    registration.status = RegistrationStatus.FAILED
    registration.message = "RuntimeError: boom"
    registration.finished_at = 1_700_000_001.0
    any_store.put_registration(registration)
    assert any_store.get_registration("reg-1") == registration


# --- publishing and variants ------------------------------------------------------------------


def test_publish_marks_model_ready_with_registration_and_variants(any_store: MetadataStore) -> None:
    model = make_model(APP, "resnet")
    registration = make_registration(model)
    any_store.add_model(model, registration)
    version_before = any_store.profiles_version(APP)
    assert any_store.list_variants(APP) == []

    variants = [make_variant(APP, "resnet", r) for r in ("fp32-basic", "int8-all")]
    ready, published = register_and_publish_existing(any_store, model, registration, variants)

    assert any_store.get_model(APP, "resnet") == ready
    assert any_store.list_models(APP) == [ready]
    stored_registration = any_store.get_registration(registration.registration_id)
    assert stored_registration == published
    assert stored_registration is not None and stored_registration.status is RegistrationStatus.READY
    assert any_store.list_variants(APP) == sorted(variants, key=lambda v: v.variant_id)
    assert any_store.profiles_version(APP) > version_before


def test_variants_are_added_one_profile_at_a_time_while_the_registration_goes_on(
    any_store: MetadataStore,
) -> None:
    model = make_model(APP, "resnet")
    registration = make_registration(model)
    any_store.add_model(model, registration)
    first = make_variant(APP, "resnet", "fp32-all", accuracy=0.91)
    second = [
        make_variant(APP, "resnet", "int8-all", accuracy=0.9),
        make_variant(APP, "resnet", "int8-basic"),
    ]
    versions = [any_store.profiles_version(APP)]

    registration.status, registration.done, registration.total = RegistrationStatus.PROFILING, 1, 3
    registration.first_servable_at = 1_700_000_005.0
    registration.variants = {"fp32_all": "ready", "int8_all": "profiling", "int8_basic": "queued"}
    servable = ModelRecord(**{**model.__dict__, "ready": True, "reference_accuracy": 0.91})
    any_store.add_variants(servable, [first], registration)
    versions.append(any_store.profiles_version(APP))

    # Servable at once: the model, its first variant (selectable) and the progress, together.
    assert any_store.get_model(APP, "resnet") == servable
    assert any_store.list_variants(APP, "resnet") == [first]
    assert ids(any_store.candidate_variants(APP, 0.0, "resnet")) == {first.variant_id}
    assert any_store.get_registration(registration.registration_id) == registration

    registration.done = 3
    any_store.add_variants(servable, second, registration)
    versions.append(any_store.profiles_version(APP))
    assert ids(any_store.list_variants(APP)) == ids([first, *second])
    assert ids(any_store.candidate_variants(APP, 0.905)) == {first.variant_id}

    # Pruning unpublishes, with the registration's final record, atomically.
    registration.status = RegistrationStatus.READY
    registration.variants["int8_basic"] = "pruned"
    registration.prune_reasons = {second[1].variant_id: "dominated by int8_all/cpu"}
    any_store.remove_variants(APP, [second[1].variant_id, "app-one/resnet/unknown/cpu"], registration)
    versions.append(any_store.profiles_version(APP))

    assert ids(any_store.list_variants(APP, "resnet")) == ids([first, second[0]])
    assert ids(any_store.candidate_variants(APP, 0.0, "resnet")) == ids([first, second[0]])
    assert ids(any_store.candidate_variants(APP, 0.0)) == ids([first, second[0]])
    stored = any_store.get_registration(registration.registration_id)
    assert (
        stored == registration and stored is not None and stored.prune_reasons == registration.prune_reasons
    )
    # Every change bumped the version that gateways' profile caches revalidate against.
    assert versions == sorted(set(versions)) and len(versions) == 4


def test_profiles_round_trip_exactly(any_store: MetadataStore) -> None:
    variant = make_variant(APP, "resnet", "fp32-all", pool="lambda-cpu", accuracy=0.912345, p99=1.75)
    register_and_publish(any_store, APP, "resnet", [variant])

    [stored] = any_store.list_variants(APP)
    assert stored == variant
    assert all(isinstance(batch, int) for batch in stored.latency_p99_ms)
    assert stored.latency_ms(3) == variant.latency_p99_ms[4]


def test_list_variants_per_app_and_per_model(any_store: MetadataStore) -> None:
    resnet = [make_variant(APP, "resnet", r) for r in ("fp32-basic", "fp32-all", "int8-basic")]
    vgg = [make_variant(APP, "vgg", r) for r in ("fp32-basic", "int8-all")]
    other = [make_variant(OTHER_APP, "resnet", "fp32-basic")]
    register_and_publish(any_store, APP, "resnet", resnet)
    register_and_publish(any_store, APP, "vgg", vgg)
    register_and_publish(any_store, OTHER_APP, "resnet", other)

    assert ids(any_store.list_variants(APP)) == ids(resnet + vgg)
    assert ids(any_store.list_variants(APP, "resnet")) == ids(resnet)
    assert ids(any_store.list_variants(APP, "vgg")) == ids(vgg)
    assert any_store.list_variants(APP, "absent") == []
    assert any_store.list_variants(OTHER_APP) == other
    assert any_store.list_variants("no-such-app") == []
    listed = [v.variant_id for v in any_store.list_variants(APP)]
    assert listed == sorted(listed)


def test_candidate_variants_filter_by_accuracy_inclusively_and_by_model(any_store: MetadataStore) -> None:
    resnet = [
        make_variant(APP, "resnet", "fp32-basic", accuracy=0.95),
        make_variant(APP, "resnet", "int8-basic", accuracy=0.80),
    ]
    vgg = [
        make_variant(APP, "vgg", "fp32-basic", accuracy=0.875),
        make_variant(APP, "vgg", "int8-basic", accuracy=0.5),
    ]
    register_and_publish(any_store, APP, "resnet", resnet)
    register_and_publish(any_store, APP, "vgg", vgg)
    register_and_publish(
        any_store, OTHER_APP, "resnet", [make_variant(OTHER_APP, "resnet", "fp32-all", accuracy=1.0)]
    )

    assert ids(any_store.candidate_variants(APP, 0.0)) == ids(resnet + vgg)
    # The boundary is inclusive: a variant exactly at the target qualifies.
    assert ids(any_store.candidate_variants(APP, 0.875)) == {resnet[0].variant_id, vgg[0].variant_id}
    assert ids(any_store.candidate_variants(APP, 0.8750001)) == {resnet[0].variant_id}
    assert ids(any_store.candidate_variants(APP, 0.80, "resnet")) == ids(resnet)
    assert ids(any_store.candidate_variants(APP, 0.81, "resnet")) == {resnet[0].variant_id}
    assert ids(any_store.candidate_variants(APP, 0.5, "vgg")) == ids(vgg)
    assert any_store.candidate_variants(APP, 0.96) == []
    assert any_store.candidate_variants(APP, 0.0, "absent") == []
    # Candidates are whole profiles, equal to what was published.
    assert sorted(any_store.candidate_variants(APP, 0.9), key=lambda v: v.variant_id) == [resnet[0]]


def test_delete_model_removes_it_with_its_variants_only(any_store: MetadataStore) -> None:
    resnet = [make_variant(APP, "resnet", r, accuracy=0.9) for r in ("fp32-basic", "int8-basic")]
    vgg = [make_variant(APP, "vgg", r, accuracy=0.9) for r in ("fp32-basic", "int8-basic")]
    other = [make_variant(OTHER_APP, "resnet", "fp32-basic", accuracy=0.9)]
    register_and_publish(any_store, APP, "resnet", resnet)
    vgg_model, _ = register_and_publish(any_store, APP, "vgg", vgg)
    other_model, _ = register_and_publish(any_store, OTHER_APP, "resnet", other)
    version_before = any_store.profiles_version(APP)

    any_store.delete_model(APP, "resnet")

    assert any_store.get_model(APP, "resnet") is None
    assert any_store.list_models(APP) == [vgg_model]
    assert ids(any_store.list_variants(APP)) == ids(vgg)
    assert any_store.list_variants(APP, "resnet") == []
    assert ids(any_store.candidate_variants(APP, 0.0)) == ids(vgg)
    assert any_store.candidate_variants(APP, 0.0, "resnet") == []
    assert ids(any_store.candidate_variants(APP, 0.0, "vgg")) == ids(vgg)
    assert any_store.profiles_version(APP) > version_before
    # The same model name in another app is untouched.
    assert any_store.get_model(OTHER_APP, "resnet") == other_model
    assert any_store.list_variants(OTHER_APP, "resnet") == other
    assert ids(any_store.candidate_variants(OTHER_APP, 0.0)) == ids(other)


def test_deleted_name_can_be_registered_again(any_store: MetadataStore) -> None:
    model = make_model(APP, "resnet")
    any_store.add_model(model, make_registration(model))
    any_store.delete_model(APP, "resnet")
    any_store.delete_model(APP, "never-existed")  # deleting nothing is not an error

    again = make_model(APP, "resnet")
    any_store.add_model(again, make_registration(again))
    assert any_store.list_models(APP) == [again]


# --- live worker state ------------------------------------------------------------------------


def test_workers_listed_least_utilised_first_and_by_pool(any_store: MetadataStore) -> None:
    busy = make_worker("cpu-busy", utilisation=0.9)
    idle = make_worker("cpu-idle", utilisation=0.1)
    mid = make_worker("gpu-mid", pool="gpu", utilisation=0.5)
    for worker in (busy, mid, idle):
        any_store.put_worker_state(worker)

    assert [w.worker_id for w in any_store.list_workers()] == ["cpu-idle", "gpu-mid", "cpu-busy"]
    assert [w.worker_id for w in any_store.list_workers("cpu")] == ["cpu-idle", "cpu-busy"]
    assert any_store.list_workers("gpu") == [mid]
    assert any_store.list_workers("lambda-cpu") == []


def test_worker_state_round_trips_and_a_new_report_replaces_the_old(any_store: MetadataStore) -> None:
    instance = InstanceStats("app/m/fp32-basic/cpu", InstanceState.OVERLOADED, 12.5, 1.5, 9.75, 3)
    first = make_worker("cpu-0", utilisation=0.2)
    any_store.put_worker_state(first)
    second = make_worker("cpu-0", utilisation=0.7, instances=(instance,))

    any_store.put_worker_state(second)

    assert any_store.list_workers() == [second]
    [stored] = any_store.list_workers()
    assert stored.instances[0].state is InstanceState.OVERLOADED


def test_stale_workers_are_not_listed(any_store: MetadataStore) -> None:
    now = time.time()
    fresh = make_worker("cpu-fresh", reported_at=now - WORKER_STALE_AFTER_S / 2)
    stale = make_worker("cpu-stale", reported_at=now - WORKER_STALE_AFTER_S - 1.0)
    any_store.put_worker_state(fresh)
    any_store.put_worker_state(stale)

    assert [w.worker_id for w in any_store.list_workers()] == ["cpu-fresh"]
    assert [w.worker_id for w in any_store.list_workers("cpu")] == ["cpu-fresh"]
    assert [w.worker_id for w in any_store.selection_state(APP)[1]] == ["cpu-fresh"]

    # A stale worker that reports again is live again.
    any_store.put_worker_state(make_worker("cpu-stale"))
    assert {w.worker_id for w in any_store.list_workers()} == {"cpu-fresh", "cpu-stale"}


def test_remove_worker(any_store: MetadataStore) -> None:
    any_store.put_worker_state(make_worker("cpu-0"))
    any_store.put_worker_state(make_worker("cpu-1", utilisation=0.5))

    any_store.remove_worker("cpu-0")
    any_store.remove_worker("never-reported")

    assert [w.worker_id for w in any_store.list_workers()] == ["cpu-1"]


def test_selection_state_reads_version_and_live_workers(any_store: MetadataStore) -> None:
    assert any_store.selection_state(APP) == (0, [])
    worker = make_worker("cpu-0")
    any_store.put_worker_state(worker)
    register_and_publish(any_store, APP, "resnet", [make_variant(APP, "resnet", "fp32-basic")])

    version, workers = any_store.selection_state(APP)

    assert version == any_store.profiles_version(APP) > 0
    assert workers == [worker]
    assert any_store.selection_state(OTHER_APP)[0] == 0


# --- idempotency keys ---------------------------------------------------------------------------


def pending(fingerprint: str = "request-a", claim: str = "claim-1") -> IdempotentRequest:
    return IdempotentRequest(fingerprint, claim)


def test_an_idempotency_key_is_claimed_once_then_holds_its_reply(any_store: MetadataStore) -> None:
    first = pending()
    assert any_store.claim_request(APP, "register_model", "key-1", first, 60) is None  # taken

    # A retry while the first runs sees it running; nothing it passes is written.
    assert any_store.claim_request(APP, "register_model", "key-1", pending(claim="claim-2"), 60) == first

    done = IdempotentRequest(first.fingerprint, first.claim, '{"registrationId": "r1"}')
    any_store.complete_request(APP, "register_model", "key-1", done, 60)
    assert any_store.claim_request(APP, "register_model", "key-1", pending(claim="claim-3"), 60) == done

    # Keys are per app and per operation.
    assert any_store.claim_request(OTHER_APP, "register_model", "key-1", pending(), 60) is None
    assert any_store.claim_request(APP, "offline_query", "key-1", pending(), 60) is None


def test_a_released_claim_frees_the_key_and_nothing_else(any_store: MetadataStore) -> None:
    first = pending()
    assert any_store.claim_request(APP, "offline_query", "key-2", first, 60) is None

    any_store.release_request(APP, "offline_query", "key-2", pending(claim="someone-else"))
    assert any_store.claim_request(APP, "offline_query", "key-2", pending(claim="claim-2"), 60) == first

    any_store.release_request(APP, "offline_query", "key-2", first)
    again = pending(claim="claim-3")
    assert any_store.claim_request(APP, "offline_query", "key-2", again, 60) is None

    done = IdempotentRequest(again.fingerprint, again.claim, '{"jobId": "j1"}')
    any_store.complete_request(APP, "offline_query", "key-2", done, 60)
    any_store.release_request(APP, "offline_query", "key-2", again)  # a reply is never released
    assert any_store.claim_request(APP, "offline_query", "key-2", pending(claim="claim-4"), 60) == done


def test_an_idempotency_key_expires(any_store: MetadataStore) -> None:
    assert any_store.claim_request(APP, "offline_query", "key-3", pending(), 0.2) is None
    assert any_store.claim_request(APP, "offline_query", "key-3", pending(claim="c2"), 60) is not None

    wait_for(
        lambda: any_store.claim_request(APP, "offline_query", "key-3", pending(claim="c3"), 60) is None,
        5,
        "the idempotency key's claim to expire",
    )


def test_of_racing_claims_on_one_key_exactly_one_wins(any_store: MetadataStore) -> None:
    start = threading.Barrier(8)
    won: list[str] = []

    def claim(index: int) -> None:
        start.wait()
        if any_store.claim_request(APP, "register_model", "key-4", pending(claim=f"c{index}"), 60) is None:
            won.append(f"c{index}")

    threads = [threading.Thread(target=claim, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(scaled(10))

    assert len(won) == 1
    held = any_store.claim_request(APP, "register_model", "key-4", pending(claim="late"), 60)
    assert held is not None and held.claim == won[0]


# --- Redis only -------------------------------------------------------------------------------


def _exercise_every_write(store: MetadataStore) -> None:
    store.create_app(APP, "hash-1")
    register_and_publish(store, APP, "resnet", [make_variant(APP, "resnet", "fp32-basic")])
    register_and_publish(store, APP, "vgg", [make_variant(APP, "vgg", "int8-all", pool="lambda-cpu")])
    store.put_registration(Registration("reg-extra", APP, "vgg"))
    store.delete_model(APP, "vgg")
    store.put_worker_state(make_worker("cpu-0"))
    store.claim_request(APP, "register_model", "a key: any text", IdempotentRequest("f", "c"), 60)


def _all_keys(client: redis.Redis) -> set[str]:  # type: ignore[type-arg]
    return {k.decode() for k in client.keys("*")}


def test_redis_keys_all_live_under_the_store_prefix(redis_store: RedisMetadataStore) -> None:
    prefix = redis_store.keys.prefix
    before = _all_keys(redis_store._redis)

    _exercise_every_write(redis_store)

    ours = {k for k in _all_keys(redis_store._redis) if k.startswith(prefix)}
    # Other test runs may share this database, but only under their own test-… prefixes.
    strays = {k for k in _all_keys(redis_store._redis) - before if not k.startswith("test-")}
    assert strays == set()
    kinds = {k[len(prefix) :].split(":")[0] for k in ours}
    wrote = {"app", "apikey", "model", "models", "registration", "variants", "idx", "workers", "request-key"}
    assert wrote <= kinds
    assert {k for k in _all_keys(redis_store._redis) if APP in k} <= ours

    redis_store.flush_namespace()
    assert not any(k.startswith(prefix) for k in _all_keys(redis_store._redis))


CONNECTION_SETUP = {"HELLO", "SELECT", "CLIENT", "AUTH", "PING"}


def _monitor(url: str, sentinel: str, seen: list[dict[str, Any]], ready: threading.Event) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        with client.monitor() as monitor:
            ready.set()
            for _ in range(10_000):
                command = monitor.next_command()
                seen.append(command)
                if sentinel in command["command"]:
                    return
    finally:
        client.close()


def test_redis_publish_is_one_multi_exec_transaction(redis_store: RedisMetadataStore) -> None:
    base = os.environ["MODELLESS_TEST_REDIS_URL"]
    prefix = redis_store.keys.prefix
    model = make_model(APP, "resnet")
    registration = make_registration(model)
    redis_store.add_model(model, registration)
    variants = [make_variant(APP, "resnet", r) for r in ("fp32-basic", "int8-basic")]

    sentinel = f"{prefix}sentinel"
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    monitor = threading.Thread(target=_monitor, args=(base, sentinel, seen, ready), daemon=True)
    monitor.start()
    # Set once the server has answered MONITOR (redis-py reads its OK before entering the block):
    # the server relays every later command, so nothing needs to settle before the publish.
    assert ready.wait(scaled(5)), "MONITOR did not start"
    register_and_publish_existing(redis_store, model, registration, variants)
    redis_store._redis.get(sentinel)
    monitor.join(scaled(10))
    assert not monitor.is_alive(), "MONITOR never saw the sentinel"

    writes = [c for c in seen if prefix in c["command"] and sentinel not in c["command"]]
    assert writes, "the publish wrote nothing under the store's prefix"
    connection = {(c["client_address"], c["client_port"]) for c in writes}
    assert len(connection) == 1
    ours = [
        c["command"].split()[0].upper()
        for c in seen
        if (c["client_address"], c["client_port"]) in connection and sentinel not in c["command"]
    ]
    ours = [name for name in ours if name not in CONNECTION_SETUP]
    assert ours[0] == "MULTI" and ours[-1] == "EXEC", ours
    assert "MULTI" not in ours[1:] and "EXEC" not in ours[:-1], ours
    assert {"HSET", "ZADD", "SET"} <= set(ours), ours


def test_redis_reader_never_sees_variants_of_a_model_not_ready(redis_store: RedisMetadataStore) -> None:
    reader = RedisMetadataStore.from_url(
        f"{os.environ['MODELLESS_TEST_REDIS_URL']}?prefix={redis_store.keys.prefix}"
    )
    violations: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        for _ in range(100_000):
            if stop.is_set():
                return
            for variant in reader.list_variants(APP):
                model = reader.get_model(APP, variant.model_name)
                if model is None or not model.ready:
                    violations.append(variant.variant_id)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for index in range(30):
            name = f"m{index}"
            register_and_publish(redis_store, APP, name, [make_variant(APP, name, "fp32-basic")])
    finally:
        stop.set()
        watcher.join(scaled(10))
        reader.close()

    assert not watcher.is_alive()
    assert violations == []
    assert len(redis_store.list_variants(APP)) == 30
    assert all(m.ready for m in redis_store.list_models(APP))


def test_redis_rereading_unchanged_reports_reuses_their_parsed_state(redis_store: RedisMetadataStore) -> None:
    instance = InstanceStats(f"{APP}/m/fp32-basic/cpu", InstanceState.ACTIVE, 3.0, 1.0, 2.0, 0)
    redis_store.put_worker_state(make_worker("cpu-0", instances=(instance,)))
    redis_store.put_worker_state(make_worker("cpu-1", utilisation=0.5))

    first = redis_store.list_workers()
    _, again = redis_store.selection_state(APP)
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]

    # A new report is parsed anew; the unchanged one is still shared.
    changed = make_worker("cpu-0", utilisation=0.9, instances=(instance,))
    redis_store.put_worker_state(changed)
    after = redis_store.list_workers()
    assert after == [first[1], changed]
    assert after[0] is first[1] and after[1] is not first[0]

    redis_store.remove_worker("cpu-1")
    assert redis_store.selection_state(APP)[1] == [changed]


def test_redis_relisting_unchanged_profiles_reuses_them_and_sees_every_change(
    redis_store: RedisMetadataStore,
) -> None:
    basic, quantised = (
        make_variant(APP, "m", "fp32-basic"),
        make_variant(APP, "m", "int8-basic", accuracy=0.8),
    )
    model, registration = register_and_publish(redis_store, APP, "m", [basic, quantised])
    first = redis_store.list_variants(APP)
    assert first == [basic, quantised]
    assert all(a is b for a, b in zip(first, redis_store.list_variants(APP), strict=True))

    # Republished with one profile changed and one added: only those are new objects.
    remeasured = dataclasses.replace(quantised, accuracy=0.85)
    added = make_variant(APP, "m", "int8-all", accuracy=0.7)
    register_and_publish_existing(redis_store, model, registration, [basic, remeasured, added])
    second = redis_store.list_variants(APP)
    assert second == [basic, added, remeasured]
    assert second[0] is first[0]
    assert redis_store.list_variants(APP, "m") == second
    assert redis_store.candidate_variants(APP, 0.8) == [remeasured, basic]  # by accuracy
    assert redis_store.list_variants(OTHER_APP) == []
