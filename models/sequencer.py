"""Event time: when a tick fires and which events it sees.

Ticks fall on multiples of the base interval in event time. The tick at
``T`` fires once the watermark passes ``T`` and sees exactly the events with
time < ``T``, applied in a canonical order, so neither arrival order nor
processing speed can change a decision (design principle 3). An event older
than the last fired tick is late: it is counted and refused, never merged.
"""

from __future__ import annotations

import math

from fleetplan.models.planner import Planner, TickReport
from fleetplan.models.state import DeploymentState
from fleetplan.schemas.codec import encode_event

# Lifecycle and acks first, so a tick's metrics meet the inventory they belong to.
_TYPE_RANK = {"inventory": 0, "ack": 1, "control": 2, "request": 3, "fpm": 4, "fpm_batch": 4, "clock": 5}


def canonical_key(event) -> tuple:
    """Total order of events: time, kind, then identity fields.

    FPMs are identified by (worker, rank, counter); other events, which are
    rare, by their full encoding, so two different events never tie.
    """
    kind = event.type
    if kind == "fpm":
        return (event.time, 4, event.worker_id, event.dp_rank, event.counter_id, event.wall_time, b"")
    if kind == "request":
        return (event.time, 3, event.request_id, 0, 0, 0.0, b"")
    return (event.time, _TYPE_RANK.get(kind, 9), "", 0, 0, 0.0, encode_event(event))


def first_tick_after(t: float, interval: int) -> float:
    """The first tick boundary strictly after ``t``."""
    return float((math.floor(t / interval) + 1) * interval)


def offer(state: DeploymentState, event) -> bool:
    """Buffer an input event for its tick; False (and counted) when it is late."""
    t = event.time
    if state.last_tick is not None and t < state.last_tick:
        state.late_events += 1
        return False
    if state.last_tick is None:
        # Before the first tick fires, its time follows the earliest event so far,
        # not the first to arrive: arrival order across topics must not move it.
        first = first_tick_after(t, state.config.tick_interval_seconds)
        if state.next_tick is None or first < state.next_tick:
            state.next_tick = first
    state.buffer.append(event)
    if state.max_time is None or t > state.max_time:
        state.max_time = t
    return True


def advance(planner: Planner, state: DeploymentState, watermark: float) -> list[TickReport]:
    """Fire every tick at or before ``watermark``, in order."""
    reports: list[TickReport] = []
    while state.next_tick is not None and state.next_tick <= watermark:
        now = state.next_tick
        due = [e for e in state.buffer if e.time < now]
        if due:
            state.buffer = [e for e in state.buffer if e.time >= now]
            due.sort(key=canonical_key)
            for event in due:
                planner.apply(state, event)
        reports.append(planner.tick(state, now))
        state.last_tick = now
        # The interval can change with a config event; stay on its grid.
        state.next_tick = first_tick_after(now, state.config.tick_interval_seconds)
    return reports


def watermark_of(state: DeploymentState) -> float | None:
    """The single-source watermark: the latest event time minus the grace period."""
    if state.max_time is None:
        return None
    return state.max_time - state.config.grace_seconds
