"""Quantile forecasts of the request count, calibrated on the forecaster's own errors.

A point forecast is a median at best, so sizing the fleet for it
under-provisions about half of the windows, and under-provisioning costs
far more than a spare replica (SLA misses, queues that take minutes to
drain). ``QuantileForecaster`` wraps a ``TrafficForecaster`` and turns its
one-step count forecast into quantiles:

    quantile(q, horizon_windows=h) = the q-quantile of the largest request
    count among the next h windows.

The throughput loop sizes for ``quantile(0.9, h)`` with h the windows a new
worker needs to become ready, so the capacity it asks for now is there when
the load arrives.

How: every observed window records the pair (forecast made before it,
what arrived). For a horizon h, each past origin s gives the log ratio

    r_h(s) = log1p(max(n_s, ..., n_{s+h-1})) - log1p(forecast_s)

and the answer is ``expm1(log1p(forecast_now) + Q)``, Q the conformal
q-quantile of the recent r_h: the ``ceil((m + 1) q)``-th smallest of m
values, which covers a new window with probability at least q when the
errors are exchangeable. Nothing is assumed about the error distribution
(bursty traffic has heavy, skewed errors), the ratio form carries the
errors over to a different load level, and a forecaster that improves gets
tighter quantiles by itself. Quantiles are made non-decreasing in h (a
longer horizon never asks for less), and are never negative.

While fewer than ``min_pairs`` pairs exist the quantiles are not
calibrated: the largest ratio seen so far is used (0 before any), and
``calibrated(h)`` says so.
"""

from __future__ import annotations

import math
from typing import Any

from fleetplan.models.forecast import TrafficForecaster, TrafficObservation

__all__ = ["QuantileForecaster"]

DEFAULT_KIND = "ensemble"
DEFAULT_HISTORY = 256
DEFAULT_MIN_PAIRS = 20


def _count(value: float) -> float:
    v = float(value)
    return v if math.isfinite(v) and v > 0.0 else 0.0


def _conformal(values: list[float], q: float) -> float:
    """The ceil((m + 1) q)-th smallest of m values, capped at the largest."""
    ordered = sorted(values)
    rank = math.ceil((len(ordered) + 1) * q)
    return ordered[min(max(rank, 1), len(ordered)) - 1]


