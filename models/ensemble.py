"""The default load predictor: a loss-weighted ensemble of simple forecasters.

Measured one step ahead on real traffic (bench/forecast.py), no single model
wins everywhere: bursty traffic (Azure code) wants a long, robust average;
smooth traffic with a drift (Azure conv) wants the last value plus a damped
trend; production curves with a daily cycle (ServeGen) want the last value
nudged along the learned cycle. ``EnsemblePredictor`` runs one of each and
forecasts a weighted mean of their forecasts, each weighted by its own
recent error, so it follows whichever fits the series it is fed.

Everything happens in log space, ``z = log1p(y)``: the planner's loss is an
absolute error of logs (a 2x miss costs the same at any scale), traffic
varies multiplicatively, and the median of z, which an absolute-error
ensemble aims for, is the load's median too.

Idle windows (a zero after traffic) are handled apart: a run of zeros is
an outage or a lull, not a level the members should average in, and the
window after an idle one is often a partial one (a tenant starting up).
The members learn only from busy windows; the forecast after an idle
window is the lower median of what followed the last few idle windows (0
for another idle window), and 0 before any was seen, as the reference's
last value would say.

Importing this module registers the ``ensemble`` kind with
``make_predictor`` / ``predictor_from_state``.

The window length (for the daily cycle) is the ``prophet_interval_s``
parameter, documented as the throughput interval: set it to
``throughput_adjustment_interval_seconds``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from fleetplan.models.predictors import Predictor, PredictorParams, from_log1p, register_predictor
from fleetplan.models.seasonal import DailyProfile

__all__ = ["EnsemblePredictor", "MEMBERS"]

# Members, in a fixed order (the state and the weights follow it).
MEMBERS = (
    "last",  # the busy level now
    "ewma_fast",  # last values, lightly smoothed: an MA(1) against one-window noise
    "ewma_slow",  # a long average: bursty traffic that reverts to its level
    "median",  # the median of recent busy windows: bursty traffic with outliers
    "damped_trend",  # level + damped trend: a ramp that will not go on forever
    "daily_last",  # last value moved along the daily cycle
    "daily_smooth",  # smoothed deseasonalized level plus the daily cycle
)

EWMA_FAST = 0.6
EWMA_SLOW = 0.15
MEDIAN_SPAN = 5
TREND_ALPHA = 0.5
TREND_BETA = 0.3
TREND_DAMPING = 0.8
DAILY_SMOOTH_ALPHA = 0.5

# Weights: a discounted mean absolute error per member (memory ~ 1/(1-DISCOUNT)
# windows), shrunk toward the members' average by PRIOR_WINDOWS pseudo-windows
# so a few early windows cannot crown a member; weight = exp(-SHARPNESS * (
# error / best error - 1)), so a member twice as bad as the best counts e^-SHARPNESS.
DISCOUNT = 0.95
PRIOR_WINDOWS = 2.0
SHARPNESS = 8.0
IDLE_SPAN = 5  # post-idle outcomes remembered
# Non-anchor members must beat the last value by this much to tie with it:
# Occam's razor for a series (a step-like ISL) that no model improves on.
ANCHOR_EDGE = 0.1
DAILY_HARMONICS = 3
DAILY_MEMORY_DAYS = 3.0


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return 0.5 * (ordered[mid - 1] + ordered[mid])


@register_predictor
class EnsemblePredictor(Predictor):
    """Loss-weighted ensemble of level, trend, robust and daily-cycle members."""

    kind: ClassVar[str] = "ensemble"

    def __init__(self, params: PredictorParams | None = None) -> None:
        super().__init__(params)
        # the daily phase: the window's start over the window length once the
        # caller gives it (note_window_start), else the windows fed, idle included
        self._clock = 0
        self._timed = False
        self._busy = 0  # busy (non-zero) windows the members learned from
        self._recent: list[float] = []  # last MEDIAN_SPAN busy z values
        self._last_z = 0.0
        self._fast = 0.0
        self._slow = 0.0
        self._trend_level = 0.0
        self._trend = 0.0
        self._daily_level = 0.0
        self._daily_prev_t = 0  # window of the last busy value (for daily_last)
        self._profile = DailyProfile(
            self.params.prophet_interval_s, DAILY_HARMONICS, DAILY_MEMORY_DAYS
        )
        # per member: discounted sum of absolute errors and count of scored windows
        self._errors = [0.0] * len(MEMBERS)
        self._scored = [0.0] * len(MEMBERS)
        self._after_idle: list[float] = []  # z of the windows that followed idle ones
        self._last_idle = False

    # --- feeding -------------------------------------------------------------

    def note_window_start(self, start_s: float) -> None:
        """Set the clock from the window's start: the daily cycle follows the time of day.

        Windows fed before without a time (a warm-up trace, or a state from
        before the clock) are taken to have run up to this one: the cycle
        learned on their count is moved onto the time of day.
        """
        if not math.isfinite(start_s):
            return
        t = math.floor(start_s / self._profile.interval_s + 0.5)
        if not self._timed:
            jump = t - self._clock
            if self._profile.updates:  # a cycle learned on counted windows: move it
                self._profile.shift(jump)
            self._daily_prev_t += jump
            self._timed = True
        self._clock = t

    def add_data_point(self, value: float) -> None:
        skipping = self.is_skipping_idle
        super().add_data_point(value)
        if skipping and self.is_skipping_idle:
            self._clock += 1  # an idle start: time passes, nothing is learned

    def _observe(self, value: float) -> None:
        t = self._clock
        self._clock += 1
        idle = value == 0.0
        z = math.log1p(value)
        if self._last_idle:
            self._after_idle.append(z)
            if len(self._after_idle) > IDLE_SPAN:
                del self._after_idle[0]
        self._last_idle = idle
        if idle:
            return
        if self._busy > 0:
            self._score_members(t, z)
        self._learn(t, z)

    def _score_members(self, t: int, z: float) -> None:
        forecasts = self._member_forecasts(t)
        for i, f in enumerate(forecasts):
            if f is None:
                continue
            self._errors[i] = DISCOUNT * self._errors[i] + abs(f - z)
            self._scored[i] = DISCOUNT * self._scored[i] + 1.0

    def _learn(self, t: int, z: float) -> None:
        first = self._busy == 0
        self._busy += 1
        self._recent.append(z)
        if len(self._recent) > MEDIAN_SPAN:
            del self._recent[0]
        shape_now = self._profile.shape(t) if self._profile.usable else 0.0
        if first:
            self._fast = self._slow = self._trend_level = z
            self._trend = 0.0
            self._daily_level = z - shape_now
        else:
            self._fast += EWMA_FAST * (z - self._fast)
            self._slow += EWMA_SLOW * (z - self._slow)
            predicted = self._trend_level + TREND_DAMPING * self._trend
            level = predicted + TREND_ALPHA * (z - predicted)
            self._trend = (
                TREND_BETA * (level - self._trend_level)
                + (1.0 - TREND_BETA) * TREND_DAMPING * self._trend
            )
            self._trend_level = level
            self._daily_level += DAILY_SMOOTH_ALPHA * (z - shape_now - self._daily_level)
        self._last_z = z
        self._daily_prev_t = t
        if self._profile.usable:
            self._profile.update(t, z)

    # --- forecasting ---------------------------------------------------------

    def _seasonal_ready(self) -> bool:
        return self._profile.usable and self._profile.covers_a_day()

    def _member_forecasts(self, t: int) -> list[float | None]:
        """Each member's forecast of z at window ``t`` (None: not active yet)."""
        seasonal = self._seasonal_ready()
        shape_next = self._profile.shape(t) if seasonal else 0.0
        out: list[float | None] = []
        for name in MEMBERS:
            if name == "last":
                out.append(self._last_z)
            elif name == "ewma_fast":
                out.append(self._fast)
            elif name == "ewma_slow":
                out.append(self._slow)
            elif name == "median":  # no busy window yet: 0, as the other members start
                out.append(_median(self._recent) if self._recent else 0.0)
            elif name == "damped_trend":
                out.append(self._trend_level + TREND_DAMPING * self._trend)
            elif name == "daily_last":
                out.append(
                    self._last_z + shape_next - self._profile.shape(self._daily_prev_t)
                    if seasonal
                    else None
                )
            elif name == "daily_smooth":
                out.append(self._daily_level + shape_next if seasonal else None)
        return out

    def member_weights(self) -> dict[str, float]:
        """Each member's current weight (active members sum to 1), for inspection."""
        forecasts = self._member_forecasts(self._clock)
        weights = self._weights(forecasts)
        return {name: weights[i] for i, name in enumerate(MEMBERS)}

    def _weights(self, forecasts: list[float | None]) -> list[float]:
        active = [i for i, f in enumerate(forecasts) if f is not None]
        means = [self._errors[i] / self._scored[i] for i in active if self._scored[i] > 0.0]
        prior = math.fsum(means) / len(means) if means else 0.0
        scores = {
            i: (self._errors[i] + PRIOR_WINDOWS * prior)
            / (self._scored[i] + PRIOR_WINDOWS)
            * (1.0 if i == 0 else 1.0 + ANCHOR_EDGE)
            for i in active
        }
        best = min(scores.values())
        weights = [0.0] * len(MEMBERS)
        if best <= 0.0:
            for i in active:
                weights[i] = 1.0 if scores[i] <= 0.0 else 0.0
        else:
            for i in active:
                weights[i] = math.exp(-SHARPNESS * (scores[i] / best - 1.0))
        total = math.fsum(weights)
        return [w / total for w in weights]

    def _forecast(self) -> float:
        if self._busy == 0:
            return 0.0
        if self._last_idle:
            # the lower median: a value that happened, never a blend of idle
            # and busy (log1p(n) halfway to a busy level is far from halfway
            # in tokens); a tie means idle, as the last value would say
            ordered = sorted(self._after_idle)
            return math.expm1(ordered[(len(ordered) - 1) // 2]) if ordered else 0.0
        forecasts = self._member_forecasts(self._clock)
        weights = self._weights(forecasts)
        z = math.fsum(w * f for w, f in zip(weights, forecasts, strict=True) if f is not None)
        return from_log1p(max(z, 0.0))

    # --- state ---------------------------------------------------------------

    def _model_state(self) -> dict[str, Any]:
        return {
            "clock": self._clock,
            "timed": self._timed,
            "busy": self._busy,
            "recent": list(self._recent),
            "last_z": self._last_z,
            "fast": self._fast,
            "slow": self._slow,
            "trend_level": self._trend_level,
            "trend": self._trend,
            "daily_level": self._daily_level,
            "daily_prev_t": self._daily_prev_t,
            "profile": self._profile.to_state(),
            "errors": list(self._errors),
            "scored": list(self._scored),
            "after_idle": list(self._after_idle),
            "last_idle": self._last_idle,
        }

    def _restore_model(self, model: dict[str, Any]) -> None:
        self._clock = int(model["clock"])
        self._timed = bool(model.get("timed", False))  # states from before the time of day: counted
        self._busy = int(model["busy"])
        self._recent = [float(v) for v in model["recent"]]
        self._last_z = float(model["last_z"])
        self._fast = float(model["fast"])
        self._slow = float(model["slow"])
        self._trend_level = float(model["trend_level"])
        self._trend = float(model["trend"])
        self._daily_level = float(model["daily_level"])
        self._daily_prev_t = int(model["daily_prev_t"])
        self._profile = DailyProfile.from_state(model["profile"])
        errors = [float(v) for v in model["errors"]]
        scored = [float(v) for v in model["scored"]]
        if len(errors) != len(MEMBERS) or len(scored) != len(MEMBERS):
            raise ValueError(f"ensemble state does not have the {len(MEMBERS)} members {MEMBERS}")
        self._errors, self._scored = errors, scored
        self._after_idle = [float(v) for v in model["after_idle"]]
        self._last_idle = bool(model["last_idle"])
