"""FPMs as numpy columns, for observing many at once on the hot path.

A Faust agent takes FPMs in batches; turning a batch into five float arrays
once lets the models update their averages and bucket keys with numpy
instead of touching each pydantic object field by field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from fleetplan.schemas import ForwardPassMetrics


@dataclass(frozen=True, eq=False)
class FpmColumns:
    """Scheduled-work columns of n FPMs (queued work does not feed the regressions)."""

    wall_time: np.ndarray
    num_prefill_requests: np.ndarray
    sum_prefill_tokens: np.ndarray
    num_decode_requests: np.ndarray
    sum_decode_kv_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = None
        for f in fields(self):
            column = np.asarray(getattr(self, f.name), dtype=np.float64).reshape(-1)
            if n is None:
                n = column.shape[0]
            elif column.shape[0] != n:
                raise ValueError(f"column {f.name} has {column.shape[0]} rows, expected {n}")
            if column.size and not (np.isfinite(column).all() and (column >= 0).all()):
                raise ValueError(f"column {f.name} must be finite and non-negative")
            object.__setattr__(self, f.name, column)

    def __len__(self) -> int:
        return int(self.wall_time.shape[0])

    @classmethod
    def from_fpms(cls, fpms: Sequence[ForwardPassMetrics]) -> FpmColumns:
        rows = [
            (
                f.wall_time,
                f.scheduled.num_prefill_requests,
                f.scheduled.sum_prefill_tokens,
                f.scheduled.num_decode_requests,
                f.scheduled.sum_decode_kv_tokens,
            )
            for f in fpms
        ]
        table = np.array(rows, dtype=np.float64).reshape(-1, 5)
        # One check of the whole table instead of five per column: on the hot
        # path a batch is often a couple of FPMs, where numpy's per-call cost rules.
        if table.size and not (np.isfinite(table).all() and (table >= 0).all()):
            return cls(*(table[:, i] for i in range(5)))  # let __post_init__ name the column
        columns = object.__new__(cls)
        for f, column in zip(fields(cls), np.ascontiguousarray(table.T), strict=True):
            object.__setattr__(columns, f.name, column)
        return columns

    @classmethod
    def empty(cls) -> FpmColumns:
        return cls(*(np.zeros(0) for _ in range(5)))