class QuantileForecaster:
    """Point and quantile forecasts of the next windows' traffic.

    ``kind`` and ``params`` build the wrapped ``TrafficForecaster`` (the
    point forecasts are exactly its). ``history`` is how many recent
    windows calibrate the quantiles, ``min_pairs`` how many are needed
    before they count as calibrated.
    """

    def __init__(
        self,
        kind: str = DEFAULT_KIND,
        *,
        history: int = DEFAULT_HISTORY,
        min_pairs: int = DEFAULT_MIN_PAIRS,
        **params: Any,
    ) -> None:
        if history < 2:
            raise ValueError("history must be >= 2")
        if min_pairs < 1:
            raise ValueError("min_pairs must be >= 1")
        self._forecaster = TrafficForecaster(kind, **params)
        self.history = int(history)
        self.min_pairs = int(min_pairs)
        # (forecast made before the window, requests that arrived), oldest first
        self._forecasts: list[float] = []
        self._actuals: list[float] = []

    @classmethod
    def wrapping(
        cls,
        forecaster: TrafficForecaster,
        *,
        history: int = DEFAULT_HISTORY,
        min_pairs: int = DEFAULT_MIN_PAIRS,
    ) -> QuantileForecaster:
        """Wrap an existing (possibly warmed) forecaster; calibration starts empty."""
        state = {
            "forecaster": forecaster.to_state(),
            "history": history,
            "min_pairs": min_pairs,
            "forecasts": [],
            "actuals": [],
        }
        qf = cls.from_state(state)
        qf._forecaster = forecaster  # the caller's object, not a copy
        return qf

    # --- feeding -------------------------------------------------------------

    def observe(self, obs: TrafficObservation) -> None:
        """Feed one closed window, scoring the forecast that was made for it."""
        forecast = self._forecaster.forecast()[0]
        self._forecasts.append(forecast)
        self._actuals.append(_count(obs.num_req))
        excess = len(self._forecasts) - self.history
        if excess > 0:
            del self._forecasts[:excess]
            del self._actuals[:excess]
        self._forecaster.observe(obs)

    def warm(self, observations) -> None:
        """Replay recorded windows (they calibrate too), then skip an idle start again."""
        for obs in observations:
            self.observe(obs)
        for predictor in self._forecaster.predictors:
            predictor.reset_idle_skip()

    # --- forecasting ---------------------------------------------------------

    def forecast(self) -> tuple[float, float, float]:
        """(num_req, isl, osl) expected in the next window: the wrapped point forecast."""
        return self._forecaster.forecast()

    @property
    def forecaster(self) -> TrafficForecaster:
        """The wrapped point forecaster (KV hit rate, accept length, predictors)."""
        return self._forecaster

    def calibrated(self, horizon_windows: int = 1) -> bool:
        """True when at least ``min_pairs`` origins calibrate this horizon."""
        return len(self._forecasts) - int(horizon_windows) + 1 >= self.min_pairs

    def quantile(self, q: float, horizon_windows: int = 1) -> float:
        """The q-quantile of the largest request count in the next ``horizon_windows`` windows."""
        return self.quantiles(q, horizon_windows)[-1]

    def quantiles(self, q: float, horizon_windows: int) -> list[float]:
        """``quantile(q, h)`` for h = 1 .. horizon_windows, in one pass (non-decreasing)."""
        q = float(q)
        if not (0.0 < q < 1.0):
            raise ValueError(f"q must be in (0, 1), got {q!r}")
        horizon = int(horizon_windows)
        if horizon < 1:
            raise ValueError(f"horizon_windows must be >= 1, got {horizon_windows!r}")
        base = math.log1p(self._forecaster.forecast()[0])
        ratios = self._ratios(horizon)
        out: list[float] = []
        floor = -math.inf
        for h in range(1, horizon + 1):
            values = ratios[h - 1]
            if not values:
                # no origin spans h windows yet: extend the shorter horizon's spread
                spread = floor if floor > -math.inf else 0.0
            elif len(values) < self.min_pairs:
                spread = max(values)  # not calibrated yet: the worst miss seen
            else:
                spread = _conformal(values, q)
            floor = max(floor, spread)
            out.append(max(0.0, math.expm1(base + floor)))
        return out

    def _ratios(self, horizon: int) -> list[list[float]]:
        """r_h(s) for every origin s and h = 1 .. horizon (index h - 1)."""
        forecasts, actuals = self._forecasts, self._actuals
        m = len(forecasts)
        logs = [math.log1p(a) for a in actuals]
        out: list[list[float]] = [[] for _ in range(horizon)]
        for s in range(m):
            anchor = math.log1p(forecasts[s])
            peak = -math.inf
            for h in range(1, min(horizon, m - s) + 1):
                peak = max(peak, logs[s + h - 1])
                out[h - 1].append(peak - anchor)
        return out

    # --- state ---------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "forecaster": self._forecaster.to_state(),
            "history": self.history,
            "min_pairs": self.min_pairs,
            "forecasts": list(self._forecasts),
            "actuals": list(self._actuals),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> QuantileForecaster:
        qf = cls.__new__(cls)
        qf._forecaster = TrafficForecaster.from_state(state["forecaster"])
        qf.history = int(state["history"])
        qf.min_pairs = int(state["min_pairs"])
        if qf.history < 2 or qf.min_pairs < 1:
            raise ValueError("quantile state needs history >= 2 and min_pairs >= 1")
        qf._forecasts = [float(v) for v in state["forecasts"]]
        qf._actuals = [float(v) for v in state["actuals"]]
        if len(qf._forecasts) != len(qf._actuals):
            raise ValueError("quantile state has unequal forecast and actual histories")
        return qf
