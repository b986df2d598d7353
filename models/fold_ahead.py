"""Folding events before their tick, without changing what any tick sees.

A tick at ``T`` sees exactly the events with time < ``T`` applied in canonical
order. Applying them all when the tick fires makes the tick wait on a whole
interval's fold (seconds at FPM rates). But once the watermark ``W`` has
passed an event, the events before ``W`` that have arrived can be applied
already, in canonical order: the canonical order sorts by time first, so
applying [last tick, W) now and [W, T) at the tick is the same sequence of
``apply`` calls as applying [last tick, T) at the tick, and the core is
deterministic, so every tick report is bit-for-bit the same.

Two things can spoil that, and are handled here:

* an event arrives below ``W`` (it came later than the grace period allows,
  but after the last tick, so it is not late): it must be applied *before*
  events already applied. The state is put back to the last tick from a
  checkpoint and the events applied since go back into the buffer (a
  *rollback*; rare, and bounded by one tick interval of events);
* a control event changes the config that callers read between ticks (the
  grace period, the tick interval): events are folded ahead only up to the
  first buffered control event, which is applied at its tick as before.

Events applied ahead are kept until their tick fires, for a rollback. Given
the bytes an event was decoded from (``offer(..., raw=...)``), the bytes are
kept instead of the event: a pydantic FPM is a dozen objects the cyclic
garbage collector would scan while they wait (measured, a third of the
worker's time), and the bytes take a fifth of the memory. A rollback decodes
them again as the worker did (``decode_input``).

Nothing here is part of the planner's state: :class:`FoldAhead` sits beside a
``DeploymentState``. :func:`settled_data` is the state as folding at tick
time would have it (the last tick's state plus what ``offer`` recorded), so
what the worker stores, and what it recovers, does not depend on it either.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import orjson

from fleetplan.models.canonical import canonical_key
from fleetplan.models.state import DeploymentState
from fleetplan.schemas.fpm_wire import decode_input

OFFER_FIELDS = ("buffer", "max_time", "next_tick", "last_tick", "late_events")
"""The fields ``offer`` and the tick bookkeeping own; a rollback keeps their current values."""

_RESTORED = tuple(f.name for f in fields(DeploymentState) if f.name not in OFFER_FIELDS)


@dataclass
class FoldAhead:
    """Events applied ahead of their tick, and how to undo them.

    ``through``: every accepted event with time < ``through`` has been applied
    (None: nothing applied ahead since the last tick). ``checkpoint``: the
    state at the last tick as plain data without the buffer (a private copy),
    taken before the first event applied ahead. ``applied``: the events
    applied ahead since the last tick (or the bytes they were decoded from).
    """

    through: float | None = None
    applied: list = field(default_factory=list)
    checkpoint: dict | None = None
    rollbacks: int = 0
    # id(event) -> its bytes, for the accepted events not applied yet (alive, so ids are stable).
    raw: dict[int, bytes] = field(default_factory=dict, repr=False)

    def settle(self) -> None:
        """A tick fired: what was applied ahead is now part of a fired tick."""
        self.through = None
        self.applied = []
        self.checkpoint = None

    def forget(self, events) -> None:
        """``events`` were applied at their tick: drop their bytes."""
        if self.raw:
            for event in events:
                self.raw.pop(id(event), None)

    def events(self) -> list:
        """The events applied ahead, decoded again where only their bytes were kept."""
        out = []
        for item in self.applied:
            if isinstance(item, bytes | bytearray | memoryview):
                event = decode_input(item)
                self.raw[id(event)] = item
                out.append(event)
            else:
                out.append(item)
        return out


def snapshot(state: DeploymentState) -> dict:
    """``state.to_data()`` without the event buffer (shared with the caller's objects)."""
    buffer, state.buffer = state.buffer, []
    try:
        return state.to_data()
    finally:
        state.buffer = buffer


def settled_data(state: DeploymentState, ahead: FoldAhead | None) -> dict:
    """The state without its buffer, as it would be had nothing been applied ahead."""
    if ahead is None or ahead.checkpoint is None:
        return snapshot(state)
    data = dict(ahead.checkpoint)
    for name in OFFER_FIELDS[1:]:
        data[name] = getattr(state, name)
    return data


def fold(planner, state: DeploymentState, ahead: FoldAhead, watermark: float) -> None:
    """Apply the buffered events before ``watermark`` (and before any buffered control event)."""
    if state.next_tick is None:
        return  # nothing offered yet
    # Before the first tick its time follows the earliest event (``offer``); it can
    # only move earlier for an event below ``through``, which rolls back anyway.
    limit = min(watermark, state.next_tick)
    if ahead.through is not None and limit <= ahead.through:
        return  # the watermark has not moved
    buffer = state.buffer
    for event in buffer:
        if event.time < limit and event.type == "control":
            limit = event.time
    if ahead.through is not None and limit <= ahead.through:
        return
    due = [e for e in buffer if e.time < limit]
    if due:
        if ahead.checkpoint is None:
            # A JSON round trip: a private copy, immune to later in-place changes,
            # and exactly what the worker's table would hold.
            ahead.checkpoint = orjson.loads(orjson.dumps(snapshot(state)))
        state.buffer = [e for e in buffer if e.time >= limit]
        due.sort(key=canonical_key)
        for event in due:
            planner.apply(state, event)
        raw = ahead.raw
        ahead.applied.extend([raw.pop(id(e), e) for e in due] if raw else due)
    ahead.through = limit


def needs_rollback(ahead: FoldAhead | None, event_time: float) -> bool:
    return ahead is not None and ahead.through is not None and event_time < ahead.through


def rollback(state: DeploymentState, ahead: FoldAhead) -> None:
    """Put the state back to the last tick and the events applied since back in the buffer."""
    if ahead.checkpoint is not None:
        restored = DeploymentState.from_data(ahead.checkpoint)
        for name in _RESTORED:
            setattr(state, name, getattr(restored, name))
        ahead.rollbacks += 1
    state.buffer = ahead.events() + state.buffer
    ahead.settle()
