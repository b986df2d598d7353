"""Windowed moving averages of per-FPM load figures (average ISL, decode length...).

The estimates need "a typical next request", which the regression samples
cannot give. Leading zeros are skipped so an engine idling before its first
request does not drag the average to zero. The mean is recomputed with
``math.fsum`` over the window instead of a running sum: the value then depends
only on the window's contents, never on how the values were batched, and a
restored state reproduces it bit for bit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any


class MovingAverage:
    __slots__ = ("_values", "_seen_nonzero", "_cached")

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._seen_nonzero = False
        self._cached: float | None = 0.0

    @property
    def window(self) -> int:
        return self._values.maxlen or 0

    def add(self, value: float) -> None:
        if not self._seen_nonzero:
            if value == 0.0:
                return
            self._seen_nonzero = True
        self._values.append(float(value))
        self._cached = None

    def extend(self, values: Iterable[float]) -> None:
        """Add many values; same result as adding them one by one."""
        values = list(values)
        if not self._seen_nonzero:
            first = next((i for i, v in enumerate(values) if v != 0.0), None)
            if first is None:
                return
            self._seen_nonzero = True
            values = values[first:]
        if values:
            # Only the last `window` values can survive; skip the rest cheaply.
            self._values.extend(float(v) for v in values[-self.window :])
            self._cached = None

    @property
    def value(self) -> float:
        if self._cached is None:
            self._cached = math.fsum(self._values) / len(self._values) if self._values else 0.0
        return self._cached

    def __len__(self) -> int:
        return len(self._values)

    def to_state(self) -> dict[str, Any]:
        return {"window": self.window, "values": list(self._values), "seen_nonzero": self._seen_nonzero}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> MovingAverage:
        avg = cls(int(state["window"]))
        avg._values.extend(float(v) for v in state["values"])
        avg._seen_nonzero = bool(state["seen_nonzero"])
        avg._cached = None
        return avg
