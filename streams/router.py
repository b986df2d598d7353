"""Route input records into the planning core; collect what it returns.

This is the whole of the worker's logic, kept free of Faust so it can be
tested in-process (records in, outputs out). It decides nothing about
scaling: it decodes records, hands events to ``sequencer.offer``, keeps
each partition's event-time clock, calls ``sequencer.advance`` with the
resulting watermark, and turns the tick reports into records to write.

Durability bookkeeping lives here too, because it depends on what the core
did with each record:

* a record whose event is buffered for a future tick is *held*: its offset
  must not be committed until the tick that folds it has been saved;
* a record is *released* once it can never be needed again (folded and
  saved, late and dead-lettered, invalid, or a replay of one already folded);
* a deployment is *dirty* when its stored record must be rewritten (a tick
  fired, a late event was counted, its first tick was scheduled, a record of
  a topic that does not move the clock was buffered).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import orjson

from fleetplan.models import fold_ahead
from fleetplan.models.config_changes import intake_problem
from fleetplan.models.fleet import INPUT_TYPES
from fleetplan.models.fold_ahead import settled_data
from fleetplan.models.planner import Planner, TickReport
from fleetplan.models.sequencer import FoldAhead, advance, clock_watermark, offer
from fleetplan.models.state import DeploymentState
from fleetplan.schemas import topics as canonical
from fleetplan.schemas.codec import SchemaError, event_to_dict
from fleetplan.schemas.events import DeadLetter
from fleetplan.schemas.fpm_wire import decode_input
from fleetplan.streams.tables import Output, StoredDeployment
from fleetplan.streams.topics import TICKS, partition_for
from fleetplan.streams.watermark import Watermarks

PAYLOAD_LIMIT = 4096
FOLD_EVERY_FPMS = 20_000
"""Within a batch, fold ahead (never tick) every this many FPMs, so a large batch
(a backlog read in 2000-record batches is ~400k FPMs) never holds all its events
decoded at once: the decoded objects are what the garbage collector scans."""


MAX_TICKS_PER_BATCH = 1000
"""A deployment fires at most this many ticks per batch; the rest fire with the next.
Each tick leaves a diagnostics record (about 0.5 kB) in the outbox, which is saved
in the deployment's table record: a clock that jumps a day at 5-s ticks (one
event dated ahead, or a source back after an outage) fired 17,280 ticks at once,
and their 19 MB outbox was refused by the 16 MiB record limit on every restart."""


SNAPSHOT_EVERY_SECONDS = 3600
"""Event time between a deployment's state snapshots on the ticks topic. FPMs are kept a
day, so an audit of an older deployment cannot fold from its first event; it starts from
a snapshot instead (``fleetplan audit --since``), the state a tick left, as a restart does."""


SNAPSHOT_MAX_BYTES = 900_000
"""Largest snapshot written: under the 1 MB a ticks topic created before snapshots takes
(Kafka's default ``max.message.bytes``); one that large (a fleet of some 1,500 engines'
latest FPMs) is left out, and ``fleetplan_snapshots_skipped_total`` counts it."""


def snapshot_record(deployment: str, tick: float, state: dict) -> dict:
    """The ticks-topic record of a deployment's state as tick ``tick`` left it."""
    return {"type": "snapshot", "deployment": deployment, "time": tick, "state": state}


@dataclass
class InputRecord:
    """One consumed record. ``topic`` is the canonical (unprefixed) name."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    received_at: float = 0.0
    handle: object = None


@dataclass
class LiveDeployment:
    """A deployment this worker owns: the core's state plus durability bookkeeping."""

    name: str
    partition: int
    state: DeploymentState
    positions: dict[str, int] = field(default_factory=dict)
    outbox: list[Output] = field(default_factory=list)
    # (event time, handle, topic, offset) of each record buffered for a tick not yet saved
    held: list[tuple[float, object, str, int]] = field(default_factory=list)
    # after recovery: per topic, the last record the saved state had buffered; no tick
    # fires until each is read again (see ``Router.adopt``)
    awaiting: dict[str, int] = field(default_factory=dict)
    dirty: bool = False
    last_throughput_tick: float | None = None
    ahead: FoldAhead = field(default_factory=FoldAhead)

    def stored(self) -> StoredDeployment:
        # The state as of its last tick (plus what offer recorded), not what was
        # folded ahead since: the held records of those events are read again after
        # a crash, so the stored state must not contain them yet.
        awaiting = dict(self.awaiting)
        for _, _, topic, offset in self.held:
            awaiting[topic] = max(offset, awaiting.get(topic, -1))
        return StoredDeployment(self.partition, settled_data(self.state, self.ahead),
                                dict(self.positions), list(self.outbox), awaiting)


