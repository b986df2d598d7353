"""Traffic forecasting for the throughput loop: windows in, next window out.

The throughput loop sizes the fleet for the *next* window from three
forecasts: how many requests arrive, their mean input length (ISL) and
their mean output length (OSL). ``TrafficForecaster`` owns the three
predictors and the reference planner's rules for idle windows;
``bucket_traffic`` turns a request trace into the windows it is warmed
with; ``window_loss`` scores a forecast against what happened.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fleetplan.models.predictors import Predictor, make_predictor, predictor_from_state

__all__ = [
    "TrafficForecaster",
    "TrafficObservation",
    "bucket_peaks",
    "bucket_traffic",
    "window_loss",
]


@dataclass(frozen=True)
class TrafficObservation:
    """What the frontend saw in one throughput window.

    ``num_req`` is a count per window, not a rate: every window is one
    throughput interval long, so counts are comparable across windows.
    KV hit rate and speculative accept length are carried as last values,
    not forecast (as in the reference). ``start_s`` is the event time the
    window began, when known: the time of day a daily cycle is learned
    against, so a warm-up trace, a restart or a gap in the windows keeps
    the cycle's phase.
    """

    duration_s: float
    num_req: float
    isl: float
    osl: float
    kv_hit_rate: float | None = None
    accept_length: float | None = None
    start_s: float | None = None


def _finite_or_none(value: float | None) -> float | None:
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _count(value: float) -> float:
    v = float(value)
    return v if math.isfinite(v) and v > 0.0 else 0.0


def _length(value: float, last: float | None) -> float:
    """A busy window's mean length as fed: the window's own when it is a positive finite number,
    else the last one known, else 0 (nothing known yet)."""
    v = _count(value)
    return v if v > 0.0 else (last or 0.0)


class TrafficForecaster:
    """Request count, ISL and OSL predictors of one kind, fed together.

    Idle rules (the reference's ``_observe_load``): a window with no
    requests after traffic has been seen feeds 0 to the count but carries
    the last ISL/OSL forward, because the mean length of zero requests is
    undefined, not zero, and a zero would make the next busy window look
    like tiny requests. While the count predictor is still skipping an idle
    start, the lengths are not fed either, so the three series stay aligned.

    A busy window whose mean ISL or OSL is undefined (NaN: requests arrived
    and none finished, Dynamo's 0/0) or zero is read the same way, per
    series: the last known length is fed and kept, since its requests have
    a length that was not measured, not a length of 0 (fed as 0, it
    forecast 0 tokens for the next window). A series with no length known
    yet is fed 0, as before: its predictor drops it as the idle start it
    still is, so the series begins at its first measured length, as the
    count begins at its first request, and no 0 is kept as a length to
    carry. From its first measured length on, every window feeds all three.
    """

    def __init__(self, kind: str = "arima", **params: Any) -> None:
        self.kind = kind
        self._num_req = make_predictor(kind, **params)
        self._isl = make_predictor(kind, **params)
        self._osl = make_predictor(kind, **params)
        self._last_isl: float | None = None
        self._last_osl: float | None = None
        self._kv_hit_rate: float | None = None
        self._accept_length: float | None = None

    # --- feeding -------------------------------------------------------------

    def observe(self, obs: TrafficObservation) -> None:
        """Feed one closed window."""
        kv = _finite_or_none(obs.kv_hit_rate)
        if kv is not None:
            self._kv_hit_rate = kv
        accept = _finite_or_none(obs.accept_length)
        if accept is not None:
            self._accept_length = accept

        start = _finite_or_none(obs.start_s)
        if start is not None:
            for predictor in self.predictors:
                predictor.note_window_start(start)
        num_req = _count(obs.num_req)
        if num_req > 0.0:
            isl, osl = _length(obs.isl, self._last_isl), _length(obs.osl, self._last_osl)
            self._num_req.add_data_point(num_req)
            self._isl.add_data_point(isl)
            self._osl.add_data_point(osl)
            self._last_isl, self._last_osl = isl or None, osl or None  # 0: none known yet
            return
        self._num_req.add_data_point(0.0)
        if self._num_req.is_skipping_idle:
            # idle start: the zero was dropped, and the lengths drop theirs too. They are
            # still fed it: a predictor that counts windows (the ensemble's daily clock,
            # without window starts) moves its clock on a dropped zero, and the lengths'
            # cycle fell behind the count's by every idle window of a live start.
            for predictor in (self._isl, self._osl):
                if predictor.is_skipping_idle:
                    predictor.add_data_point(0.0)
            return
        # a series with no length known yet is still in its idle start: its 0 is dropped too
        self._isl.add_data_point(self._last_isl or 0.0)
        self._osl.add_data_point(self._last_osl or 0.0)

    def warm(self, observations: Iterable[TrafficObservation]) -> None:
        """Replay recorded windows, then skip a live idle start again."""
        for obs in observations:
            self.observe(obs)
        for predictor in self.predictors:
            predictor.reset_idle_skip()

    # --- forecasting ---------------------------------------------------------

    def forecast(self) -> tuple[float, float, float]:
        """(num_req, isl, osl) expected in the next window, all >= 0."""
        return (
            self._num_req.predict_next(),
            self._isl.predict_next(),
            self._osl.predict_next(),
        )

    @property
    def last_osl(self) -> float | None:
        """The last mean OSL a busy window measured (a positive number), if any."""
        return self._last_osl

    @property
    def kv_hit_rate(self) -> float:
        """Last observed KV hit rate; 0.0 (no prefill discount) before any."""
        return 0.0 if self._kv_hit_rate is None else self._kv_hit_rate

    @property
    def accept_length(self) -> float:
        """Last observed speculative accept length; 1.0 (no speculation) before any."""
        return 1.0 if self._accept_length is None else self._accept_length

    @property
    def predictors(self) -> tuple[Predictor, Predictor, Predictor]:
        """The (num_req, isl, osl) predictors, for inspection."""
        return (self._num_req, self._isl, self._osl)

    # --- state ---------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "num_req": self._num_req.to_state(),
            "isl": self._isl.to_state(),
            "osl": self._osl.to_state(),
            "last_isl": self._last_isl,
            "last_osl": self._last_osl,
            "kv_hit_rate": self._kv_hit_rate,
            "accept_length": self._accept_length,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TrafficForecaster:
        forecaster = cls.__new__(cls)
        forecaster.kind = str(state["kind"])
        forecaster._num_req = predictor_from_state(state["num_req"])
        forecaster._isl = predictor_from_state(state["isl"])
        forecaster._osl = predictor_from_state(state["osl"])
        forecaster._last_isl = _finite_or_none(state["last_isl"])
        forecaster._last_osl = _finite_or_none(state["last_osl"])
        forecaster._kv_hit_rate = _finite_or_none(state["kv_hit_rate"])
        forecaster._accept_length = _finite_or_none(state["accept_length"])
        return forecaster


def bucket_traffic(
    arrivals: Iterable[tuple[float, float, float]], interval_s: float
) -> list[TrafficObservation]:
    """Cut ``(time_s, isl, osl)`` arrivals into windows of ``interval_s``.

    Windows start at the first arrival and are contiguous: an empty window
    between busy ones is kept as ``num_req=0`` (isl/osl 0; the forecaster
    carries lengths over it), because a lull is part of the load pattern.
    Empty windows before the first or after the last arrival are not
    emitted. The windows carry no ``start_s``: a trace's clock starts at its
    first row, not at a time of day, so a warm-up from it is taken to end
    where the live windows begin. Means are exact sums (``math.fsum``), so the arrival order
    does not change the result.
    """
    interval = float(interval_s)
    if not (math.isfinite(interval) and interval > 0.0):
        raise ValueError(f"interval_s must be a positive finite number, got {interval_s!r}")
    rows = [(float(t), float(isl), float(osl)) for t, isl, osl in arrivals]
    if not rows:
        return []
    for t, _, _ in rows:
        if not math.isfinite(t):
            raise ValueError(f"arrival time must be finite, got {t!r}")
    start = min(t for t, _, _ in rows)
    windows: dict[int, tuple[list[float], list[float]]] = {}
    for t, isl, osl in rows:
        index = math.floor((t - start) / interval)
        isls, osls = windows.setdefault(index, ([], []))
        isls.append(isl)
        osls.append(osl)
    observations = []
    for index in range(max(windows) + 1):
        isls, osls = windows.get(index, ([], []))
        n = len(isls)
        observations.append(
            TrafficObservation(
                duration_s=interval,
                num_req=float(n),
                isl=math.fsum(isls) / n if n else 0.0,
                osl=math.fsum(osls) / n if n else 0.0,
            )
        )
    return observations


def bucket_peaks(
    arrivals: Iterable[tuple[float, float, float]], interval_s: float, burst_s: float
) -> list[float | None]:
    """Each ``bucket_traffic`` window's busiest ``burst_s`` sub-window, scaled to a window count.

    What the throughput loop feeds the sizing quantile with each live window
    (``TrafficWindow.peak_count``): a warm-up trace's windows need theirs too,
    or the quantile of the busiest burst is calibrated on window counts and
    is conformal, yet a quantile of counts, from the first tick. Sub-windows
    start with the windows, at the first arrival; None with ``burst_s`` 0 or
    in an empty window.
    """
    times = [float(t) for t, _, _ in arrivals]
    if not times:
        return []
    interval, burst = float(interval_s), float(burst_s)
    start = min(times)
    windows = math.floor((max(times) - start) / interval) + 1
    if burst <= 0.0:
        return [None] * windows
    counts: list[dict[int, int]] = [{} for _ in range(windows)]
    for t in times:
        index = math.floor((t - start) / interval)
        sub = math.floor((t - start - index * interval) / burst)
        counts[index][sub] = counts[index].get(sub, 0) + 1
    return [max(c.values()) * interval / burst if c else None for c in counts]


def window_loss(pred: tuple[float, float, float], actual: tuple[float, float, float]) -> float:
    """The reference's predictor loss for one window (lower is better).

    Weighted absolute log errors: 0.4 each on prefill tokens (n·isl) and
    decode tokens (n·osl), which drive the replica counts, and 0.1 each on
    the mean lengths. Logs make a 2x miss cost the same at any scale.
    Negative inputs are read as 0 so the loss is always defined.
    """
    n_hat, isl_hat, osl_hat = (max(0.0, float(v)) for v in pred)
    n, isl, osl = (max(0.0, float(v)) for v in actual)
    return (
        0.4 * abs(math.log1p(n_hat * isl_hat) - math.log1p(n * isl))
        + 0.4 * abs(math.log1p(n_hat * osl_hat) - math.log1p(n * osl))
        + 0.1 * abs(math.log1p(isl_hat) - math.log1p(isl))
        + 0.1 * abs(math.log1p(osl_hat) - math.log1p(osl))
    )
