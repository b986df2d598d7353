"""The Prophet load predictor (``prophet``), the optional extra ``fleetplan[prophet]``.

Prophet is imported only when a ``prophet`` predictor is made, so the core
runs without it; without the extra, making one raises
``PredictorUnavailable`` and a run-time swap to it is refused.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fleetplan.models.predictors import (
    Predictor,
    PredictorParams,
    PredictorUnavailable,
    register_predictor,
    statsmodels_run,
)

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


@register_predictor
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
        with statsmodels_run():
            model.fit(history)
            yhat = model.predict(pd.DataFrame({"ds": stamps[-1:]}))["yhat"].iloc[0]
        return self._from_model(float(yhat))

    def _model_state(self) -> dict[str, Any]:
        return {"window": list(self._window)}

    def _restore_model(self, model: dict[str, Any]) -> None:
        self._window = [float(v) for v in model["window"]]