@dataclass
class TickOutcome:
    """One fired tick, with the wall time the watermark passed it (for latency)."""

    deployment: LiveDeployment
    report: TickReport
    diagnostics: Output
    watermark_at: float | None


@dataclass
class MirrorAdd:
    """A request to add to the traffic mirror (applied by the worker)."""

    deployment: str
    partition: int
    offset: int
    event: object


@dataclass
class RoutedBatch:
    """What one batch of records produced."""

    invalid: list[Output] = field(default_factory=list)
    saves: list[LiveDeployment] = field(default_factory=list)
    release: list[object] = field(default_factory=list)
    ticks: list[TickOutcome] = field(default_factory=list)
    mirror: list[MirrorAdd] = field(default_factory=list)
    late: Counter = field(default_factory=Counter)
    dead: Counter = field(default_factory=Counter)
    events: Counter = field(default_factory=Counter)
    fpms: int = 0
    rollbacks: int = 0
    snapshots_skipped: int = 0

    def outputs(self) -> list[Output]:
        """Everything to send once the saves are durable, in order."""
        out = list(self.invalid)
        for dep in self.saves:
            out.extend(dep.outbox)
        return out


def late_detail(event_time: float, last_tick: float, topic: str, partition: int, offset: int) -> str:
    """The dead-letter detail of a late event; ``[at topic:partition:offset]`` is parsed by the audit."""
    return (f"event time {event_time} is before the last fired tick {last_tick}"
            f" [at {topic}:{partition}:{offset}]")


