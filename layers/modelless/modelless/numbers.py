"""The numbers a caller states, as strict pydantic types: a JSON number only, never a boolean or a
numeric string (``"latency": true`` or ``"50"`` is a 400 naming the field, not 1.0 or 50.0);
finite; within bounds past which a number means nothing and the arithmetic it feeds overflows
(1e308 ms). Queries, pipeline specs and feedback all state theirs in these, so that no route
coerces what another refuses.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from modelless.validation import MAX_LATENCY_MS

LatencyMs = Annotated[
    float,
    Field(
        strict=True,
        allow_inf_nan=False,
        gt=0,
        le=MAX_LATENCY_MS,
        description=f"latency budget in milliseconds, over 0 and at most {MAX_LATENCY_MS:.0f} (an hour)",
    ),
]
Accuracy = Annotated[
    float,
    Field(strict=True, allow_inf_nan=False, ge=0, le=1, description="minimum top-1 accuracy in [0, 1]"),
]
# A probability a condition compares with (a confidence threshold): in (0, 1].
Probability = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)]
