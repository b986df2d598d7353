"""What the three role models share: observing FPMs, readiness, the fit, state.

Each role model (prefill, decode, agg) is one online regression of wall time
on that role's features plus the moving averages its estimates need.
Heartbeats (``wall_time == 0``) carry no timing and only move the averages.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fleetplan.models.perf.averages import MovingAverage
from fleetplan.models.perf.columns import FpmColumns
from fleetplan.models.perf.fit import LinearFit
from fleetplan.models.perf.limits import EngineLimits
from fleetplan.models.perf.regression import OnlineRegression
from fleetplan.models.perf.settings import RegressionSettings
from fleetplan.schemas import ForwardPassMetrics, Role, ScheduledRequests


class RolePerfModel:
    role: ClassVar[Role]
    ndim: ClassVar[int]
    averages_kept: ClassVar[tuple[str, ...]]

    def __init__(
        self, limits: EngineLimits | None = None, settings: RegressionSettings | None = None
    ) -> None:
        self.limits = limits if limits is not None else EngineLimits()
        self.settings = settings if settings is not None else RegressionSettings()
        self.regression = OnlineRegression(self.ndim, self.settings)
        self.averages = {
            name: MovingAverage(self.settings.average_window) for name in self.averages_kept
        }
        self.max_observed_kv = 0.0

    # -- observing -----------------------------------------------------------

    def observe(self, fpm: ForwardPassMetrics) -> None:
        if fpm.role != self.role:
            raise ValueError(f"{self.role} model got an FPM of role {fpm.role}")
        scheduled = fpm.scheduled
        self._observe_averages(scheduled)
        kv = float(scheduled.sum_decode_kv_tokens)
        if kv > self.max_observed_kv:
            self.max_observed_kv = kv
        if fpm.wall_time > 0.0:
            self.regression.add(self._features(scheduled), fpm.wall_time)

    def observe_batch(self, columns: FpmColumns) -> None:
        """Observe n FPMs in order; the same state as ``observe`` on each."""
        if len(columns) == 0:
            return
        self._observe_averages_many(columns)
        self.max_observed_kv = max(self.max_observed_kv, float(columns.sum_decode_kv_tokens.max()))
        timed = columns.wall_time > 0.0
        if timed.any():
            self.regression.add_many(self._feature_columns(columns)[timed], columns.wall_time[timed])

    def seed(self, columns: FpmColumns) -> None:
        """Bootstrap from a profile's synthetic FPMs (``seed_samples``): observed as live ones."""
        self.observe_batch(columns)

    # -- reading -------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.regression.ready

    @property
    def num_samples(self) -> int:
        return self.regression.num_samples

    def fit(self) -> LinearFit | None:
        return self.regression.fit()

    def average(self, name: str) -> float:
        return self.averages[name].value

    # -- role specifics --------------------------------------------------------

    def _features(self, scheduled: ScheduledRequests) -> tuple[float, ...]:
        raise NotImplementedError

    def _feature_columns(self, columns: FpmColumns) -> np.ndarray:
        raise NotImplementedError

    def _observe_averages(self, scheduled: ScheduledRequests) -> None:
        raise NotImplementedError

    def _observe_averages_many(self, columns: FpmColumns) -> None:
        raise NotImplementedError

    # -- state -----------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain JSON-able data; ``from_state`` rebuilds an identical model."""
        return {
            "role": self.role,
            "limits": self.limits.to_state(),
            "settings": self.settings.to_state(),
            "regression": self.regression.to_state(),
            "averages": {name: avg.to_state() for name, avg in self.averages.items()},
            "max_observed_kv": self.max_observed_kv,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RolePerfModel:
        if state["role"] != cls.role:
            raise ValueError(f"state of a {state['role']} model given to {cls.role}")
        model = cls(EngineLimits.from_state(state["limits"]), RegressionSettings.from_state(state["settings"]))
        model.regression = OnlineRegression.from_state(state["regression"], model.settings)
        model.averages = {
            name: MovingAverage.from_state(state["averages"][name]) for name in cls.averages_kept
        }
        model.max_observed_kv = float(state["max_observed_kv"])
        return model


def per_request(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """total/count where count > 0 (the rows an average takes), as a compact array."""
    has = count > 0
    return total[has] / count[has]
