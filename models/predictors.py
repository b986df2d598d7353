"""One-step-ahead load predictors for the throughput loop.

The planner runs three of these, one each for the request count per window,
the mean ISL and the mean OSL, and sizes the fleet for the next window from
their forecasts. They follow the Dynamo Planner's predictors (constant,
ARIMA, Kalman, Prophet; same parameter names and defaults) with three
changes that matter for an event-sourced planner:

- every predictor serializes to plain JSON-able data and back exactly, so
  it can live in a changelog table and a restored worker forecasts the
  same bits as the one that died;
- nothing depends on the wall clock or global randomness: a forecast is a
  function of the observed series alone;
- ARIMA re-selects its order as traffic changes instead of freezing the
  order it picked on the first five points (``arima_frozen`` keeps the
  reference behaviour as a benchmark baseline).

Common rules for every kind (the reference's ``add_data_point``): NaN and
infinities count as 0, leading zeros are skipped until the first non-zero
value (an idle start says nothing about the load to come), forecasts are
never negative, and while a predictor has fewer points than it needs it
forecasts the last value.

This module holds the interface, the registry and the two simplest kinds
(constant, Kalman); the others register themselves from their own files:
ARIMA in models/arima.py, Prophet in models/prophet_predictor.py, the
default ensemble in models/ensemble.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "MAX_LOG1P",
    "from_log1p",
    "ConstantPredictor",
    "KalmanPredictor",
    "Predictor",
    "PredictorParams",
    "PredictorUnavailable",
    "make_predictor",
    "predictor_from_state",
    "predictor_kinds",
    "register_predictor",
]

MAX_LOG1P = 709.0
"""The largest log1p a count is taken back from: expm1 overflows past ~709.78, and a trend
extrapolated from counts near the float limit, or a quantile above them, goes there."""


def from_log1p(value: float) -> float:
    """``expm1(value)``, from at most :data:`MAX_LOG1P` (the one bound every log1p model uses)."""
    return math.expm1(min(value, MAX_LOG1P))


class PredictorUnavailable(RuntimeError):
    """A predictor kind needs an optional extra that is not installed."""


MAX_KALMAN_VARIANCE = 1e30
"""The largest ``kalman_q_level``, ``kalman_q_trend`` or ``kalman_r``.

