"""What pipelines keep, per app: each pipeline's spec, and per edge how often its source ran and
how often the edge was then taken (the branch probability the planner weighs load by)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from modelless.pipelines.spec import PipelineSpec


@dataclass(frozen=True)
class BranchCount:
    seen: int  # queries whose source stage ran
    taken: int  # of those, the ones that took the edge

    @property
    def probability(self) -> float | None:
        return self.taken / self.seen if self.seen else None


class PipelineStore(Protocol):
    def create(self, app_id: str, spec: PipelineSpec) -> bool:
        """Store a new pipeline; False (and nothing changed) when the app has one of that name."""

    def get(self, app_id: str, name: str) -> PipelineSpec | None: ...

    def list(self, app_id: str) -> list[PipelineSpec]:
        """The app's pipelines, by name."""

    def delete(self, app_id: str, name: str) -> bool:
        """Forget the pipeline and its branch counts; False when there was none."""

    def count_branches(self, app_id: str, name: str, taken: dict[str, bool]) -> None:
        """One query's edges whose source ran (edge key -> whether it was taken)."""

    def add_branch_counts(self, app_id: str, name: str, counts: dict[str, tuple[int, int]]) -> None:
        """Many rows' at once (an offline job's batch): edge key -> (rows whose source ran, rows
        that took the edge)."""

    def branches(self, app_id: str, name: str) -> dict[str, BranchCount]: ...
