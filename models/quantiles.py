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

A forecast of zero (after an idle window) is its own regime: a ratio to
zero says nothing about a ratio to a busy forecast, so origins are pooled
by whether their forecast was zero, and only the pool that matches the
current forecast calibrates it. A pool with nothing in it yet falls back to
the recent counts themselves (the q-quantile of the largest count in h
windows), and with fewer than ``q / (1 - q)`` values (9 for the P90) the
largest value is used; ``calibrated(q, h)`` says whether the quantile is a
proper conformal one.

Split conformal covers at level q when the errors are exchangeable; a
week of production traffic is not quite that (the P90 covered 87 % of
m-large's held-out windows when the errors grew). So each (q, h) pair the
caller asks for keeps an adaptive level (adaptive conformal inference,
Gibbs & Candès 2021): once the h windows after an origin have arrived, a
miss of the quantile issued there raises the level by ``adapt_rate × q``
and a hit lowers it by ``adapt_rate × (1 − q)``, so over a long run the
share of misses comes back to 1 − q whatever the errors do. The level
moves only on quantiles that were conformal when issued (the uncalibrated
fallbacks are already the largest values), and stays in [0, 1];
``adapt_rate=0`` is plain split conformal.

Two series are calibrated on the same origins. With a ``peak`` fed to
:meth:`QuantileForecaster.observe` (the window's busiest burst sub-window),
``of="peak"`` quantiles bound the busiest burst in the horizon, and
``of="window"`` ones the window's own count: the planner sizes its rate
count for the second and leaves the bursts inside a window to its queueing
floor (``burst_sizing: queueing``, docs/sizing.md). Each series keeps its
own adaptive levels; without a peak the two are the same.

A count is not the work, though: a window of the forecast count whose
prompts ran 20 % long is 20 % more prefill, and the count's quantile calls
it covered. Each window also records its mean prompt and answer lengths
over the ones forecast for it, and ``of="peak:prompt"`` (``window:prompt``,
``peak:answer``, ``window:answer``) calibrates on its count times that
ratio: the quantile of a role's tokens, in requests of the forecast
length, which the planner sizes each role for with ``quantile_basis:
tokens``. The ratios are kept whichever series is asked, so a switch needs
no history of its own.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from fleetplan.models import ensemble  # noqa: F401  (registers DEFAULT_KIND)
from fleetplan.models.forecast import TrafficForecaster, TrafficObservation
from fleetplan.models.predictors import from_log1p

__all__ = ["QuantileForecaster", "role_work"]

DEFAULT_KIND = "ensemble"
DEFAULT_HISTORY = 256
DEFAULT_ADAPT_RATE = 0.01

Series = Literal["peak", "window", "peak:prompt", "window:prompt", "peak:answer", "window:answer"]
SERIES: tuple[Series, ...] = ("peak", "window", "peak:prompt", "window:prompt", "peak:answer", "window:answer")


def role_work(role: str) -> tuple[str, ...]:
    """The lengths whose tokens a role works on, as series suffixes name them: prefill the
    prompts, decode the answers, an aggregated engine both (``quantile_basis: tokens``)."""
    return {"prefill": ("prompt",), "decode": ("answer",)}.get(role, ("prompt", "answer"))


def _count(value: float) -> float:
    v = float(value)
    return v if math.isfinite(v) and v > 0.0 else 0.0


def _ratio(actual: float, forecast: float) -> float:
    """A window's mean length over the length forecast for it; 1 where either is unknown."""
    a, f = float(actual), float(forecast)
    return a / f if math.isfinite(a) and math.isfinite(f) and a > 0.0 and f > 0.0 else 1.0


def _exceeds(peak: float, sized: float) -> bool:
    """Whether the busiest window (``peak``, a log1p count) exceeded what was sized for (log1p).

    Counted in requests, to rounding: the quantile is a past ratio carried to
    another forecast, and the count it came from can come back an ulp over it
    (186 against 185.9999999999999); a window that brought the very count
    sized for did not exceed it.
    """
    return peak > sized and not math.isclose(math.expm1(peak), from_log1p(sized), rel_tol=1e-9)


def _rank(m: int, q: float) -> int:
    """The conformal rank of the q-quantile among m values (1-based; > m: none)."""
    return max(1, math.ceil((m + 1) * q))


def _conformal(values: list[float], q: float) -> float:
    """The ceil((m + 1) q)-th smallest of m values, capped at the largest."""
    ordered = sorted(values)
    return ordered[min(_rank(len(ordered), q), len(ordered)) - 1]


def _check(q: float, horizon_windows: int) -> tuple[float, int]:
    q = float(q)
    if not (0.0 < q < 1.0):
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    try:
        horizon = int(horizon_windows)
        whole = not isinstance(horizon_windows, bool) and horizon == horizon_windows
    except (TypeError, ValueError, OverflowError):
        whole = False
    if not whole:
        raise ValueError(f"horizon_windows must be a whole number, got {horizon_windows!r}")
    if horizon < 1:
        raise ValueError(f"horizon_windows must be >= 1, got {horizon_windows!r}")
    return q, horizon


def _check_series(of: str) -> None:
    """Refuse a series that is not one of ``SERIES``, naming it."""
    if of not in SERIES:
        raise ValueError(f"of must be one of {SERIES}, got {of!r}")


def _key_text(key: tuple[float, int, Series]) -> str:
    """An adaptive level's key in the state: JSON-safe, exact for any float q.

    ``q@h`` for the peak series (as states before the window series wrote
    it), ``q@h@window`` for the window's.
    """
    q, h, of = key
    return f"{q!r}@{h}" if of == "peak" else f"{q!r}@{h}@{of}"


def _key_of(text: str) -> tuple[float, int, Series]:
    q, h, *of = text.split("@")
    series = of[0] if of else "peak"
    if series not in SERIES:
        raise ValueError(f"quantile state: unknown series {series!r} in level key {text!r}")
    return float(q), int(h), series


class QuantileForecaster:
    """Point and quantile forecasts of the next windows' traffic.

    ``kind`` and ``params`` build the wrapped ``TrafficForecaster`` (the
    point forecasts are exactly its). ``history`` is how many recent
    windows calibrate the quantiles; ``adapt_rate`` how fast each (q, h)
    level follows its misses (0: never).
    """

    def __init__(
        self,
        kind: str = DEFAULT_KIND,
        *,
        history: int = DEFAULT_HISTORY,
        adapt_rate: float = DEFAULT_ADAPT_RATE,
        **params: Any,
    ) -> None:
        if isinstance(history, bool) or not isinstance(history, int) or history < 2:
            raise ValueError(f"history must be an int >= 2, got {history!r}")
        self._forecaster = TrafficForecaster(kind, **params)
        self._next: tuple[float, float, float] | None = None
        self.history = history
        self.adapt_rate = _adapt_rate(adapt_rate)
        # (forecast made before the window, its busiest burst as a count, its own count), oldest first
        self._forecasts: list[float] = []
        self._actuals: list[float] = []
        self._counts: list[float] = []
        # per window: its mean prompt and answer lengths over the ones forecast for it (the
        # ":prompt" and ":answer" series scale its counts by them)
        self._lengths: list[tuple[float, float]] = []
        self._seen = 0  # windows observed since the start: the origins' clock
        # the first origin whose forecast came from traffic: the ones before it were made by a
        # forecaster that had seen none, a 0 that is no forecast, so they calibrate nothing
        self._informed_from = 0
        # per (q, h, series): the adaptive level, and the log1p quantiles issued at origins not yet resolved
        self._levels: dict[tuple[float, int, Series], float] = {}
        self._issued: dict[tuple[float, int, Series], dict[int, float]] = {}
        # per (q, h, series): the origins where that very quantile was asked for and conformal,
        # not yet scored; and [origin, 1 where the busiest of its h windows exceeded what it sized
        # for, else 0] for those scored, the origins of the last ``history`` windows: its
        # calibration, live
        self._asked_at: dict[tuple[float, int, Series], set[int]] = {}
        self._outcomes: dict[tuple[float, int, Series], list[list[int]]] = {}
        # the quantile requests (q, horizon, series) made at the current origin, and at the
        # origin of the window observed last: a rebuild replays them (:meth:`ask`)
        self._asked: list[tuple[float, int, Series]] = []
        self._last_asked: list[tuple[float, int, Series]] = []

    @classmethod
    def wrapping(
        cls,
        forecaster: TrafficForecaster,
        *,
        history: int = DEFAULT_HISTORY,
    ) -> QuantileForecaster:
        """Wrap an existing (possibly warmed) forecaster; calibration starts empty."""
        state = {
            "forecaster": forecaster.to_state(),
            "history": history,
            "forecasts": [],
            "actuals": [],
            "counts": [],
            "length_ratios": [],
        }
        qf = cls.from_state(state)
        qf._forecaster = forecaster  # the caller's object, not a copy
        qf._next = None
        return qf

    # --- feeding -------------------------------------------------------------

    def observe(self, obs: TrafficObservation, *, peak: float | None = None) -> None:
        """Feed one closed window, scoring the forecast that was made for it.

        ``peak`` (the window's busiest sub-window, scaled to a window count)
        is what the peak quantiles calibrate against when given: the point
        forecast and the window quantiles still learn the window's count,
        and the peak quantiles learn how far above that forecast the peaks run.
        """
        point = self.forecast()  # usually the one the planner sized with: cached
        forecast = point[0]
        if self._forecaster.predictors[0].num_points == 0:
            self._informed_from = self._seen + 1
        self._forecasts.append(forecast)
        # each cleaned first: max(nan, n) is nan and max(inf, n) inf, both recorded as 0
        count = _count(obs.num_req)
        self._actuals.append(count if peak is None else max(_count(peak), count))
        self._counts.append(count)
        self._lengths.append((_ratio(obs.isl, point[1]), _ratio(obs.osl, point[2])))
        self._seen += 1
        self._resolve()
        excess = len(self._forecasts) - self.history
        if excess > 0:
            del self._forecasts[:excess]
            del self._actuals[:excess]
            del self._counts[:excess]
            del self._lengths[:excess]
        self._forecaster.observe(obs)
        self._next = None
        self._last_asked, self._asked = self._asked, []

    def _resolve(self) -> None:
        """Score every issued quantile whose h windows are now all in, and move its level."""
        latest = self._seen - 1  # origin index of the window just observed
        first = self._seen - len(self._actuals)  # origin index of the oldest kept window
        for key, issued in self._issued.items():
            q, h, of = key
            origin = latest - h + 1
            value = issued.pop(origin, None)
            for stale in [o for o in issued if o < origin]:
                del issued[stale]
            if value is None or origin < first:
                continue
            peak = max(math.log1p(a) for a in self._series(of)[origin - first :])
            miss = 1.0 if peak > value else 0.0
            if origin in self._asked_at.get(key, ()):  # asked for itself, not as a shorter h
                # against what was sized for, the quantile as returned or the point made at the
                # origin if larger, so never below 0: an idle window (0) does not exceed a
                # quantile of 0, however far below 0 its log1p level fell (the level keeps its
                # own test: the scoring must not move the quantiles)
                sized = max(value, math.log1p(self._forecasts[origin - first]))
                self._outcomes.setdefault(key, []).append([origin, int(_exceeds(peak, sized))])
            if self.adapt_rate > 0.0:
                level = self._levels.get(key, q) + self.adapt_rate * (miss - (1.0 - q))
                self._levels[key] = min(1.0, max(0.0, level))
        for key in list(self._asked_at):  # the origins scored above, or never to be
            self._asked_at[key] = {o for o in self._asked_at[key] if o > latest - key[1] + 1}
            if not self._asked_at[key]:
                del self._asked_at[key]
        oldest = self._seen - self.history
        for key in list(self._outcomes):
            kept = [row for row in self._outcomes[key] if row[0] >= oldest]
            if kept:
                self._outcomes[key] = kept
            else:
                del self._outcomes[key]  # a horizon no longer asked, gone with its windows

    @property
    def asked(self) -> list[tuple[float, int, Series]]:
        """The quantile requests ``(q, horizon_windows, of)`` made since the last window was
        observed (at the current origin), in the order first made."""
        return list(self._asked)

    @property
    def last_asked(self) -> list[tuple[float, int, Series]]:
        """The quantile requests made before the last window was observed (at its origin).

        The adaptive levels move on what was asked, not only on what was
        observed: a forecaster rebuilt from the windows alone would start its
        levels again at q. Kept with the window (``remember_window``), they let
        :meth:`ask` replay them.
        """
        return list(self._last_asked)

    def ask(self, requests) -> None:
        """Make the quantile requests ``(q, horizon_windows, of)`` again, for what they issue.

        A rebuild (models/predictor_swap.py) calls it with each window's
        :attr:`last_asked` before observing the window, so the levels and the
        issued quantiles come out as in a deployment that ran this forecaster
        all along.
        """
        for q, horizon, of in requests:
            self.quantiles(q, horizon, of=of)

    def warm(self, observations, peaks=None) -> None:
        """Replay recorded windows (they calibrate too), then skip an idle start again.

        ``peaks`` are the windows' busiest bursts (``bucket_peaks``), each fed as
        :meth:`observe` feeds a live window's; without them the peak quantiles
        calibrate on the windows' counts.
        """
        observations = list(observations)
        for obs, peak in zip(observations, [None] * len(observations) if peaks is None else peaks, strict=True):
            self.observe(obs, peak=peak)
        for predictor in self._forecaster.predictors:
            predictor.reset_idle_skip()
        self._next = None

    # --- forecasting ---------------------------------------------------------

    def forecast(self) -> tuple[float, float, float]:
        """(num_req, isl, osl) expected in the next window: the wrapped point forecast.

        Kept until the next window is observed: the planner sizes with it and
        :meth:`observe` then scores it, and an ARIMA forecast is a model run.
        """
        if self._next is None:
            self._next = self._forecaster.forecast()
        return self._next

    @property
    def forecaster(self) -> TrafficForecaster:
        """The wrapped point forecaster (KV hit rate, accept length, predictors).

        Read it; feed windows through :meth:`observe`, which also drops the
        cached point forecast.
        """
        return self._forecaster

    @property
    def windows_seen(self) -> int:
        """Windows fed since the forecaster was built (warm-up and seed included)."""
        return self._seen

    def calibrated(self, q: float = 0.9, horizon_windows: int = 1) -> bool:
        """True when ``quantile(q, horizon_windows)`` is a conformal quantile.

        That needs at least ``q / (1 - q)`` past origins in the pool that
        matches the current forecast (zero or not) spanning the horizon;
        before that the quantiles are the largest values seen, or the
        recent counts themselves.
        """
        return self.coverage(q, horizon_windows) >= q

    def coverage(self, q: float = 0.9, horizon_windows: int = 1) -> float:
        """The share of new windows ``quantile(q, horizon_windows)`` covers, by its construction.

        ``q`` once it is conformal. Before that it is the largest of the m
        past errors in its pool, and the largest of m exchangeable values
        exceeds a new one with probability m / (m + 1): that is its
        coverage (1/2 after one origin, 8/9 after eight). 0 while the pool
        is empty and the quantile is the raw counts or the point forecast,
        which carry none of the forecaster's error. The planner's headroom
        follows it (``uncalibrated_headroom: coverage``).
        """
        q, horizon = _check(q, horizon_windows)
        zero = self.forecast()[0] == 0.0
        # past origins spanning the horizon in the pool that matches the current forecast
        m = sum(1 for s in range(len(self._forecasts) - horizon + 1)
                if (self._forecasts[s] == 0.0) == zero and self._informed(s))
        if m == 0:
            return 0.0
        return q if _rank(m, q) <= m else m / (m + 1)

    def exceedances(self, q: float = 0.9, horizon_windows: int = 1, *, of: Series = "peak") -> tuple[int, int]:
        """``(exceeded, scored)``: how the conformal ``quantile(q, horizon_windows, of=of)`` fared.

        Of such quantiles issued at the origins of the last ``history``
        windows, and whose windows have all been observed since, how many the
        largest of those windows exceeded; each taken as the planner sizes
        for it, never below the point forecast (``max(point, quantile)``). A
        calibrated q-quantile is exceeded on about ``1 - q`` of them; this is
        that promise checked on the deployment's own traffic, as the forecast
        benchmark and the simulator check it offline. Quantiles asked before
        they were conformal are not scored: the largest value seen promises
        only ``coverage``.
        """
        q, horizon = _check(q, horizon_windows)
        _check_series(of)
        outcomes = self._outcomes.get((q, horizon, of), [])
        return sum(miss for _, miss in outcomes), len(outcomes)

    def quantile(self, q: float, horizon_windows: int = 1, *, of: Series = "peak") -> float:
        """The q-quantile of the largest request count in the next ``horizon_windows`` windows.

        ``of="peak"``: counted at each window's busiest burst, as fed to
        :meth:`observe`; ``of="window"``: each window's own count.
        """
        return self.quantiles(q, horizon_windows, of=of)[-1]

    def quantiles(self, q: float, horizon_windows: int, *, of: Series = "peak") -> list[float]:
        """``quantile(q, h, of=of)`` for h = 1 .. horizon_windows, in one pass (non-decreasing)."""
        q, horizon = _check(q, horizon_windows)
        _check_series(of)
        if (q, horizon, of) not in self._asked:  # made again at this origin, it issues the same
            self._asked.append((q, horizon, of))
        point = self.forecast()[0]
        zero = point == 0.0
        base = math.log1p(point)
        # no origin spans more windows than the history holds, so past it nothing is added and
        # the value stays: a day's horizon at 2-s ticks is 43,201 windows of one pass each
        reach = min(horizon, len(self._forecasts) + 1)
        matching, counts = self._spreads(reach, zero, self._series(of))
        out: list[float] = []
        level = -math.inf
        for h in range(1, reach + 1):
            pool = matching[h - 1]
            conformal = bool(pool) and _rank(len(pool), q) <= len(pool)
            if pool:
                value = base + _conformal(pool, self._levels.get((q, h, of), q) if conformal else q)
            elif counts[h - 1]:
                value = _conformal(counts[h - 1], q)  # no matching origin: the counts themselves
            else:
                value = base  # nothing observed spans h windows yet
            level = max(level, value)
            if conformal:  # scored when its h windows are in (``_resolve``)
                self._issued.setdefault((q, h, of), {})[self._seen] = level
                if h == horizon:
                    self._asked_at.setdefault((q, h, of), set()).add(self._seen)
            out.append(max(0.0, from_log1p(level)))  # counts past ~1e154 overflowed expm1
        return out + out[-1:] * (horizon - reach)

    def _series(self, of: Series) -> list[float]:
        """The kept windows' values of series ``of``, oldest first.

        ``peak`` and ``window`` are request counts; ``:prompt`` and
        ``:answer`` scale each window's count by how far its mean prompt
        (answer) ran over the length forecast for it, so their quantiles
        are of the tokens a role works on, counted in requests of the
        forecast length: a window of 20 % longer prompts at the forecast
        count is 20 % more prefill work, which the count alone calls covered.
        """
        counts, _, work = of.partition(":")
        base = self._actuals if counts == "peak" else self._counts
        if not work:
            return base
        which = 0 if work == "prompt" else 1
        return [value * ratios[which] for value, ratios in zip(base, self._lengths, strict=True)]

    def _spreads(
        self, horizon: int, zero: bool, actuals: list[float],
    ) -> tuple[list[list[float]], list[list[float]]]:
        """Per h = 1 .. horizon (index h - 1), over past origins s:

        - r_h(s) for the origins whose forecast was zero iff ``zero``;
        - log1p of the largest of ``actuals`` in h windows from every origin.
        """
        forecasts = self._forecasts
        m = len(forecasts)
        logs = [math.log1p(a) for a in actuals]
        matching: list[list[float]] = [[] for _ in range(horizon)]
        counts: list[list[float]] = [[] for _ in range(horizon)]
        for s in range(m):
            anchor = math.log1p(forecasts[s])
            same_regime = (forecasts[s] == 0.0) == zero and self._informed(s)
            peak = -math.inf
            for h in range(1, min(horizon, m - s) + 1):
                peak = max(peak, logs[s + h - 1])
                counts[h - 1].append(peak)
                if same_regime:
                    matching[h - 1].append(peak - anchor)
        return matching, counts

    def _informed(self, s: int) -> bool:
        """Whether the kept origin ``s`` (0 the oldest kept) had a forecast from traffic.

        A deployment's first busy window was forecast 0 by a forecaster that had
        seen nothing; pooled with the forecasts of zero made after idle windows,
        it read as a resumption as large as the launch, and after traffic stopped
        it held the fleet at its busy size until 19 idle windows outvoted it
        (21 minutes of the quickstart's fleet, 54 at 180-s windows).
        """
        return self._seen - len(self._forecasts) + s >= self._informed_from

    # --- state ---------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "forecaster": self._forecaster.to_state(),
            "history": self.history,
            "forecasts": list(self._forecasts),
            "actuals": list(self._actuals),
            "counts": list(self._counts),
            "length_ratios": [list(r) for r in self._lengths],
            "adapt_rate": self.adapt_rate,
            "seen": self._seen,
            "informed_from": self._informed_from,
            "levels": {_key_text(k): v for k, v in self._levels.items()},
            "issued": {_key_text(k): [[o, v] for o, v in issued.items()] for k, issued in self._issued.items()},
            "asked_at": {_key_text(k): sorted(origins) for k, origins in self._asked_at.items()},
            "outcomes": {_key_text(k): _outcomes_text(rows) for k, rows in self._outcomes.items()},
            "asked": [list(request) for request in self._asked],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> QuantileForecaster:
        qf = cls.__new__(cls)
        qf._forecaster = TrafficForecaster.from_state(state["forecaster"])
        qf._next = None
        qf.history = int(state["history"])
        if qf.history < 2:
            raise ValueError("quantile state needs history >= 2")
        qf._forecasts = [float(v) for v in state["forecasts"]]
        qf._actuals = [float(v) for v in state["actuals"]]
        # states written before the window series calibrate it on their peaks until these pass
        qf._counts = [float(v) for v in state.get("counts", qf._actuals)]
        # states written before the length series read their windows as of the forecast lengths
        qf._lengths = [(float(i), float(o)) for i, o in state.get("length_ratios", [[1.0, 1.0]] * len(qf._counts))]
        if not len(qf._forecasts) == len(qf._actuals) == len(qf._counts) == len(qf._lengths):
            raise ValueError("quantile state has unequal forecast, actual, count and length histories")
        # states written before the adaptive levels existed start them afresh
        qf.adapt_rate = _adapt_rate(state.get("adapt_rate", DEFAULT_ADAPT_RATE))
        qf._seen = int(state.get("seen", len(qf._actuals)))
        # states written before 2026-12-05 pool every origin, as they did
        qf._informed_from = int(state.get("informed_from", 0))
        qf._levels = {_key_of(k): float(v) for k, v in state.get("levels", {}).items()}
        qf._issued = {
            _key_of(k): {int(o): float(v) for o, v in pairs} for k, pairs in state.get("issued", {}).items()
        }
        # states written before the outcomes were kept start scoring afresh
        qf._asked_at = {_key_of(k): {int(o) for o in origins} for k, origins in state.get("asked_at", {}).items()}
        qf._outcomes = {_key_of(k): _outcomes_of(v) for k, v in state.get("outcomes", {}).items()}
        # states written before the requests were kept have none to replay
        qf._asked = asked_requests(state.get("asked", []))
        qf._last_asked = []
        return qf


def _outcomes_text(rows: list[list[int]]) -> list:
    """Scored origins as stored: ``[first origin, "0100.1"]``, a character per origin from the
    first on (``1`` exceeded, ``0`` covered, ``.`` not scored): a fifth of the state as pairs."""
    first = rows[0][0]
    marks = ["."] * (rows[-1][0] - first + 1)
    for origin, miss in rows:
        marks[origin - first] = "1" if miss else "0"
    return [first, "".join(marks)]


def _outcomes_of(stored) -> list[list[int]]:
    first, marks = stored
    if not set(marks) <= {"0", "1", "."}:
        raise ValueError(f"quantile state: outcomes are 0, 1 or ., got {marks!r}")
    return [[int(first) + i, int(mark)] for i, mark in enumerate(marks) if mark != "."]


def asked_requests(rows) -> list[tuple[float, int, Series]]:
    """Quantile requests as stored (``[q, horizon_windows, of]`` lists), checked, as tuples."""
    out: list[tuple[float, int, Series]] = []
    for q, horizon, of in rows:
        if of not in SERIES:
            raise ValueError(f"quantile state: unknown series {of!r} in a request")
        out.append((*_check(q, horizon), of))
    return out


def _adapt_rate(value: float) -> float:
    rate = float(value)
    if not (math.isfinite(rate) and 0.0 <= rate < 1.0):
        raise ValueError(f"adapt_rate must be in [0, 1), got {value!r}")
    return rate