They are variances of a count: (1e12 requests a window, a seed's largest)²
is 1e24, so a value past 1e30 is a typo or a unit mistake. Near float's
limit the filter's covariance overflows (``kalman_r`` of 1e306 made its
state NaN, which JSON writes as null and no state restores)."""


@dataclass(frozen=True)
class PredictorParams:
    """Every predictor parameter, with the Dynamo Planner's defaults.

    All kinds accept all parameters (a planner config carries them all and
    only the chosen kind uses its own), so one config can switch kinds.
    """

    log1p: bool = False
    prophet_window_size: int = 50
    # Spacing of Prophet's synthetic timestamps: the throughput interval.
    prophet_interval_s: float = 180.0
    kalman_q_level: float = 1.0
    kalman_q_trend: float = 0.1
    kalman_r: float = 10.0
    kalman_min_points: int = 5
    arima_reselect_every: int = 12
    arima_max_history: int = 256
    arima_min_points: int = 5

    @classmethod
    def from_kwargs(cls, **params: Any) -> PredictorParams:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - names)
        if unknown:
            raise ValueError(f"unknown predictor parameter(s) {unknown}; valid: {sorted(names)}")
        return cls(**params)

    def __post_init__(self) -> None:
        # Coerce JSON-loaded values to their declared types so a state read
        # back from a table equals the one that was written.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be a bool, got {value!r}")
            elif f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{f.name} must be an int, got {value!r}")
            elif f.type == "float":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ValueError(f"{f.name} must be a number, got {value!r}")
                object.__setattr__(self, f.name, float(value))
        positive = ("prophet_interval_s", "kalman_r")
        non_negative = ("kalman_q_level", "kalman_q_trend")
        at_least_one = (
            "kalman_min_points",
            "arima_reselect_every",
            "arima_min_points",
        )
        for name in positive:
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a positive finite number")
        for name in non_negative:
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(f"{name} must be a non-negative finite number")
        for name in ("kalman_q_level", "kalman_q_trend", "kalman_r"):
            if getattr(self, name) > MAX_KALMAN_VARIANCE:
                raise ValueError(f"{name} must be at most {MAX_KALMAN_VARIANCE:g}, got {getattr(self, name)!r}")
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.prophet_window_size < 2:
            raise ValueError("prophet_window_size must be >= 2")
        if self.arima_max_history < self.arima_min_points:
            raise ValueError("arima_max_history must be >= arima_min_points")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _clean(value: float) -> float:
    """A traffic value as the predictors see it: finite and >= 0.

    NaN/inf come from idle Prometheus windows (0/0); negatives cannot be a
    count or a mean length, so both read as 0 rather than poisoning a model.
    """
    v = float(value)
    return v if math.isfinite(v) and v > 0.0 else 0.0


def _non_negative(value: float) -> float:
    return value if value > 0.0 else 0.0  # also maps -0.0 and NaN to +0.0


class Predictor(ABC):
    """One-step-ahead forecaster of a non-negative scalar series."""

    kind: ClassVar[str]

    def __init__(self, params: PredictorParams | None = None) -> None:
        self.params = params or PredictorParams()
        self._skipping_idle = True
        self._count = 0
        self._last: float | None = None

    # --- feeding -------------------------------------------------------------

    def add_data_point(self, value: float) -> None:
        """Observe the next value of the series."""
        v = _clean(value)
        if self._skipping_idle:
            if v == 0.0:
                return
            self._skipping_idle = False
        self._count += 1
        self._last = v
        self._observe(v)

    def note_window_start(self, start_s: float) -> None:  # noqa: B027 - optional hook
        """The event time (s) at which the window about to be fed began.

        Only a model of the time of day reads it (the ensemble's daily
        cycle): fed without it, a series' clock is its own window count,
        which a warm-up trace from another hour or a gap in the windows
        (a planner down for an hour) puts out of phase with the day.
        """

    def reset_idle_skip(self) -> None:
        """Skip leading zeros again (called after warming from a trace).

        A deployment that starts idle after a warm-up should not drag the
        warmed model down with zeros before its first live request.
        """
        self._skipping_idle = True

    @property
    def is_skipping_idle(self) -> bool:
        """True while zeros are being dropped as an idle start."""
        return self._skipping_idle

    @property
    def num_points(self) -> int:
        """Points accepted so far (skipped idle zeros not counted)."""
        return self._count

    # --- forecasting ---------------------------------------------------------

    @property
    def min_points(self) -> int:
        """Points needed before the model replaces the last-value fallback."""
        return 1

    def predict_next(self) -> float:
        """Forecast the next value: never negative, 0.0 with no data."""
        if self._last is None:
            return 0.0
        if self._count < self.min_points:
            return self._last
        forecast = self._forecast()
        if not math.isfinite(forecast):
            return self._last
        return _non_negative(forecast)

    # --- state ---------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Plain JSON-able data; ``from_state`` of it forecasts the same bits."""
        return {
            "kind": self.kind,
            "params": self.params.to_dict(),
            "skipping_idle": self._skipping_idle,
            "count": self._count,
            "last": self._last,
            "model": self._model_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Predictor:
        if state.get("kind") != cls.kind:
            raise ValueError(f"state of kind {state.get('kind')!r} given to {cls.kind!r}")
        predictor = cls(PredictorParams.from_kwargs(**state["params"]))
        predictor._skipping_idle = bool(state["skipping_idle"])
        predictor._count = int(state["count"])
        last = state["last"]
        predictor._last = None if last is None else float(last)
        predictor._restore_model(state["model"])
        return predictor

    # --- per-kind hooks ------------------------------------------------------

    def _observe(self, value: float) -> None:  # noqa: B027 - optional hook
        """Update the model with an accepted (cleaned, non-idle) value."""

    @abstractmethod
    def _forecast(self) -> float:
        """The model's forecast; called only once ``min_points`` are in."""

    def _model_state(self) -> dict[str, Any]:
        return {}

    def _restore_model(self, model: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        pass

    # log1p helpers shared by the model-based kinds
    def _to_model(self, value: float) -> float:
        return math.log1p(value) if self.params.log1p else value

    def _from_model(self, value: float) -> float:
        return from_log1p(value) if self.params.log1p else value


class ConstantPredictor(Predictor):
    """Next window = this window. The baseline every other kind must beat."""

    kind = "constant"

    def _forecast(self) -> float:
        assert self._last is not None
        return self._last


class KalmanPredictor(Predictor):
    """Local linear trend Kalman filter (level + trend), one step ahead.

    F=[[1,1],[0,1]], H=[1,0], Q=diag(q_level, q_trend), R=r, P0=1000·I; the
    first point sets the level (trend 0). The 2x2 algebra is written out in
    scalars, so the result is bit-identical on any IEEE machine whatever
    BLAS numpy links. A falling trend can extrapolate below zero; the base
    class clamps the forecast at 0 (the reference's bug #14493).
    """

    kind = "kalman"
    P0 = 1000.0

    def __init__(self, params: PredictorParams | None = None) -> None:
        super().__init__(params)
        self._level = 0.0
        self._trend = 0.0
        # symmetric covariance [[p_ll, p_lt], [p_lt, p_tt]]
        self._p_ll = self.P0
        self._p_lt = 0.0
        self._p_tt = self.P0

    @property
    def min_points(self) -> int:
        return self.params.kalman_min_points

    def _observe(self, value: float) -> None:
        y = self._to_model(value)
        if self._count == 1:
            self._level, self._trend = y, 0.0
            self._p_ll, self._p_lt, self._p_tt = self.P0, 0.0, self.P0
            return
        q_level, q_trend, r = (
            self.params.kalman_q_level,
            self.params.kalman_q_trend,
            self.params.kalman_r,
        )
        # predict: x = F x, P = F P F' + Q
        level = self._level + self._trend
        trend = self._trend
        p_ll = self._p_ll + 2.0 * self._p_lt + self._p_tt + q_level
        p_lt = self._p_lt + self._p_tt
        p_tt = self._p_tt + q_trend
        # update with y: S = P_ll + R, K = P H' / S, P = (I - K H) P; each product takes a
        # ratio to S (at most 1 for R / S), since P·R itself overflows for a large R
        s = p_ll + r
        k_level = p_ll / s
        k_trend = p_lt / s
        innovation = y - level
        self._level = level + k_level * innovation
        self._trend = trend + k_trend * innovation
        self._p_ll = p_ll * (r / s)
        self._p_lt = p_lt * (r / s)
        self._p_tt = p_tt - p_lt * k_trend
        if not all(math.isfinite(v) for v in (self._level, self._trend, self._p_ll, self._p_lt, self._p_tt)):
            # a count near float's limit overflows level + trend: start again from it, as at the
            # first point, rather than keep a NaN state that JSON cannot carry
            self._level, self._trend = y, 0.0
            self._p_ll, self._p_lt, self._p_tt = self.P0, 0.0, self.P0

    def _forecast(self) -> float:
        return self._from_model(self._level + self._trend)

    def _model_state(self) -> dict[str, Any]:
        return {
            "x": [self._level, self._trend],
            "P": [[self._p_ll, self._p_lt], [self._p_lt, self._p_tt]],
        }

    def _restore_model(self, model: dict[str, Any]) -> None:
        (level, trend), ((p_ll, p_lt), (_, p_tt)) = model["x"], model["P"]
        values = [level, trend, p_ll, p_lt, p_tt]
        # JSON has no NaN or inf (orjson writes them as null): such a state is refused by name
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            raise ValueError(f"kalman state: x and P must be finite numbers, got x={model['x']!r} P={model['P']!r}")
        self._level, self._trend = float(level), float(trend)
        self._p_ll, self._p_lt, self._p_tt = float(p_ll), float(p_lt), float(p_tt)


# --- statsmodels, quietly, on one BLAS thread (ARIMA and Prophet) ------------

@contextmanager
def statsmodels_run() -> Iterator[None]:
    """Run statsmodels on one BLAS thread, its convergence warnings silenced.

    A bad candidate order is expected during selection; it loses or fails
    over to the last value, and its warnings would only be noise.

    One thread, because these fits multiply matrices of at most four rows
    thousands of times: OpenBLAS's threads only add hand-offs, and when the
    other cores are busy (a worker beside other pods, a benchmark beside
    another) every hand-off waits for a core. Measured on 2 cores with the
    other one busy, ARIMA forecasting over a ServeGen week took 88 s with
    OpenBLAS's threads and 29 s with one (bench/bench_blas.py,
    docs/benchmarks.md "BLAS threads"). One thread also makes a fit's
    arithmetic the same on any machine.
    """
    # Import first: statsmodels installs "always" warning filters when its
    # exceptions module is first imported, which would shadow ours.
    import statsmodels.tsa.arima.model  # noqa: F401
    import statsmodels.tsa.stattools  # noqa: F401

    with _blas_controller().limit(limits=1, user_api="blas"), warnings.catch_warnings(), \
            np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


@functools.cache
def _blas_controller():
    """The process's BLAS thread pools, found once (after statsmodels loaded them).

    Finding them walks the loaded libraries (about 0.6 ms); limiting them
    through the found controller then costs about 12 us a fit.
    """
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


# --- registry ----------------------------------------------------------------

_KINDS: dict[str, type[Predictor]] = {
    cls.kind: cls
    for cls in (ConstantPredictor, KalmanPredictor)
}


def register_predictor(cls: type[Predictor]) -> type[Predictor]:
    """Make a Predictor subclass available by its ``kind`` (a class decorator).

    Lets a new predictor live in its own module, as a new scaler does in
    KEDA, without editing this one. Registering another class under a taken
    kind is refused, so a state can never be restored into the wrong model.
    """
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{cls.__name__} needs a non-empty class attribute 'kind'")
    if _KINDS.get(kind, cls) is not cls:
        raise ValueError(f"predictor kind {kind!r} is already registered")
    _KINDS[kind] = cls
    return cls


def predictor_kinds() -> tuple[str, ...]:
    """The valid ``kind`` names."""
    return tuple(_KINDS)


def _class_for(kind: str) -> type[Predictor]:
    try:
        return _KINDS[kind]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown predictor kind {kind!r}; valid kinds: {', '.join(_KINDS)}"
        ) from None


def make_predictor(kind: str, **params: Any) -> Predictor:
    """A fresh predictor of ``kind`` (``load_predictor`` in a Dynamo config)."""
    cls = _class_for(kind)
    return cls(PredictorParams.from_kwargs(**params))


def predictor_from_state(state: dict[str, Any]) -> Predictor:
    """Rebuild a predictor from ``to_state`` output, whatever its kind."""
    return _class_for(state.get("kind")).from_state(state)
