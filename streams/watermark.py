"""Event-time clocks: when a deployment's inputs have moved past a tick.

The core decides which ticks fire given a watermark (``sequencer.advance``);
this module keeps the clock that watermark is derived from (the core
subtracts the deployment's grace period).

A deployment's clock is the *smallest* of its live sources' latest event
times (design principle 3): a tick may only fire once every source that can
still deliver an event for it has moved past it. The sources are the dense,
heartbeated topics (FPMs and request records); sparse topics (inventory,
control, acks) would stall the clock for hours.

The clock is kept per deployment, not per partition: a partition carries
many deployments, and their records are not time-aligned when one of them
is replayed or a bridge catches up on a backlog; a partition-wide clock
would fire the lagging deployment's ticks early and make its inputs late.
Per-deployment sources work because the bridge heartbeats each idle
deployment.

Two rules bound the waiting:

* a source silent on the wall clock for ``idle_after_s`` (its bridge is
  down) stops holding the clock back, as in Flink's idleness; when all of a
  deployment's sources are idle, its clock follows its partition's (the
  smallest of the partition's sources' latest times across deployments);
* a source not seen yet holds the clock for ``idle_after_s`` after the
  deployment was first seen (or the partition assigned), so a slower topic
  gets the chance to show up before ticks fire without it;
* idleness is silence while the other sources are heard: when every source
  was silent (the broker or the bridge was down, or the traffic paused) and
  one comes back, the others hold the clock again for ``idle_after_s``, so
  the backlog of the topic read second is not late for ticks the first one
  moved the clock past.

Clocks never go backwards: a source that comes back behind the clock makes
its events late rather than un-firing ticks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SourceClock:
    latest: float
    seen_at: float


@dataclass
class Clock:
    """The minimum over a set of sources' latest event times, with idleness."""

    sources: tuple[str, ...]
    idle_after_s: float
    started_at: float
    clocks: dict[str, SourceClock] = field(default_factory=dict)
    value: float | None = None
    advanced_at: float | None = None
    # wall time the sources were last heard again after all of them fell silent
    resumed_at: float | None = None

    def observe(self, source: str, event_time: float, now: float) -> None:
        """A record of ``source`` with ``event_time`` arrived at wall time ``now``."""
        if self.clocks and all(now - c.seen_at >= self.idle_after_s for c in self.clocks.values()):
            self.resumed_at = now  # every source was silent: none was down while others went on
        clock = self.clocks.get(source)
        if clock is None:
            self.clocks[source] = SourceClock(event_time, now)
        else:
            if event_time > clock.latest:
                clock.latest = event_time
            clock.seen_at = now

    def candidate(self, now: float) -> tuple[float | None, bool]:
        """(min of the live sources' latest times, whether a missing source may still show up)."""
        live: list[float] = []
        for source in self.sources:
            clock = self.clocks.get(source)
            if clock is None:
                if now - self.started_at < self.idle_after_s:
                    return None, True
                continue
            heard = clock.seen_at if self.resumed_at is None else max(clock.seen_at, self.resumed_at)
            if now - heard < self.idle_after_s:
                live.append(clock.latest)
        return (min(live) if live else None), False

    def advance_to(self, candidate: float | None, now: float) -> float | None:
        if candidate is not None and (self.value is None or candidate > self.value):
            self.value = candidate
            self.advanced_at = now
        return self.value


class Watermarks:
    """The clocks of the deployments (and partitions) this worker owns."""

    def __init__(self, sources: tuple[str, ...], idle_after_s: float) -> None:
        self.sources = sources
        self.idle_after_s = idle_after_s
        self.partitions: dict[int, Clock] = {}
        self.deployments: dict[str, Clock] = {}
        self._partition_of: dict[str, int] = {}

    def assign(self, partitions, now: float) -> None:
        for p in partitions:
            self.partitions.setdefault(p, Clock(self.sources, self.idle_after_s, now))

    def revoke(self, partitions) -> None:
        gone = set(partitions)
        for p in gone:
            self.partitions.pop(p, None)
        for name in [n for n, p in self._partition_of.items() if p in gone]:
            self.deployments.pop(name, None)
            del self._partition_of[name]

    def observe(self, source: str, partition: int, deployment: str, event_time: float, now: float) -> None:
        if source not in self.sources:
            return
        pclock = self.partitions.get(partition)
        if pclock is None:
            pclock = self.partitions[partition] = Clock(self.sources, self.idle_after_s, now)
        pclock.observe(source, event_time, now)
        dclock = self.deployments.get(deployment)
        if dclock is None:
            dclock = self.deployments[deployment] = Clock(self.sources, self.idle_after_s, now)
            self._partition_of[deployment] = partition
        dclock.observe(source, event_time, now)

    def time(self, partition: int, deployment: str, now: float) -> tuple[float | None, float | None]:
        """(the deployment's clock at wall time ``now``, wall time it last advanced)."""
        dclock = self.deployments.get(deployment)
        if dclock is None:  # owned but not heard from since (re)assignment
            dclock = self.deployments[deployment] = Clock(self.sources, self.idle_after_s, now)
            self._partition_of[deployment] = partition
        candidate, waiting = dclock.candidate(now)
        if candidate is None and not waiting:
            # Every source of this deployment is idle: follow the partition.
            pclock = self.partitions.get(partition)
            if pclock is not None:
                candidate = pclock.advance_to(pclock.candidate(now)[0], now)
        return dclock.advance_to(candidate, now), dclock.advanced_at
