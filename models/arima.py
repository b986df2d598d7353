"""ARIMA load predictors: ``arima`` (order re-selected as traffic changes) and
``arima_frozen`` (the reference's order picked once, kept as a baseline).

Both are statsmodels' state-space ARIMA, run quietly on one BLAS thread
(``statsmodels_run``); both forecast from the series alone, with no clock
and no randomness, and serialize their order and coefficients exactly.
Measured against each other and the other kinds in docs/predictors.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetplan.models.predictors import (
    Predictor,
    PredictorParams,
    from_log1p,
    register_predictor,
    statsmodels_run,
)

_MAX_P = 2
_MAX_Q = 2
_KPSS_ALPHA = 0.05


@dataclass(frozen=True)
class _ArimaFit:
    order: tuple[int, int, int]
    params: tuple[float, ...]
    score: float  # lower is better


def _trend_for(d: int) -> str:
    # A mean for a stationary series; no drift once differenced: a drift
    # term extrapolates a temporary ramp forever, which over-provisions.
    return "c" if d == 0 else "n"


def _unit_root(x: np.ndarray, nlags) -> bool:
    """Whether KPSS (level-stationary null) rejects stationarity at ``_KPSS_ALPHA``; not where
    the series is too short or degenerate for the test."""
    from statsmodels.tsa.stattools import kpss

    try:
        return kpss(x, regression="c", nlags=nlags)[1] < _KPSS_ALPHA
    except Exception:  # too short or degenerate for the test: taken for stationary
        return False


def _choose_d(y: np.ndarray) -> int:
    """fleetplan's differencing order: one KPSS test with statsmodels' automatic lag count.

    AIC cannot compare models with different d (they explain different
    data), so, as auto_arima does, d is chosen first and only (p, q) by AIC.
    """
    return 1 if _unit_root(y, "auto") else 0


_AUTO_ARIMA_MAX_D = 2


def _auto_arima_d(y: np.ndarray) -> int:
    """The d pmdarima's ``auto_arima`` picks (its ``ndiffs``): KPSS at α = 0.05 with the short
    lag rule, trunc(4·(n/100)^¼) lags, repeated on the differenced series up to d = 2.

    The reference's order depends on it: on a few windows statsmodels' automatic lag count
    (n − 1 lags on 5 points) finds a unit root where auto_arima's one lag finds none, and a
    frozen random walk is the constant predictor, not the mean Dynamo's ARIMA forecasts.
    """
    d = 0
    x = np.asarray(y, dtype=float)
    while d < _AUTO_ARIMA_MAX_D and np.ptp(x) > 0.0 and _unit_root(x, int(4 * (len(x) / 100) ** 0.25)):
        d += 1
        x = np.diff(x)
    return d


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

    With ``smoothing_rescue`` (fleetplan's ``arima``) a stationary verdict
    also gets the random walk (0,1,0), which is the constant predictor, and
    simple exponential smoothing (0,1,1): KPSS has little power on a few
    hundred noisy points, and these two are what a mean-reverting fit most
    often loses to. Without it (the reference's) d is auto_arima's.
    """
    d = _choose_d(y) if smoothing_rescue else _auto_arima_d(y)
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


@register_predictor
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
        with statsmodels_run():
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
        with statsmodels_run():
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
        return from_log1p(value) if self._log_mode else value

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


@register_predictor
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
            with statsmodels_run():
                res = _fit_order(y, self._order, start=np.asarray(self._coefs))
        except Exception:  # keep the previous coefficients
            return
        coefs = tuple(float(v) for v in res.params)
        if all(math.isfinite(v) for v in coefs):
            self._coefs = coefs
