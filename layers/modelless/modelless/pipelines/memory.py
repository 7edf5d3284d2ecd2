"""In-memory pipeline store: one process's gateway (the embedded default) and unit tests."""

from __future__ import annotations

import threading

from modelless.pipelines.spec import PipelineSpec
from modelless.pipelines.store import BranchCount


class InMemoryPipelineStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, dict[str, PipelineSpec]] = {}
        self._branches: dict[tuple[str, str], dict[str, BranchCount]] = {}

    def create(self, app_id: str, spec: PipelineSpec) -> bool:
        with self._lock:
            specs = self._specs.setdefault(app_id, {})
            if spec.name in specs:
                return False
            specs[spec.name] = spec.model_copy(deep=True)
            return True

    def get(self, app_id: str, name: str) -> PipelineSpec | None:
        with self._lock:
            spec = self._specs.get(app_id, {}).get(name)
            return None if spec is None else spec.model_copy(deep=True)

    def list(self, app_id: str) -> list[PipelineSpec]:
        with self._lock:
            specs = self._specs.get(app_id, {})
            return [specs[name].model_copy(deep=True) for name in sorted(specs)]

    def delete(self, app_id: str, name: str) -> bool:
        with self._lock:
            self._branches.pop((app_id, name), None)
            return self._specs.get(app_id, {}).pop(name, None) is not None

    def count_branches(self, app_id: str, name: str, taken: dict[str, bool]) -> None:
        self.add_branch_counts(app_id, name, {edge: (1, int(was)) for edge, was in taken.items()})

    def add_branch_counts(self, app_id: str, name: str, counts: dict[str, tuple[int, int]]) -> None:
        with self._lock:
            kept = self._branches.setdefault((app_id, name), {})
            for edge, (seen, taken) in counts.items():
                old = kept.get(edge, BranchCount(0, 0))
                kept[edge] = BranchCount(old.seen + seen, old.taken + taken)

    def branches(self, app_id: str, name: str) -> dict[str, BranchCount]:
        with self._lock:
            return dict(self._branches.get((app_id, name), {}))
