"""Running the simulator live: its virtual clock held to the wall clock, its events published.

By default the simulator runs as fast as it can (≥ 1,000× real time). As a
demo fleet for the live stack it must instead behave like a fleet: virtual
second ``t`` happens at wall time ``start + t / speed``, so the planner
downstream sees FPMs and finished requests arrive at the pace they would
from real engines (``speed`` > 1 compresses a long trace into a shorter
demo; event times then run ``speed`` times faster than the wall clock).

:class:`LiveRun` is what :class:`fleetplan.sim.runner.ClosedLoop` is given:
it anchors the pacer and the publisher's epoch at the same instant, so a
published event's time is the wall time at which it was sent (at speed 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


class RealtimePacer:
    """Sleeps until the wall clock reaches a virtual time; calls ``before_wait`` first.

    ``before_wait`` (the publisher's flush) runs only when the pacer is about
    to sleep, so events of one instant leave together, and on time. A gap
    shorter than ``min_wait_s`` is not slept: sleeping is coarser than that.
    When the simulation falls behind (a slow machine, a PUSH peer applying
    backpressure) it runs flat out until it has caught up; it never skips.
    """

    def __init__(self, speed: float = 1.0, *, before_wait: Callable[[], None] | None = None,
                 min_wait_s: float = 0.002, sleep: Callable[[float], None] = time.sleep,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.speed = speed
        self.before_wait = before_wait
        self.min_wait_s = min_wait_s
        self.slept_s = 0.0
        self._sleep = sleep
        self._monotonic = monotonic
        self._start: float | None = None

    def start(self) -> None:
        """Virtual time 0 is now."""
        self._start = self._monotonic()

    def __call__(self, virtual_t: float) -> None:
        """Return once virtual time ``virtual_t`` is due on the wall clock."""
        if self._start is None:
            self.start()
        wait = self._start + virtual_t / self.speed - self._monotonic()
        if wait < self.min_wait_s:
            return
        if self.before_wait is not None:
            self.before_wait()
            wait = self._start + virtual_t / self.speed - self._monotonic()
            if wait <= 0:
                return
        self._sleep(wait)
        self.slept_s += wait


@dataclass
class LiveRun:
    """A run's live outputs: a publisher (``write``, ``flush``, ``epoch``) and/or a pacer."""

    publisher: object | None = None
    pacer: RealtimePacer | None = None

    def start(self) -> None:
        """Anchor virtual time 0 at this instant for both the pacer and the published epoch."""
        if self.publisher is not None:
            self.publisher.epoch = time.time()
            if self.pacer is not None and self.pacer.before_wait is None:
                self.pacer.before_wait = self.publisher.flush
        if self.pacer is not None:
            self.pacer.start()

    def write(self, event) -> None:
        if self.publisher is not None:
            self.publisher.write(event)

    def pace(self, virtual_t: float) -> None:
        if self.pacer is not None:
            self.pacer(virtual_t)

    def finish(self) -> None:
        if self.publisher is not None:
            self.publisher.flush()
