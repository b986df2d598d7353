"""Event-time watermarks per input partition.

A deployment's inputs arrive on several topics, all on the same partition
number. The partition's event-time clock is the *smallest* of its live
sources' latest event times (design principle 3): a tick may only fire once
every source that can still deliver an event for it has moved past it. The
core then subtracts the deployment's grace period and decides which ticks
fire (``sequencer.advance``); this module only keeps the clock.

Only the dense, heartbeated topics (FPMs and request records) are sources.
Sparse topics (inventory, control, acks) would stall the clock for hours.

A source that has been silent on the wall clock for ``idle_after_s`` (its
bridge is down) stops holding the clock back, as in Flink's idleness; the
bridge heartbeats idle deployments, so a live source is never idle. After
an assignment, a source not yet seen holds the clock for the same time, so
a slow topic gets the chance to show up before ticks fire without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceClock:
    latest: float
    seen_at: float


@dataclass
class PartitionClock:
    """The event-time clock of one partition number across its source topics."""

    sources: tuple[str, ...]
    idle_after_s: float
    assigned_at: float
    clocks: dict[str, SourceClock] = field(default_factory=dict)
    value: float | None = None
    advanced_at: float | None = None

    def observe(self, source: str, event_time: float, now: float) -> None:
        """A record of ``source`` with ``event_time`` arrived at wall time ``now``."""
        clock = self.clocks.get(source)
        if clock is None:
            self.clocks[source] = SourceClock(event_time, now)
        else:
            if event_time > clock.latest:
                clock.latest = event_time
            clock.seen_at = now

    def time(self, now: float) -> float | None:
        """The partition clock at wall time ``now``; ``None`` while it must wait.

        Never goes backwards: a source that comes back from idleness behind
        the clock makes its events late rather than un-firing ticks.
        """
        live: list[float] = []
        for source in self.sources:
            clock = self.clocks.get(source)
            if clock is None:
                if now - self.assigned_at < self.idle_after_s:
                    return self.value  # a source may still show up: hold
                continue
            if now - clock.seen_at < self.idle_after_s:
                live.append(clock.latest)
        if not live:
            return self.value
        candidate = min(live)
        if self.value is None or candidate > self.value:
            self.value = candidate
            self.advanced_at = now
        return self.value


class Watermarks:
    """The clocks of the partitions this worker owns."""

    def __init__(self, sources: tuple[str, ...], idle_after_s: float) -> None:
        self.sources = sources
        self.idle_after_s = idle_after_s
        self.partitions: dict[int, PartitionClock] = {}

    def assign(self, partitions, now: float) -> None:
        for p in partitions:
            if p not in self.partitions:
                self.partitions[p] = PartitionClock(self.sources, self.idle_after_s, now)

    def revoke(self, partitions) -> None:
        for p in partitions:
            self.partitions.pop(p, None)

    def clock(self, partition: int, now: float) -> PartitionClock:
        clock = self.partitions.get(partition)
        if clock is None:
            clock = self.partitions[partition] = PartitionClock(self.sources, self.idle_after_s, now)
        return clock

    def observe(self, source: str, partition: int, event_time: float, now: float) -> None:
        if source in self.sources:
            self.clock(partition, now).observe(source, event_time, now)

    def time(self, partition: int, now: float) -> float | None:
        clock = self.partitions.get(partition)
        return None if clock is None else clock.time(now)
