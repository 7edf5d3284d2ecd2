"""What a variant is made of, without the heavy imports of building or measuring one (the
gateway imports this; onnxruntime's quantiser stays in the child processes)."""

from __future__ import annotations

from dataclasses import dataclass

PRECISIONS = ("fp32", "fp16", "int8", "int8-static")
OPT_LEVEL_NAMES = ("basic", "extended", "all")
ACCURACY_METRICS = ("top1", "top5")


@dataclass(frozen=True)
class Recipe:
    """How an artifact was made; recorded in every variant built from it."""

    precision: str
    opt_level: str

    @property
    def name(self) -> str:
        return f"{self.precision}_{self.opt_level}"

    @classmethod
    def parse(cls, name: str) -> Recipe:
        precision, _, opt_level = name.rpartition("_")
        if precision not in PRECISIONS or opt_level not in OPT_LEVEL_NAMES:
            raise ValueError(
                f"{name!r} is not a recipe: <{'|'.join(PRECISIONS)}>_<{'|'.join(OPT_LEVEL_NAMES)}>"
            )
        return cls(precision, opt_level)
