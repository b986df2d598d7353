"""Changing the load predictor while a deployment runs.

The forecaster is state the core builds when a deployment starts: the
predictor kind and its parameters (``PREDICTOR_FIELDS``, and the throughput
interval, which is the window length its daily cycle and Prophet's
timestamps are spaced by) go into its constructor, and what it has learned
lives in its fitted members. A ``set_config`` that changes one of those
must therefore rebuild it,
or the config would name one predictor while another forecasts. A new
predictor that starts empty would then size the fleet from nothing for its
first windows, so the core keeps the last ``predictor_history_windows``
windows it fed the forecaster (each with the busiest sub-window the sizing
quantile calibrates on, and the sizing quantiles asked for before it) and
replays them into the new one. That is what
Dynamo's retune does when it swaps predictors (planner-design, "Predictor
Swap"), except that the windows come from the core's own state, so an
operator's ``set_config`` gets the same warm start and the event log still
folds to the same decisions.

The same replay starts a deployment from traffic it had before this
planner saw it: a ``seed_traffic`` control carries those windows
(:func:`seed_history`), and the core rebuilds the forecaster from them
while it has been fed nothing else.
"""

from __future__ import annotations

from dataclasses import replace

from fleetplan.models.config import PlannerConfig
from fleetplan.models.forecast import TrafficObservation
from fleetplan.models.quantiles import QuantileForecaster, asked_requests
from fleetplan.schemas.events import MAX_SEED_WINDOWS, ControlEvent

__all__ = [
    "asked_of", "build_forecaster", "keep_last", "predictor_changed", "rebuild_forecaster", "remember_window", "seed_control",
    "seed_history", "seed_problem", "seed_windows", "window_of",
]


def _built_from(cfg: PlannerConfig) -> tuple[str, float, dict[str, object]]:
    """What :func:`build_forecaster` gives the forecaster: the kind, the adapt rate, the parameters."""
    return cfg.load_predictor, cfg.sizing_quantile_adapt_rate, cfg.predictor_params()


def build_forecaster(cfg: PlannerConfig) -> QuantileForecaster:
    """An empty forecaster for ``cfg``'s load predictor."""
    kind, adapt_rate, params = _built_from(cfg)
    return QuantileForecaster(kind, adapt_rate=adapt_rate, **params)


def predictor_changed(old: PlannerConfig, new: PlannerConfig) -> bool:
    """True when ``new`` builds a different forecaster than ``old``.

    It compares what :func:`build_forecaster` is given, not a list of
    field names: ``predictor_params()`` also holds the throughput interval
    (``prophet_interval_s``), so a change of
    ``throughput_adjustment_interval_seconds`` rebuilds the forecaster too
    (until 2026-12-05 it kept the one built for the old window length).
    """
    return _built_from(old) != _built_from(new)


def remember_window(
    history: list[list], obs: TrafficObservation, peak: float | None, keep: int, asked=(),
) -> None:
    """Append one window the forecaster was fed, keeping the last ``keep``.

    ``asked`` are the quantile requests made before the window was fed (the
    forecaster's ``last_asked``): they move its adaptive levels, so a rebuild
    replays them too. A window with none has the eight fields of
    ``SEED_KEYS`` only, as stored states and seeds do; one with some has them
    as a ninth, ``[[q, horizon_windows, of], ...]``.
    """
    row = window_row(obs, peak)
    if asked:
        row.append([list(request) for request in asked])
    history.append(row)
    keep_last(history, keep)


def window_row(obs: TrafficObservation, peak: float | None) -> list:
    """A window and its busiest burst as a kept row's ``SEED_KEYS`` fields, in order."""
    return [obs.start_s, obs.duration_s, obs.num_req, obs.isl, obs.osl, obs.kv_hit_rate, obs.accept_length, peak]


def keep_last(history: list[list], keep: int) -> None:
    """Drop all but the last ``keep`` windows of ``history``, in place (0 keeps none)."""
    del history[:max(0, len(history) - keep)]


SEED_KEYS = ("start_s", "duration_s", "num_req", "isl", "osl", "kv_hit_rate", "accept_length", "peak")
"""A ``remember_window`` row's fields, in order, as a seed window names them.

A seed carries no quantile requests (a row's ninth field): a forecaster
rebuilt from one starts its adaptive levels at q."""


def seed_history(windows) -> list[list]:
    """A ``seed_traffic`` control's windows (:class:`~fleetplan.schemas.events.SeedWindow`) as
    ``remember_window`` rows, the form the core keeps and replays."""
    return [[getattr(w, key) for key in SEED_KEYS] for w in windows]


def seed_control(deployment: str, time: float, history: list[list], issued_by: str | None = None) -> ControlEvent:
    """``history`` (``remember_window`` rows) as a ``seed_traffic`` control dated ``time``: the
    inverse of :func:`seed_history`, validated like any event."""
    return ControlEvent.model_validate({
        "deployment": deployment, "time": float(time), "type": "control", "issued_by": issued_by,
        "body": {"command": "seed_traffic",
                 "windows": [dict(zip(SEED_KEYS, row[:len(SEED_KEYS)], strict=True)) for row in history]},
    })


