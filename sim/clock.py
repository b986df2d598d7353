"""The virtual clock: a heap of timed callbacks, run in time order.

Ties run in the order they were scheduled (a sequence number breaks them),
so a run is a pure function of its inputs and seed: the same workload gives
the same events in the same order, bit for bit.

A callback can also be put at the *end* of an instant (:meth:`VirtualClock.at_end`):
it runs after every ordinary callback due at that time, even ones scheduled
after it. An idle engine starts its first pass that way, so requests that
arrive at one instant share that pass whatever order they were scheduled in,
as they would in a real scheduler's next iteration.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

_END_OF_INSTANT = 1 << 62
"""Added to the sequence number of an end-of-instant callback: it sorts after
every ordinary one at the same time (a run schedules far fewer than 2**62)."""


class VirtualClock:
    __slots__ = ("now", "_heap", "_seq")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = 0

    def at(self, time: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` at ``time`` (never earlier than now)."""
        if time < self.now:
            time = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq, fn, args))

    def at_end(self, time: float, fn: Callable, *args) -> None:
        """Run ``fn(*args)`` at ``time``, after every ordinary callback due then."""
        if time < self.now:
            time = self.now
        self._seq += 1
        heapq.heappush(self._heap, (time, self._seq + _END_OF_INSTANT, fn, args))

    def after(self, delay: float, fn: Callable, *args) -> None:
        self.at(self.now + delay, fn, *args)

    def step(self) -> bool:
        """Run the next callback; False when nothing is left."""
        if not self._heap:
            return False
        time, _, fn, args = heapq.heappop(self._heap)
        self.now = time
        fn(*args)
        return True

    def peek(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
