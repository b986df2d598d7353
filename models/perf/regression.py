"""An online regression of forward-pass wall time: bucketed samples plus a lazy fit.

Thousands of FPMs arrive between two planner ticks but only the tick reads
the model, so samples are cheap to add and the fit runs at most once per
change, when a prediction is first needed. The cached fit is part of the
state so a restored planner does not refit; a refit from the same samples
gives the same coefficients anyway (same samples, same order, same routine).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetplan.models.perf.fit import LinearFit, fit_nonnegative, fit_quadratic
from fleetplan.models.perf.retention import BucketedSamples
from fleetplan.models.perf.settings import RegressionSettings


class OnlineRegression:
    def __init__(self, ndim: int, settings: RegressionSettings, *, quadratic: bool = False) -> None:
        if quadratic and ndim != 1:
            raise ValueError("a quadratic fit takes one feature")
        self.ndim = ndim
        self.settings = settings
        self.quadratic = quadratic
        self.samples = BucketedSamples(
            ndim, settings.max_num_fpm_samples, settings.buckets_per_axis(ndim)
        )
        self._fit: LinearFit | None = None

    @property
    def num_samples(self) -> int:
        return len(self.samples)

    @property
    def ready(self) -> bool:
        """Enough samples to trust a fit (``load_min_observations``)."""
        return len(self.samples) >= self.settings.load_min_observations

    def add(self, x: tuple[float, ...], wall_time: float) -> None:
        self.samples.add(x, wall_time)
        self._fit = None

    def add_many(self, x: np.ndarray, wall_time: np.ndarray) -> None:
        if len(wall_time):
            self.samples.add_many(x, wall_time)
            self._fit = None

    def fit(self) -> LinearFit | None:
        """The current fit, refitted only if samples changed; None until ready."""
        if not self.ready:
            return None
        if self._fit is None:
            x, y = self.samples.arrays()
            fit = fit_quadratic if self.quadratic else fit_nonnegative
            self._fit = fit(x, y, nonnegative_intercept=self.settings.nonnegative_intercept)
        return self._fit

    def predict(self, *x: float) -> float | None:
        fit = self.fit()
        return None if fit is None else fit.predict(*x)

    def to_state(self) -> dict[str, Any]:
        return {
            "samples": self.samples.to_state(),
            "quadratic": self.quadratic,
            "fit": None if self._fit is None else self._fit.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], settings: RegressionSettings) -> OnlineRegression:
        samples = BucketedSamples.from_state(state["samples"])
        regression = cls(samples.ndim, settings, quadratic=bool(state.get("quadratic", False)))
        regression.samples = samples
        regression._fit = None if state["fit"] is None else LinearFit.from_state(state["fit"])
        return regression