def seed_windows(history: list[list], interval: float | None = None) -> list[list]:
    """The rows of ``history`` a seed can carry: the longest run at its end in time
    order with a start time, no more than a seed holds, at ``interval`` when given.

    A deployment's kept windows are its live ones, oldest first, after the
    ones it started from. A ``load_predictor_warmup_trace``'s windows have
    no start (``bucket_traffic``: a trace's clock is not the events'), and a
    seed window must have one, so the run stops at the first of them: the
    warm-up stays out of the seed. Windows that have a start on another
    clock (a simulator's run and its history, both from 0) go along where
    they come before the live ones in time and are left out where they
    overlap them.

    A deployment whose throughput interval changed keeps windows of the old
    length, and a planner refuses a seed window of another length than its
    interval: with ``interval`` (the one in force) each is given as the
    forecaster was rebuilt from it (:func:`_at_interval`), so a planner at
    that interval takes the seed and forecasts the same. Windows stretched
    to a longer interval overlap the next one and end the run there.
    """
    rows = [row if interval is None or row[0] is None else _row_at(row, interval) for row in history]
    start = len(rows)
    while start > 0 and len(rows) - start < MAX_SEED_WINDOWS and rows[start - 1][0] is not None and (
        start == len(rows) or rows[start - 1][0] + rows[start - 1][1] <= rows[start][0]
    ):
        start -= 1
    return [list(row[:len(SEED_KEYS)]) for row in rows[start:]]


def _row_at(row: list, interval: float) -> list:
    """A kept window's seed fields at ``interval`` (unchanged when it is of that length)."""
    return window_row(*_at_interval(*window_of(row), interval))


def seed_problem(
    cfg: PlannerConfig, forecaster: QuantileForecaster, history: list[list], first_traffic: float | None = None,
) -> str | None:
    """Why a seed cannot start ``forecaster``; None when it can.

    A forecaster that has been fed (live windows, a warm-up trace, an
    earlier seed) would see the seed's past after its own present, and a
    window of another length than the throughput loop's would be read as
    a count per window of the wrong size. A seed running past the
    deployment's first request (``first_traffic``) holds traffic its first
    live window counts too, before that window has closed and fed it.
    """
    if forecaster.windows_seen:
        return f"the forecaster has been fed {forecaster.windows_seen} windows already"
    end = history[-1][0] + history[-1][1] if history else None
    if first_traffic is not None and end is not None and end > first_traffic:
        return f"the seed ends at {end:g}, after the deployment's traffic began ({first_traffic:g})"
    interval = cfg.throughput_adjustment_interval_seconds
    for i, row in enumerate(history):
        if row[1] != interval:
            return f"windows.{i}.duration_s: {row[1]:g} s, not the throughput interval ({interval} s)"
    return None


def window_of(row: list) -> tuple[TrafficObservation, float | None]:
    """A kept window (``remember_window``'s row) as the observation and peak it was fed."""
    start_s, duration_s, num_req, isl, osl, kv, accept, peak = row[:len(SEED_KEYS)]
    obs = TrafficObservation(
        duration_s=duration_s, num_req=num_req, isl=isl, osl=osl, kv_hit_rate=kv,
        accept_length=accept, start_s=start_s,
    )
    return obs, peak


def _at_interval(
    obs: TrafficObservation, peak: float | None, interval: float,
) -> tuple[TrafficObservation, float | None]:
    """A kept window's count and peak as counts of an ``interval``-long window.

    The forecast is a count per window, and the throughput loop's demand that
    count over the interval in force: a window kept before the interval
    changed (180 s, then 60 s) is replayed at the rate it measured, not as
    three times the traffic. A window already of that length is unchanged.
    """
    duration = obs.duration_s
    if not duration or duration == interval:
        return obs, peak
    scale = interval / duration
    return (replace(obs, duration_s=float(interval), num_req=obs.num_req * scale),
            None if peak is None else peak * scale)


def asked_of(row: list) -> list:
    """The quantile requests made before a kept window was fed (none for a row without them)."""
    return asked_requests(row[len(SEED_KEYS)]) if len(row) > len(SEED_KEYS) else []


def rebuild_forecaster(cfg: PlannerConfig, history: list[list], asked=()) -> QuantileForecaster:
    """A forecaster for ``cfg`` that has seen ``history`` as the old one did.

    Each window is fed with its peak, as the throughput loop fed it, so the
    sizing quantile calibrates on the same targets, and after the quantile
    requests made before it (:func:`asked_of`), so the adaptive levels move
    on the same misses; ``asked`` are the ones made since the last window
    (the old forecaster's ``asked``), made again at the end. When
    ``history`` holds every window since the deployment's first, the result
    is the forecaster it would have had with ``cfg``'s predictor from the
    start (a seed's windows carry no requests: its levels start at q). A
    warm-up trace's windows (no ``start_s``, kept first) are replayed as
    ``warm`` replayed them, so an idle live start is skipped again after
    them; the live windows after are not.
    """
    forecaster = build_forecaster(cfg)
    interval = cfg.throughput_adjustment_interval_seconds
    warm_up = 0
    while warm_up < len(history) and history[warm_up][0] is None:
        warm_up += 1
    if warm_up:
        warmed = [_at_interval(*window_of(row), interval) for row in history[:warm_up]]
        forecaster.warm([obs for obs, _ in warmed], [peak for _, peak in warmed])
    for row in history[warm_up:]:
        obs, peak = _at_interval(*window_of(row), interval)
        forecaster.ask(asked_of(row))
        forecaster.observe(obs, peak=peak)
    forecaster.ask(asked)
    return forecaster
