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
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "ArimaPredictor",
    "ConstantPredictor",
    "FrozenArimaPredictor",
    "KalmanPredictor",
    "Predictor",
    "PredictorParams",
    "PredictorUnavailable",
    "ProphetPredictor",
    "make_predictor",
    "predictor_from_state",
    "predictor_kinds",
    "register_predictor",
]


class PredictorUnavailable(RuntimeError):
    """A predictor kind needs an optional extra that is not installed."""


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
        return math.expm1(value) if self.params.log1p else value


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
        # update with y: S = P_ll + R, K = P H' / S, P = (I - K H) P
        s = p_ll + r
        k_level = p_ll / s
        k_trend = p_lt / s
        innovation = y - level
        self._level = level + k_level * innovation
        self._trend = trend + k_trend * innovation
        self._p_ll = p_ll * r / s
        self._p_lt = p_lt * r / s
        self._p_tt = p_tt - p_lt * p_lt / s

    def _forecast(self) -> float:
        return self._from_model(self._level + self._trend)

    def _model_state(self) -> dict[str, Any]:
        return {
            "x": [self._level, self._trend],
            "P": [[self._p_ll, self._p_lt], [self._p_lt, self._p_tt]],
        }

    def _restore_model(self, model: dict[str, Any]) -> None:
        self._level, self._trend = (float(v) for v in model["x"])
        (p_ll, p_lt), (_, p_tt) = model["P"]
        self._p_ll, self._p_lt, self._p_tt = float(p_ll), float(p_lt), float(p_tt)


# --- ARIMA -------------------------------------------------------------------

_MAX_P = 2
_MAX_Q = 2
_KPSS_ALPHA = 0.05


@dataclass(frozen=True)
class _ArimaFit:
    order: tuple[int, int, int]
    params: tuple[float, ...]
    score: float  # lower is better


@contextmanager
def _statsmodels_run() -> Iterator[None]:
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


def _trend_for(d: int) -> str:
    # A mean for a stationary series; no drift once differenced: a drift
    # term extrapolates a temporary ramp forever, which over-provisions.
    return "c" if d == 0 else "n"


def _choose_d(y: np.ndarray) -> int:
    """Differencing order by a KPSS stationarity test, as auto_arima does.

    AIC cannot compare models with different d (they explain different
    data), so auto_arima chooses d first and only (p, q) by AIC.
    """
    from statsmodels.tsa.stattools import kpss

    try:
        p_value = kpss(y, regression="c", nlags="auto")[1]
    except Exception:  # too short or degenerate for the test: assume stationary
        return 0
    return 1 if p_value < _KPSS_ALPHA else 0


