"""Event time: when a tick fires and which events it sees.

Ticks fall on multiples of the base interval in event time. The tick at
``T`` fires once the watermark passes ``T`` and sees exactly the events with
time < ``T``, applied in a canonical order, so neither arrival order nor
processing speed can change a decision (design principle 3). An event older
than the last fired tick is late: it is counted and refused, never merged.

With a :class:`~fleetplan.models.fold_ahead.FoldAhead` (the live worker
passes one), events the watermark has passed are applied as soon as it
passes them instead of all at the tick; every tick still sees the same
events in the same order (see :mod:`fleetplan.models.fold_ahead`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fleetplan.models import fold_ahead
from fleetplan.models.canonical import canonical_key
from fleetplan.models.config import MAX_STARTUP_SECONDS
from fleetplan.models.fold_ahead import FoldAhead
from fleetplan.models.planner import Planner, TickReport
from fleetplan.models.state import DeploymentState

__all__ = ["FoldAhead", "Watermark", "advance", "canonical_key", "clock_watermark", "first_tick_after", "offer",
           "watermark_of"]

Watermark = Callable[[DeploymentState], float]
"""A watermark that follows the state's config (see :func:`advance`)."""


def first_tick_after(t: float, interval: int) -> float:
    """The first tick boundary strictly after ``t``."""
    return float((math.floor(t / interval) + 1) * interval)


def offer(state: DeploymentState, event, ahead: FoldAhead | None = None, *,
          raw: bytes | None = None) -> bool:
    """Buffer an input event for its tick; False (and counted) when it is late.

    ``raw``, the bytes ``event`` was decoded from, lets ``ahead`` keep those
    instead of the event once it is applied ahead (see :mod:`fleetplan.models.fold_ahead`).
    """
    t = event.time
    if state.last_tick is not None and t < state.last_tick:
        state.late_events += 1
        return False
    if fold_ahead.needs_rollback(ahead, t):
        fold_ahead.rollback(state, ahead)  # it sorts before events already applied
    if state.last_tick is None:
        # Before the first tick fires, its time follows the earliest event so far,
        # not the first to arrive: arrival order across topics must not move it.
        first = first_tick_after(t, state.config.tick_interval_seconds)
        if state.next_tick is None or first < state.next_tick:
            state.next_tick = first
    state.buffer.append(event)
    if state.max_time is None or t > state.max_time:
        state.max_time = t
    if ahead is not None and raw is not None:
        ahead.raw[id(event)] = raw
    return True


def advance(planner: Planner, state: DeploymentState, watermark: float | Watermark,
            ahead: FoldAhead | None = None, *, max_ticks: int | None = None) -> list[TickReport]:
    """Fire every tick at or before ``watermark``, in order; with ``ahead``, then
    apply the events before ``watermark`` that wait for the next tick.

    ``watermark`` is a time, or a function of the state giving it (a source
    clock minus the grace period: :func:`clock_watermark`). A function is
    asked again before each tick, since a tick can apply a ``set_config``
    that changes the grace period: the ticks after it fire under the new one,
    however the events were split into calls.

    The ticks of a silence longer than every timer are skipped, not fired
    (:func:`silent_through`); the skip depends on the events alone.

    ``max_ticks`` stops after that many ticks; the rest fire on the next call.
    Firing later never changes a tick's decision, only which events come too
    late for it.
    """
    at = watermark if callable(watermark) else (lambda _state: watermark)
    reports: list[TickReport] = []
    while state.next_tick is not None and (max_ticks is None or len(reports) < max_ticks):
        now = state.next_tick
        mark = at(state)  # once a tick: the worker pairs each tick with the watermark it fired under
        if now > mark:
            break
        through = silent_through(state, now, mark)
        if through is not None:
            interval = state.config.tick_interval_seconds
            state.silent_ticks_skipped += round((through - now) / interval) + 1
            planner.skip_silence(state, through)
            state.last_tick = through
            state.next_tick = first_tick_after(through, interval)
            if ahead is not None:
                ahead.settle()
            continue
        due = [e for e in state.buffer if e.time < now]
        if due:
            state.buffer = [e for e in state.buffer if e.time >= now]
            due.sort(key=canonical_key)
            for event in due:
                planner.apply(state, event)
            if ahead is not None:
                ahead.forget(due)
        reports.append(planner.tick(state, now))
        state.last_tick = now
        # The interval can change with a config event; stay on its grid.
        state.next_tick = first_tick_after(now, state.config.tick_interval_seconds)
        if ahead is not None:
            ahead.settle()
    if ahead is not None:
        fold_ahead.fold(planner, state, ahead, at(state))
    return reports


SILENCE_SKIPPED_AFTER_SECONDS = 86_400.0
"""A deployment silent this long (no event at all, not even a bridge heartbeat) has its
further silent ticks skipped; longer when a configured timer runs longer."""


def silent_through(state: DeploymentState, now: float, watermark: float) -> float | None:
    """The last tick of a silence that the ticks from ``now`` on can skip, or None.

    A tick sees the events before it, so in a stretch with no event the ticks only
    replay the timers (the ack timeout, a stuck startup, forgetting silent engines, the
    measured floors of windows closed before it running out of ``load_floor_memory_seconds``)
    and feed the forecaster empty windows. Once the deployment has been silent longer than
    any of those timers, nothing is left for them to do, and firing them all was a
    hang: one event dated 1970 ahead of a 2023 log (an engine on a monotonic clock)
    made 340 million 5-s ticks due. The ticks are skipped up to the next buffered
    event or the watermark, whichever is first; the skip depends on the events alone
    (the latest applied, the buffered), so a replay skips the same ticks.
    """
    last = state.last_input
    cfg = state.config
    # the floor memory too: each silent window's empty floor pushes an older one out, and a
    # skip before they all had kept a busy window's floor to hold the fleet when traffic came back
    quiet = max(SILENCE_SKIPPED_AFTER_SECONDS, cfg.ack_timeout_seconds, cfg.discovered_engine_ttl_seconds,
                MAX_STARTUP_SECONDS, cfg.floor_memory_windows * cfg.throughput_adjustment_interval_seconds)
    # and a throughput window and a tick more, so that each timer's own tick has fired
    if last is None or now - last <= quiet + cfg.throughput_adjustment_interval_seconds + cfg.tick_interval_seconds:
        return None
    upto = min((e.time for e in state.buffer), default=watermark)
    if upto < now:
        return None  # the tick has events to apply
    interval = cfg.tick_interval_seconds
    through = float(math.floor(min(upto, watermark) / interval) * interval)
    return through if through >= now else None


def clock_watermark(clock: float) -> Watermark:
    """The watermark of a source clock: the clock minus the grace period in force."""
    return lambda state: clock - state.config.grace_seconds


def watermark_of(state: DeploymentState) -> float | None:
    """The single-source watermark: the latest event time minus the grace period
    (``advance`` accepts the function itself, and asks it again after each tick)."""
    if state.max_time is None:
        return None
    return state.max_time - state.config.grace_seconds
