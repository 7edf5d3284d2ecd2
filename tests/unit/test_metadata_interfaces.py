"""The metadata store's parts (``modelless.metadata.base``): apps and keys, models and variants,
live state, offline jobs. Each is an interface of its own that callers needing one part ask for;
both backends are every part (their behaviour on both is the contract suite's,
tests/functional/test_metadata_store_contract.py)."""

from __future__ import annotations

import inspect

from modelless.metadata.base import AppStore, LiveStateStore, MetadataStore, ModelStore, OfflineJobStore
from modelless.metadata.memory import InMemoryMetadataStore
from modelless.metadata.redis import RedisMetadataStore

PARTS: tuple[type, ...] = (AppStore, ModelStore, LiveStateStore, OfflineJobStore)


def methods_of(interface: type) -> set[str]:
    """The methods an interface declares itself (not those it inherits)."""
    return {
        name
        for name, value in vars(interface).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


def test_the_parts_split_the_store_without_overlap() -> None:
    declared = [methods_of(part) for part in PARTS]
    assert all(declared), "a part declares nothing"
    assert sum(len(names) for names in declared) == len(set().union(*declared)), "a method in two parts"
    everything = {name for name in dir(MetadataStore) if not name.startswith("_")}
    assert set().union(*declared) <= everything


def test_both_backends_implement_every_part() -> None:
    for backend in (InMemoryMetadataStore, RedisMetadataStore):
        for part in (*PARTS, MetadataStore):
            missing = sorted(name for name in methods_of(part) if not callable(getattr(backend, name, None)))
            assert missing == [], f"{backend.__name__} lacks {part.__name__}'s {missing}"


def test_a_backend_is_each_part_to_the_type_checker() -> None:
    # mypy --strict checks these assignments (scripts/test runs it on tests/ too).
    store = InMemoryMetadataStore()
    parts: list[object] = []
    apps: AppStore = store
    models: ModelStore = store
    live: LiveStateStore = store
    jobs: OfflineJobStore = store
    parts += [apps, models, live, jobs]
    assert all(part is store for part in parts)