def _max_pq(n_eff: int) -> int:
    """How many ARMA terms a window of n_eff points can support."""
    return max(0, (n_eff - 5) // 4)


_MAX_ITER = 40
"""MLE iterations per candidate fit: enough for these small models to settle,
and a hard bound on the cost of a selection (unbounded, one fit took 10 s)."""


def _fit_order(y: np.ndarray, order: tuple[int, int, int], start=None):
    from statsmodels.tsa.arima.model import ARIMA

    model = ARIMA(y, order=order, trend=_trend_for(order[1]))
    return model.fit(start_params=start, cov_type="none", method_kwargs={"maxiter": _MAX_ITER})


def _candidate_orders(y: np.ndarray, smoothing_rescue: bool) -> list[tuple[int, int, int]]:
    """(p, d, q) with p, q in 0..2 at the KPSS d, as many as the window supports.

    With ``smoothing_rescue`` a stationary verdict also gets the random walk
    (0,1,0), which is the constant predictor, and simple exponential
    smoothing (0,1,1): KPSS has little power on a few hundred noisy points,
    and these two are what a mean-reverting fit most often loses to.
    """
    d = _choose_d(y)
    limit = _max_pq(len(y) - d)
    orders = [(p, d, q) for p in range(_MAX_P + 1) for q in range(_MAX_Q + 1) if p + q <= limit]
    if smoothing_rescue and d == 0:
        orders.append((0, 1, 0))
        if _max_pq(len(y) - 1) >= 1:
            orders.append((0, 1, 1))
    return orders


def _one_step_error(res, y: np.ndarray) -> float:
    """Mean absolute one-step-ahead error over the second half of the window.

    These are the filter's own forecasts, i.e. what the planner would have
    been told, and unlike AIC they compare models with different d.
    """
    predicted = np.asarray(res.fittedvalues, dtype=float)
    half = len(y) // 2
    return float(np.mean(np.abs(predicted[half:] - y[half:])))


def _select_order(y: np.ndarray, criterion: str) -> _ArimaFit | None:
    """The best candidate by ``criterion`` ("one_step" or "aic"); None if none fits."""
    best: _ArimaFit | None = None
    for order in _candidate_orders(y, smoothing_rescue=criterion == "one_step"):
        try:
            res = _fit_order(y, order)
        except Exception:  # a candidate that cannot be fitted just loses
            continue
        score = _one_step_error(res, y) if criterion == "one_step" else float(res.aic)
        params = tuple(float(v) for v in res.params)
        if not math.isfinite(score) or not all(math.isfinite(v) for v in params):
            continue
        if best is None or score < best.score:  # ties: the simpler, earlier order
            best = _ArimaFit(order, params, score)
    return best


def _forecast_with(y: np.ndarray, order: tuple[int, int, int], params) -> float:
    """One-step forecast of a fixed ARIMA model run over the window y."""
    from statsmodels.tsa.arima.model import ARIMA

    model = ARIMA(y, order=order, trend=_trend_for(order[1]))
    res = model.filter(np.asarray(params, dtype=float))
    return float(res.forecast(1)[0])


class ArimaPredictor(Predictor):
    """ARIMA whose order follows the traffic.

    The order (p, d, q) is re-selected every ``arima_reselect_every`` points
    on the last ``arima_max_history`` points: d by a KPSS test, (p, q) in
    0..2, plus the random walk and exponential smoothing when KPSS says
    stationary; each candidate is fitted by statsmodels' state-space MLE
    and the one with the smallest one-step-ahead error over the second half
    of the window wins. That error is what the planner would have been
    told, and unlike AIC it compares models with different d (measured
    against AIC in docs/predictors.md). Selections fall on a fixed grid of
    point counts (every point for the first N, then every N), so the model
    used at any point is a function of the series alone, not of when
    someone asked for a forecast. Between selections the chosen order is
    refitted on the latest window, starting from the selection's
    coefficients, which takes a few milliseconds. The reference instead
    picks an order once and only nudges coefficients afterwards, which
    flattens to the mean when traffic turns.
    """

    kind = "arima"
    _criterion = "one_step"

    def __init__(self, params: PredictorParams | None = None) -> None:
        super().__init__(params)
        self._history: list[float] = []
        self._order: tuple[int, int, int] | None = None
        self._coefs: tuple[float, ...] | None = None
        self._selected_at: int | None = None
        self._log_mode = self.params.log1p

    @property
    def min_points(self) -> int:
        return self.params.arima_min_points

    @property
    def order(self) -> tuple[int, int, int] | None:
        """The (p, d, q) in use, None before the first selection."""
        return self._order

    @property
    def selected_at(self) -> int | None:
        """The point count whose window the current order was chosen on."""
        return self._selected_at

    def _kept_points(self) -> int:
        # The window of the latest grid point may lie up to N-1 points back.
        return self.params.arima_max_history + self.params.arima_reselect_every - 1

    def _observe(self, value: float) -> None:
        self._history.append(value)
        excess = len(self._history) - self._kept_points()
        if excess > 0:
            del self._history[:excess]

    def _window(self, end_count: int) -> np.ndarray:
        """The model-space window of the last max_history points up to end_count."""
        end = len(self._history) - (self._count - end_count)
        start = max(0, end - self.params.arima_max_history)
        y = np.asarray(self._history[start:end], dtype=float)
        return np.log1p(y) if self._log_mode else y

    def _grid_point(self) -> int:
        """The point count whose window the model in use must be chosen on.

        Every point for the first N points (small windows are cheap to fit
        and an order chosen on five points is a guess), then every N.
        """
        every, first = self.params.arima_reselect_every, self.min_points
        if self._count < first + every:
            return self._count
        return first + every + ((self._count - first - every) // every) * every

    def _ensure_selected(self) -> None:
        due = self._grid_point()
        if self._selected_at == due:
            return
        self._select(self._window(due), due)

    def _select(self, y: np.ndarray, at_count: int) -> None:
        self._selected_at = at_count
        self._order, self._coefs = None, None
        if np.ptp(y) == 0.0:
            return  # a flat window has no dynamics to fit
        with _statsmodels_run():
            fit = _select_order(y, self._criterion)
        if fit is not None:
            self._order, self._coefs = fit.order, fit.params

    def _forecast(self) -> float:
        self._ensure_selected()
        return self._run_model()

    def _run_model(self) -> float:
        assert self._last is not None
        y = self._window(self._count)
        if np.ptp(y) == 0.0:
            return self._from_model_space(float(y[-1]))
        if self._order is None:
            return self._last
        with _statsmodels_run():
            value = self._model_forecast(y)
        return self._last if value is None else self._from_model_space(value)

    def _model_forecast(self, y: np.ndarray) -> float | None:
        """Refit the chosen order on the latest window, then forecast one step.

        The fit starts from the coefficients found at selection, so it takes
        a few optimizer steps, and it keeps the mean and coefficients current
        between selections (filtering with the selection's coefficients
        would hold a d=0 model at the mean of an old window). The starting
        point is itself a function of the series, so this stays pure. If the
        refit fails, the selection's coefficients are used as they are.
        """
        try:
            res = _fit_order(y, self._order, start=np.asarray(self._coefs))
            value = float(res.forecast(1)[0])
            if math.isfinite(value):
                return value
        except Exception:  # fall back to the selection's coefficients
            pass
        try:
            return _forecast_with(y, self._order, self._coefs)
        except Exception:  # a forecast must never take the planner down
            return None

    def _from_model_space(self, value: float) -> float:
        return math.expm1(value) if self._log_mode else value

    def _model_state(self) -> dict[str, Any]:
        return {
            "history": list(self._history),
            "order": None if self._order is None else list(self._order),
            "coefs": None if self._coefs is None else list(self._coefs),
            "selected_at": self._selected_at,
            "log_mode": self._log_mode,
        }

    def _restore_model(self, model: dict[str, Any]) -> None:
        self._history = [float(v) for v in model["history"]]
        order = model["order"]
        self._order = None if order is None else (int(order[0]), int(order[1]), int(order[2]))
        coefs = model["coefs"]
        self._coefs = None if coefs is None else tuple(float(v) for v in coefs)
        self._selected_at = None if model["selected_at"] is None else int(model["selected_at"])
        self._log_mode = bool(model["log_mode"])


class FrozenArimaPredictor(ArimaPredictor):
    """The reference's ARIMA, kept as a benchmark baseline.

    Like pmdarima's auto_arima as the Dynamo Planner uses it: the order is
    chosen by AIC once, at the first forecast with at least
    ``arima_min_points`` points whose window is not flat, and never again;
    if that order is (0, d, 0) in raw mode it is chosen again on log1p(y)
    and the model stays in log space. Afterwards each new point refits the
    coefficients starting from the previous ones (as ``model.update``
    does), so they drift slowly while the order stays.
    """

    kind = "arima_frozen"
    _criterion = "aic"  # auto_arima's

    def __init__(self, params: PredictorParams | None = None) -> None:
        super().__init__(params)
        self._updated_at: int | None = None

    def _model_state(self) -> dict[str, Any]:
        return {**super()._model_state(), "updated_at": self._updated_at}

    def _restore_model(self, model: dict[str, Any]) -> None:
        super()._restore_model(model)
        self._updated_at = model["updated_at"]

    def _kept_points(self) -> int:
        return self.params.arima_max_history

    def _ensure_selected(self) -> None:
        # Until a model exists (a flat or unfittable start) keep trying, as
        # the reference does; once one exists its order never changes.
        if self._order is not None:
            return
        self._select(self._window(self._count), self._count)
        if self._order is not None and self._order[0] == self._order[2] == 0 and not self._log_mode:
            self._log_mode = True
            self._select(self._window(self._count), self._count)

    def _forecast(self) -> float:
        self._ensure_selected()
        self._update_coefs()
        return self._run_model()

    def _model_forecast(self, y: np.ndarray) -> float | None:
        # _update_coefs already refitted for this point; just run the model.
        try:
            return _forecast_with(y, self._order, self._coefs)
        except Exception:  # a forecast must never take the planner down
            return None

    def _update_coefs(self) -> None:
        # Once per new point, not per call: asking twice must not move the model.
        if self._order is None or self._updated_at == self._count:
            return
        self._updated_at = self._count
        y = self._window(self._count)
        if np.ptp(y) == 0.0:
            return
        try:
            with _statsmodels_run():
                res = _fit_order(y, self._order, start=np.asarray(self._coefs))
        except Exception:  # keep the previous coefficients
            return
        coefs = tuple(float(v) for v in res.params)
        if all(math.isfinite(v) for v in coefs):
            self._coefs = coefs


# --- Prophet (optional extra) ------------------------------------------------

_PROPHET_MIN_POINTS = 5
_PROPHET_EPOCH = "2024-01-01"


def _import_prophet():
    try:
        import pandas as pd
        from prophet import Prophet
    except ImportError as exc:
        raise PredictorUnavailable(
            "the 'prophet' predictor needs the optional extra: pip install 'fleetplan[prophet]'"
        ) from exc
    stan_log = logging.getLogger("cmdstanpy")
    if stan_log.level == logging.NOTSET and not stan_log.handlers:
        # cmdstanpy logs two INFO lines per fit; keep them out unless asked. On its
        # first fit it installs its own stderr handler at DEBUG unless some handler
        # exists, so give it one that drops records: warnings still propagate.
        stan_log.setLevel(logging.WARNING)
        stan_log.addHandler(logging.NullHandler())
    return Prophet, pd


class ProphetPredictor(Predictor):
    """Prophet refit on a sliding window at every forecast (the reference's way).

    Timestamps are synthetic, ``2024-01-01 + step * prophet_interval_s``, with
    the step counted over the whole series, so the spacing matches the
    throughput interval and daily/weekly seasonality can be found once the
    window spans them. Uncertainty sampling is off: it draws from numpy's
    global random state and the planner needs only the point forecast.
    """

    kind = "prophet"

    def __init__(self, params: PredictorParams | None = None) -> None:
        super().__init__(params)
        _import_prophet()
        self._window: list[float] = []

    @property
    def min_points(self) -> int:
        return _PROPHET_MIN_POINTS

    def _observe(self, value: float) -> None:
        self._window.append(self._to_model(value))
        excess = len(self._window) - self.params.prophet_window_size
        if excess > 0:
            del self._window[:excess]

    def _forecast(self) -> float:
        prophet_cls, pd = _import_prophet()
        first_step = self._count - len(self._window)
        steps = np.arange(first_step, self._count + 1, dtype=np.int64)
        stamps = pd.Timestamp(_PROPHET_EPOCH) + pd.to_timedelta(
            steps * self.params.prophet_interval_s, unit="s"
        )
        history = pd.DataFrame({"ds": stamps[:-1], "y": self._window})
        model = prophet_cls(uncertainty_samples=0)
        with _statsmodels_run():
            model.fit(history)
            yhat = model.predict(pd.DataFrame({"ds": stamps[-1:]}))["yhat"].iloc[0]
        return self._from_model(float(yhat))

    def _model_state(self) -> dict[str, Any]:
        return {"window": list(self._window)}

    def _restore_model(self, model: dict[str, Any]) -> None:
        self._window = [float(v) for v in model["window"]]


# --- registry ----------------------------------------------------------------

_KINDS: dict[str, type[Predictor]] = {
    cls.kind: cls
    for cls in (
        ConstantPredictor,
        ArimaPredictor,
        FrozenArimaPredictor,
        KalmanPredictor,
        ProphetPredictor,
    )
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