class Router:
    """Owns the live deployments of this worker's partitions."""

    def __init__(
        self, planner: Planner, watermarks: Watermarks, *,
        load: Callable[[str], StoredDeployment | None] = lambda name: None,
        clock: Callable[[], float] = time.time,
        partitions: int | None = None,
        snapshot_every: float = SNAPSHOT_EVERY_SECONDS,
    ) -> None:
        self.planner = planner
        self.snapshot_every = snapshot_every  # 0: none
        # the input topics' partition count: a deployment lives on partition_for(name, partitions)
        self.partitions = partitions
        self.watermarks = watermarks
        self.load = load
        self.clock = clock
        self.deployments: dict[str, LiveDeployment] = {}
        self.by_partition: dict[int, set[str]] = {}
        self.fold_every = FOLD_EVERY_FPMS

    # --- ownership -----------------------------------------------------------

    def adopt(self, name: str, stored: StoredDeployment) -> LiveDeployment:
        """Take over a deployment recovered from the table.

        The records its saved state had buffered for a tick are read again
        (their offsets were never committed), but Kafka orders records only
        within a partition: a busy topic's backlog can come back before a
        sparse one's. Had a tick fired on that backlog first, a buffered
        record read again after it would be late, although the run without the
        crash folded it. So the deployment fires no tick, and folds nothing
        ahead, until every topic has been read again up to its last buffered
        record (``awaiting``); the crash then changes no decision.
        """
        dep = LiveDeployment(
            name=name, partition=stored.partition,
            state=DeploymentState.from_data(stored.state),
            positions=dict(stored.positions), outbox=list(stored.outbox),
            awaiting=dict(stored.awaiting),
        )
        self._own(dep)
        return dep

    def drop_partitions(self, partitions: Iterable[int]) -> None:
        """Forget the deployments of revoked partitions (their held records stay uncommitted)."""
        for p in list(partitions):
            for name in self.by_partition.pop(p, set()):
                self.deployments.pop(name, None)
        self.watermarks.revoke(partitions)

    def inputs_start_at(self, partition: int, starts: dict[str, int]) -> None:
        """Retention deleted the records of ``partition`` before ``starts[topic]``, its first
        offset kept: a buffered record among them is never read again, so no deployment waits
        for it (``adopt``), or it would fire no tick again."""
        for name in self.by_partition.get(partition, ()):
            awaiting = self.deployments[name].awaiting
            for topic, first in starts.items():
                if awaiting.get(topic, first) < first:
                    del awaiting[topic]

    def partition_of(self, name: str) -> int | None:
        dep = self.deployments.get(name)
        return None if dep is None else dep.partition

    def _own(self, dep: LiveDeployment) -> None:
        self.deployments[dep.name] = dep
        self.by_partition.setdefault(dep.partition, set()).add(dep.name)

    def _deployment(self, name: str, partition: int) -> LiveDeployment:
        dep = self.deployments.get(name)
        if dep is None:
            stored = self.load(name)
            if stored is not None:
                dep = self.adopt(name, stored)
            else:
                dep = LiveDeployment(name, partition, self.planner.new_state(name))
                self._own(dep)
        return dep

    # --- routing -------------------------------------------------------------

    def route(self, records: Iterable[InputRecord], now: float) -> RoutedBatch:
        """Offer every record's event to its deployment, then fire the ticks now due."""
        batch = RoutedBatch()
        folded_at = 0
        for rec in records:
            self._offer(rec, batch)
            if batch.fpms - folded_at >= self.fold_every:
                self._fold_ahead(now)
                folded_at = batch.fpms
        self._fire(now, batch)
        for dep in self.deployments.values():
            if dep.dirty:
                batch.saves.append(dep)
        return batch

    def _offer(self, rec: InputRecord, batch: RoutedBatch) -> None:
        try:
            event = decode_input(rec.value)
        except SchemaError as err:
            self._invalid(rec, batch, "oversize" if err.oversize else "invalid", str(err))
            return
        kind = event.type
        if kind not in INPUT_TYPES:
            self._invalid(rec, batch, "invalid", f"type: an input event ({', '.join(sorted(INPUT_TYPES))}), got {kind!r}")
            return
        key = None if rec.key is None else rec.key.decode("utf-8", "replace")
        if key != event.deployment:
            self._invalid(rec, batch, "invalid",
                          f"record key {key!r} is not the event's deployment {event.deployment!r}"
                          " (records must be keyed by deployment)")
            return
        owner = self.partition_of(event.deployment)
        if owner is None and self.partitions is not None:
            # the deployment's first record must not decide where it lives: a stray one on
            # another partition would take it over and refuse every correct record after it
            owner = partition_for(event.deployment, self.partitions)
        if owner is not None and owner != rec.partition:
            self._invalid(rec, batch, "invalid",
                          f"deployment {event.deployment!r} lives on partition {owner}, record came on "
                          f"{rec.partition} (producers must use the default murmur2 partitioner)")
            return
        # a set_config on the change alone, never on the config folded so far
        # (models/config_changes.py); what depends on other fields is judged at the tick
        # (rejected_controls). Before the deployment is made: a refused record of a name
        # never seen must not leave a planner state behind
        known = self.deployments.get(event.deployment)
        problem = intake_problem(self.planner.config if known is None else known.state.config, event)
        if problem is not None:
            self._invalid(rec, batch, "invalid", problem)
            return
        dep = self._deployment(event.deployment, rec.partition)
        state = dep.state
        batch.events[rec.topic] += 1
        if kind == "fpm":
            batch.fpms += 1
        elif kind == "fpm_batch":
            batch.fpms += len(event.fpms)
        self.watermarks.observe(rec.topic, rec.partition, event.deployment, event.time, rec.received_at)

        if rec.offset >= dep.awaiting.get(rec.topic, rec.offset + 1):
            del dep.awaiting[rec.topic]  # read up to the last record buffered before the crash
        position = dep.positions.get(rec.topic, -1)
        if rec.offset <= position and state.last_tick is not None and event.time < state.last_tick:
            batch.release.append(rec.handle)  # folded (or dead-lettered) before the last save
            return
        next_tick, rollbacks = state.next_tick, dep.ahead.rollbacks
        accepted = offer(state, event, dep.ahead, raw=rec.value)
        batch.rollbacks += dep.ahead.rollbacks - rollbacks
        if rec.offset > position:
            dep.positions[rec.topic] = rec.offset
        if not accepted:
            dep.dirty = True  # the core counted it
            batch.release.append(rec.handle)
            # a late heartbeat too: the audit folds every input it is not told was refused, and
            # a heartbeat dated before the first tick would date the audit's first tick earlier
            batch.late[dep.name] += 1
            dep.outbox.append(self._late_letter(rec, event, state.last_tick))
            return
        dep.held.append((event.time, rec.handle, rec.topic, rec.offset))
        if state.next_tick != next_tick or rec.topic not in self.watermarks.sources:
            # a record of a topic that does not move the clock (a control, an ack, an
            # inventory event) is saved as awaited (``stored``): after a crash the clock
            # topics' backlog can come back first and would fire its tick without it
            dep.dirty = True
        if kind in ("request", "arrival"):  # the mirror counts demand by arrival once the core does
            batch.mirror.append(MirrorAdd(dep.name, rec.partition, rec.offset, event))

    def _fold_ahead(self, now: float) -> None:
        """Apply what the watermark has passed, firing no tick: invisible in the outputs
        (ticks still fire once per batch, after every record of it was offered)."""
        for partition, names in self.by_partition.items():
            for name in names:
                dep = self.deployments[name]
                state = dep.state
                if state.next_tick is None or dep.awaiting:
                    continue
                clock, _ = self.watermarks.time(partition, name, now)
                if clock is not None:
                    fold_ahead.fold(self.planner, state, dep.ahead, clock_watermark(clock)(state))

    def _fire(self, now: float, batch: RoutedBatch) -> None:
        for partition, names in self.by_partition.items():
            for name in sorted(names):
                dep = self.deployments[name]
                state = dep.state
                if state.next_tick is None or dep.awaiting:
                    continue
                clock, advanced_at = self.watermarks.time(partition, name, now)
                if clock is None:
                    continue
                marks: dict[float, float] = {}

                def watermark(state, clock=clock, marks=marks) -> float:
                    # asked before each tick (and before a silence it skips, and once more at the
                    # end): the last asked at a tick's time is the one that tick fired under
                    mark = clock_watermark(clock)(state)
                    marks[state.next_tick] = mark
                    return mark

                before = state.last_tick
                reports = advance(self.planner, state, watermark, dep.ahead, max_ticks=MAX_TICKS_PER_BATCH)
                if not reports and state.last_tick == before:
                    continue  # at most events folded ahead: nothing to save or release yet
                for report in reports:
                    batch.ticks.append(self._tick_outputs(dep, report, clock, marks[report.time], advanced_at))
                self._snapshot(dep, before, batch)
                dep.dirty = True
                last = state.last_tick
                keep = []
                for held in dep.held:
                    (batch.release.append(held[1]) if held[0] < last else keep.append(held))
                dep.held = keep

    def _snapshot(self, dep: LiveDeployment, before: float | None, batch: RoutedBatch) -> None:
        """Write the state the last tick left, once its ticks cross a multiple of ``snapshot_every``.

        The state as it is saved (``settled_data``: nothing folded ahead of the tick), so
        folding the inputs from the tick on gives the decisions after it, as a restart
        does. A copy: the outbox is sent after more of the batch is folded.
        """
        every, last = self.snapshot_every, dep.state.last_tick
        if not every or before is None or last is None or math.floor(before / every) == math.floor(last / every):
            return
        raw = orjson.dumps(settled_data(dep.state, dep.ahead))
        if len(raw) > SNAPSHOT_MAX_BYTES:
            batch.snapshots_skipped += 1
            return
        dep.outbox.append(Output(TICKS, dep.name, snapshot_record(dep.name, last, orjson.loads(raw))))

    def _tick_outputs(self, dep: LiveDeployment, report: TickReport, clock: float,
                      watermark: float, advanced_at: float | None) -> TickOutcome:
        diag = report.to_dict()
        diag["clock"] = clock
        diag["watermark"] = watermark
        diag_out = Output(TICKS, dep.name, diag)
        dep.outbox.append(diag_out)
        if report.decision is not None:
            dep.outbox.append(Output(canonical.DECISIONS, dep.name, event_to_dict(report.decision)))
        return TickOutcome(dep, report, diag_out, advanced_at)

    def _late_letter(self, rec: InputRecord, event, last_tick: float) -> Output:
        letter = DeadLetter(
            deployment=event.deployment, time=event.time, reason="late",
            detail=late_detail(event.time, last_tick, rec.topic, rec.partition, rec.offset),
            source_topic=rec.topic, payload=_payload(rec.value),
        )
        return Output(canonical.DEADLETTER, event.deployment, event_to_dict(letter))

    def _invalid(self, rec: InputRecord, batch: RoutedBatch, reason: str, detail: str) -> None:
        key = "unknown"
        if rec.key:
            key = rec.key.decode("utf-8", "replace")[:256] or "unknown"
        letter = DeadLetter(
            deployment=key, time=max(self.clock(), 0.0), reason=reason,
            detail=f"{detail} [at {rec.topic}:{rec.partition}:{rec.offset}]",
            source_topic=rec.topic, payload=_payload(rec.value),
        )
        batch.invalid.append(Output(canonical.DEADLETTER, key, event_to_dict(letter)))
        batch.dead[reason] += 1
        batch.release.append(rec.handle)

    def saved(self, batch: RoutedBatch) -> list[tuple[LiveDeployment, bytes]]:
        """Encode the dirty deployments and mark them clean; their outbox is what to send next."""
        out = []
        for dep in batch.saves:
            out.append((dep, dep.stored().to_bytes()))
            dep.dirty = False
        return out

    def sent(self, batch: RoutedBatch) -> None:
        """The outputs of ``batch`` are durable: start the next outboxes empty."""
        for dep in batch.saves:
            dep.outbox = []


def _payload(raw: bytes) -> str:
    return raw[:PAYLOAD_LIMIT].decode("utf-8", "replace")
