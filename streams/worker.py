"""``fleetplan worker``: the Faust agent that carries events to the core and decisions out.

One agent reads every input topic in batches (``take_events``) and hands
each batch to the :class:`~fleetplan.streams.router.Router`. What the
router returns is written in an order that makes a ``kill -9`` at any
point recoverable without gaps or repeats:

1. dirty deployment states (with their outbox of decisions, late-event
   dead letters and tick diagnostics) to the ``deployments`` table;
2. flush: the states are durable;
3. send the outbox records; flush: they are durable;
4. mark the records the router settled; their partitions' resume offsets
   (:mod:`fleetplan.streams.positions`) move past them and are committed.

Records whose events wait for a future tick are not settled, so the
resume offset stays at or before them and a restarted worker reads them
again. The worker commits those resume offsets itself (Faust's own commit,
which assumes "read" means "done", is replaced) and seeks to them after
every assignment, rebuilding the router from the table: in-memory buffers
would otherwise see the re-read records twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import time
import weakref

import faust
import orjson
from faust.streams import _current_event
from faust.types import TP

from fleetplan.models.planner import Planner
from fleetplan.schemas import topics as canonical
from fleetplan.streams.app import WorkerSettings
from fleetplan.streams.gc_settings import tune_gc
from fleetplan.streams.kafka_io import read_partitions
from fleetplan.streams.metrics import WorkerMetrics
from fleetplan.streams.positions import InputPositions
from fleetplan.streams.router import InputRecord, RoutedBatch, Router
from fleetplan.streams.tables import (
    Output,
    StoredDeployment,
    TrafficMirror,
    TrafficSums,
    routed_table,
)
from fleetplan.streams.topics import CLOCKED, STATE_TABLE, TICKS, partition_for
from fleetplan.streams.watermark import Watermarks

log = logging.getLogger("fleetplan.worker")

OUTBOX_READBACK = 5000
"""Decisions read back per partition to de-duplicate a recovered outbox.

An outbox holds the outputs of one batch, sent right before a crash, so
they are among the last records of their partition."""


class PlannerWorker:
    """Wires the router to a Faust app: the agent, the tables, recovery and metrics."""

    def __init__(self, app: faust.App, planner: Planner, settings: WorkerSettings,
                 metrics: WorkerMetrics | None = None) -> None:
        self.app = app
        self.planner = planner
        self.settings = settings
        self.topics = settings.topics
        self.metrics = metrics or WorkerMetrics()
        self.watermarks = Watermarks(CLOCKED, settings.idle_after_s)
        self.router = Router(planner, self.watermarks, load=self._load, partitions=settings.partitions,
                             snapshot_every=settings.snapshot_every_s)
        self.owned: set[int] = set()
        self.positions = InputPositions()
        self._committed: dict[tuple[str, int], int] = {}
        self._jumps = 0
        self._partition_event: dict[int, object] = {}
        self._lock = asyncio.Lock()
        # The stored state (a digest of its bytes) of each deployment whose outbox this
        # process has delivered: a rebalance that hands back that same state need not send
        # it again. By content, not by name: another worker may have owned the deployment
        # in between and stored a new outbox it did not live to send.
        self._delivered: dict[str, bytes] = {}
        self._input_names = set(self.topics.inputs)
        self._output_names = {
            canonical.DECISIONS: self.topics.decisions,
            canonical.DEADLETTER: self.topics.deadletter,
            TICKS: self.topics.ticks,
        }

        self.states = routed_table(
            app, STATE_TABLE, self._partition_of, partitions=settings.partitions,
            key_type=bytes, value_type=bytes,  # raw serializers: the value is StoredDeployment bytes
            help="per-deployment planner state (DeploymentState.to_data without its buffer)",
        )
        interval = planner.config.throughput_adjustment_interval_seconds
        self.traffic = TrafficMirror(app, self._partition_of, interval_s=interval, partitions=settings.partitions)
        self.states.on_recover(self._on_recovered)
        app.on_partitions_revoked.connect(self._on_revoked)
        # Faust's ack-based commit would commit offsets of records waiting for a tick
        # (and of records it skipped during a rebalance): commit resume offsets instead.
        app.consumer.commit = self._commit_positions
        self.source = app.topic(
            *self.topics.inputs, key_type=bytes, value_type=bytes,
            key_serializer="raw", value_serializer="raw", partitions=settings.partitions,
        )
        app.agent(self.source, name="fleetplan.route")(self._agent)
        app.timer(1.0)(self._reseek_blocked)

    # --- partition routing of table writes ----------------------------------

    def _partition_of(self, deployment: str) -> int:
        owned = self.router.partition_of(deployment)
        return owned if owned is not None else partition_for(deployment, self.settings.partitions)

    def _load(self, name: str) -> StoredDeployment | None:
        raw = self.states.get(name.encode())
        return StoredDeployment.from_bytes(raw) if raw else None

    # --- the agent -------------------------------------------------------------

    async def _agent(self, stream) -> None:
        async for events in stream.take_events(self.settings.batch_max, self.settings.batch_within_s):
            async with self._lock:
                await self._handle(events)

    async def _handle(self, events) -> None:
        started = time.monotonic()
        records: list[InputRecord] = []
        last_offsets: dict[tuple[str, int], int] = {}
        for event in events:
            message = event.message
            # Never acknowledged: Faust's commit is replaced (see the module docstring),
            # and an acknowledgement would only grow its bookkeeping.
            message.incref()
            tp = (message.topic, message.partition)
            if message.partition not in self.owned or not self.positions.accept(tp, message.offset, started):
                continue  # read before the last seek, or twice around it: it comes again in order
            self._partition_event[message.partition] = event
            received = getattr(message, "time_in", None) or started
            records.append(InputRecord(
                self.topics.logical(message.topic), message.partition, message.offset,
                event.key, event.value, received, (message.topic, message.partition, message.offset),
            ))
            last_offsets[tp] = message.offset
        if not records:
            return
        if self.positions.jumps != self._jumps:
            log.warning("skipped a gap in an input partition's offsets (%d so far): transactional "
                        "producers or retention overtaking this worker", self.positions.jumps)
            self._jumps = self.positions.jumps
        batch = self.router.route(records, time.monotonic())
        self._mirror(batch)
        await self._persist(batch)
        for topic, partition, offset in batch.release:
            self.positions.settle((topic, partition), offset)
        self._observe(batch, last_offsets, started)

    def _mirror(self, batch: RoutedBatch) -> None:
        """Fold new requests into the windowed traffic table, then check closed windows."""
        grouped: dict[tuple[str, float], list] = {}
        for add in batch.mirror:
            start = self.traffic.window_start(add.event.time)
            grouped.setdefault((add.deployment, start), []).append(add)
        for (deployment, start), adds in grouped.items():
            current = self.traffic.get(deployment, start)
            delta = TrafficSums(upto=current.upto)
            for add in adds:
                if add.offset > current.upto:
                    delta.add(add.event)
                    delta.upto = max(delta.upto, add.offset)
            if delta.upto > current.upto:
                with self._writing_for(adds[0].partition):
                    self.traffic.add(deployment, start, delta)
        for tick in batch.ticks:
            report, dep = tick.report, tick.deployment
            if report.observed is None:
                continue
            interval = dep.state.config.throughput_adjustment_interval_seconds
            previous, dep.last_throughput_tick = dep.last_throughput_tick, report.time
            if interval == self.traffic.interval_s and previous == report.time - interval:
                self._check_mirror(tick, report.time - interval)  # else a first or resized window
            with self._writing_for(dep.partition):
                self.traffic.close(dep.name, report.time)  # complete: later records are late

    def _check_mirror(self, tick, window_start: float) -> None:
        """Compare the mirror's window with the observation the core's tick used."""
        report, dep = tick.report, tick.deployment
        sums = self.traffic.get(dep.name, window_start)
        wrong = sums.mismatch(report.observed.__dict__, by_arrival=dep.state.seen_arrivals)
        tick.diagnostics.value["traffic_mirror"] = {"window_start": window_start,
                                                    "count": sums.count, "mismatch": wrong}
        self.metrics.mirror_checks.labels(dep.name).inc()
        if wrong:
            self.metrics.mirror_mismatches.labels(dep.name, wrong).inc()
            log.warning("traffic mirror of %s differs from the core's window at %s: %s",
                        dep.name, report.time, wrong)

    async def _persist(self, batch: RoutedBatch) -> None:
        saves = self.router.saved(batch)
        outputs = batch.outputs()
        if not saves and not outputs:
            return
        producer = self.app.producer
        with _changelog_writes(producer.buffer) as written:
            for dep, raw in saves:
                with self._writing_for(dep.partition):
                    self.states[dep.name.encode()] = raw
                self._delivered.pop(dep.name, None)
        if written:
            await _durable(producer, written)
        await self._send(outputs, {d.name: d.partition for d, _ in saves})
        self.router.sent(batch)
        self._delivered.update((d.name, _digest(raw)) for d, raw in saves)
        done = time.monotonic()
        for tick in batch.ticks:
            if tick.watermark_at is not None:
                latency = max(done - tick.watermark_at, 0.0)
                self.metrics.tick_latency.observe(latency)
                if tick.report.decision is not None:
                    self.metrics.decision_latency.observe(latency)

    @contextlib.contextmanager
    def _writing_for(self, partition: int):
        """Make an event of ``partition`` Faust's current event while writing a table.

        The changelog partition comes from ``partition_for_key``, but Faust's
        RocksDB store files a key under the current event's partition; in a
        batch of many partitions that must be the deployment's own.
        """
        event = self._partition_event.get(partition)
        token = _current_event.set(None if event is None else weakref.ref(event))
        try:
            yield
        finally:
            _current_event.reset(token)

    async def _send(self, outputs: list[Output], partitions: dict[str, int]) -> None:
        if not outputs:
            return
        producer = self.app.producer
        sent = []
        for out in outputs:
            # A deployment's outputs go to its own partition; unattributable dead letters anywhere.
            sent.append(await producer.send(self._output_names[out.topic], out.key.encode(),
                                            orjson.dumps(out.value), partitions.get(out.key), None, None))
        # the offsets these outputs came from settle next, and the outbox is cleared at the
        # next save: an output the broker refused must stop the worker, not be dropped
        await _durable(producer, sent, what="outputs (decisions, diagnostics, dead letters)")

    def _observe(self, batch: RoutedBatch, last_offsets: dict, started: float) -> None:
        m = self.metrics
        for topic, n in batch.events.items():
            m.events.labels(topic).inc(n)
        if batch.fpms:
            m.fpms.inc(batch.fpms)
        if batch.rollbacks:
            m.fold_rollbacks.inc(batch.rollbacks)
        if batch.snapshots_skipped:
            m.snapshots_skipped.inc(batch.snapshots_skipped)
        for dep, n in batch.late.items():
            m.late.labels(dep).inc(n)
            m.deadletters.labels("late").inc(n)
        for reason, n in batch.dead.items():
            m.deadletters.labels(reason).inc(n)
        for tick in batch.ticks:
            m.observe_tick(tick.report, tick.deployment.state)
        for (topic, partition), offset in last_offsets.items():
            try:
                high = self.app.consumer.highwater(TP(topic, partition))
            except Exception:  # noqa: BLE001 - lag is best effort while rebalancing
                continue
            if high is not None:
                m.lag.labels(self.topics.logical(topic), str(partition)).set(max(high - offset - 1, 0))
        for tick in batch.ticks:
            m.event_clock.labels(tick.deployment.name).set(tick.diagnostics.value["clock"])
        m.batch_seconds.observe(time.monotonic() - started)

    # --- rebalancing and recovery -------------------------------------------------

    async def _on_revoked(self, sender, revoked, **kwargs) -> None:
        """Finish the batch in progress, then stop writing for the revoked partitions.

        Faust calls this before the group rebalances, so the next owner of a
        partition recovers a changelog this worker no longer writes to.
        """
        async with self._lock:
            gone = {tp.partition for tp in revoked if tp.topic in self._input_names}
            self.owned -= gone
            self.metrics.forget([n for p in gone for n in self.router.by_partition.get(p, ())], gone)
            self.router.drop_partitions(gone)
            self.positions.forget(gone)
            for p in gone:
                self._partition_event.pop(p, None)
            if gone:
                log.info("revoked partitions %s", sorted(gone))

    async def _on_recovered(self) -> None:
        """Rebuild the router from the table for the partitions now owned, seek to the
        resume offsets, re-send outboxes."""
        async with self._lock:
            consumer = self.app.consumer
            owned = {tp.partition for tp in consumer.assignment() if tp.topic in self._input_names}
            self.router.drop_partitions(list(self.router.by_partition))
            self.positions.forget(set(self.positions_partitions()))
            self.owned = owned
            self.watermarks.assign(owned, time.monotonic())
            self.traffic.reindex()  # the recovered table may hold windows this process did not write
            pending = []
            for key, raw in list(self.states.items()):
                if not raw:
                    continue
                stored = StoredDeployment.from_bytes(raw)
                if stored.partition not in owned:
                    continue
                name = key.decode() if isinstance(key, bytes) else key
                dep = self.router.adopt(name, stored)
                if self._delivered.get(name) == _digest(raw):
                    dep.outbox = []
                elif dep.outbox:
                    pending.append((dep, _digest(raw)))
            await self._seek_to_resume(owned)
            log.info("owning partitions %s with %d deployments", sorted(owned), len(self.router.deployments))
            if pending:
                await self._resend(pending)

    def positions_partitions(self) -> set[int]:
        return {p for _, p in self.positions.partitions}

    async def _seek_to_resume(self, owned: set[int]) -> None:
        """Read every owned input partition again from its committed resume offset.

        ``seek_wait`` runs in the consumer's own thread: a plain ``seek`` from
        this thread can race the fetcher and be lost.
        """
        consumer = self.app.consumer
        tps = [TP(t, p) for t in sorted(self._input_names) for p in sorted(owned)]
        if not tps:
            return
        committed = await consumer.seek_to_committed()
        earliest = await consumer.earliest_offsets(*tps)
        for p in owned:
            self.router.inputs_start_at(p, {self.topics.logical(tp.topic): earliest.get(tp) or 0
                                            for tp in tps if tp.partition == p})
        resume = {}
        for tp in tps:
            offset = committed.get(tp)
            resume[tp] = max(offset if offset is not None and offset >= 0 else 0, earliest.get(tp) or 0)
            self.positions.reset((tp.topic, tp.partition), resume[tp])
            self._committed[(tp.topic, tp.partition)] = resume[tp]
        await consumer.seek_wait(resume)

    async def _reseek_blocked(self) -> None:
        """Seek again where a partition waits for an offset that a stale batch undid."""
        async with self._lock:
            due = self.positions.due_for_reseek(time.monotonic())
            if due:
                log.info("seeking again to %s", {f"{t}[{p}]": o for (t, p), o in due.items()})
                await self.app.consumer.seek_wait({TP(t, p): o for (t, p), o in due.items()})

    async def _commit_positions(self, topics=None, start_new_transaction: bool = True) -> bool:
        """Commit the resume offsets that moved (replaces Faust's ack-based commit)."""
        offsets = {}
        for (topic, partition), pos in list(self.positions.partitions.items()):
            resume = pos.resume
            if partition in self.owned and self._committed.get((topic, partition)) != resume:
                offsets[TP(topic, partition)] = resume
        if not offsets:
            return False
        try:
            done = await self.app.consumer._commit(offsets)
        except Exception as err:  # noqa: BLE001 - a failed commit only means more replay
            # (what reaches here: Faust's _commit itself stops the worker on a commit error
            # aiokafka does not retry, and aiokafka retries a retriable one, such as a
            # coordinator lost to a broker restart, until it succeeds)
            log.warning("committing resume offsets failed: %s", err)
            return False
        if done:
            self._committed.update({(tp.topic, tp.partition): o for tp, o in offsets.items()})
        return bool(done)

    async def _resend(self, recovered) -> None:
        """Send recovered outboxes ((deployment, digest of its stored state) pairs), skipping
        decisions the topic already holds."""
        deployments = [dep for dep, _ in recovered]
        parts = {(self.topics.decisions, d.partition) for d in deployments
                 if any(o.topic == canonical.DECISIONS for o in d.outbox)}
        recorded: set[tuple[str, int]] = set()
        if parts:
            slices = await read_partitions(self.settings.bootstrap, parts, tail=OUTBOX_READBACK)
            for records in slices.values():
                for r in records:
                    try:
                        value = orjson.loads(r.value)
                        recorded.add((value["deployment"], value["decision_id"]))
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        continue
        outputs: list[Output] = []
        for dep, digest in recovered:
            for out in dep.outbox:
                if out.topic == canonical.DECISIONS and (dep.name, out.value["decision_id"]) in recorded:
                    continue
                outputs.append(out)
            dep.outbox = []
            self._delivered[dep.name] = digest
        log.info("re-sending %d outbox records of %d deployments", len(outputs), len(deployments))
        await self._send(outputs, {d.name: d.partition for d in deployments})


@contextlib.contextmanager
def _changelog_writes(buffer):
    """Collect the changelog messages that table writes put in Faust's producer buffer.

    Faust's ``flush`` does not wait for them: ``ProducerBuffer.flush_atmost``
    gives up when a message takes more than 0.1 s to hand over, and leaves the
    rest in the buffer. Step 2 of the module docstring needs each one
    acknowledged by the broker before the outputs go out and the offsets move.
    """
    written: list = []
    put = buffer.put

    def capture(fut) -> None:
        written.append(fut)
        put(fut)

    buffer.put = capture
    try:
        yield written
    finally:
        del buffer.put  # the class's own again


DURABLE_TIMEOUT_S = 120.0
"""How long the states may take to be acknowledged. aiokafka retries a send for its own
delivery timeout and then fails its future; this bounds the wait if a future is never settled
at all, so a stuck producer stops the worker (to be restarted and recover) instead of hanging it."""


async def _durable(producer, written: list, timeout_s: float = DURABLE_TIMEOUT_S,
                   what: str = "state writes to the changelog") -> None:
    """Wait until every collected message is on the broker (or raise its error)."""
    await producer.flush()
    if not written:
        return
    _, pending = await asyncio.wait(written, timeout=timeout_s)
    if pending:
        raise RuntimeError(
            f"{len(pending)} of {len(written)} {what} not acknowledged within "
            f"{timeout_s:g} s; stopping so a restart recovers from the changelog"
        )
    for fut in written:
        fut.result()  # a write the broker refused raises its error here


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def run_worker(settings: WorkerSettings) -> None:
    """Create the topics, build the planner and app, and run until SIGTERM/SIGINT."""
    from faust import Worker

    from fleetplan.bootstrap import build_planner
    from fleetplan.streams.app import create_app
    from fleetplan.streams.topics import (
        changelog_specs,
        check_session_timeout,
        ensure_topics,
        event_log_specs,
    )

    planner = build_planner(settings.config, settings.profile)
    interval = planner.config.throughput_adjustment_interval_seconds
    specs = event_log_specs(settings.topics, settings.partitions) + changelog_specs(
        settings.app_id, settings.partitions, traffic_retention_ms=int(8 * interval * 1000),
    )
    asyncio.run(check_session_timeout(settings.bootstrap, settings.session_timeout_s))
    asyncio.run(ensure_topics(settings.bootstrap, specs, replication=settings.replication))
    asyncio.set_event_loop(asyncio.new_event_loop())
    app = create_app(settings)
    if settings.store.startswith("rocksdb:"):
        # A kill -9 can leave local RocksDB ahead of the changelog (written, never
        # flushed); the runtime's guarantees rest on the changelog, so rebuild from it.
        shutil.rmtree(app.conf.tabledir, ignore_errors=True)
    worker = PlannerWorker(app, planner, settings)
    if settings.metrics_port is not None:
        worker.metrics.serve(settings.metrics_port, settings.metrics_host)
    tune_gc()
    Worker(app, loglevel=settings.loglevel, quiet=True, redirect_stdouts=False).execute_from_commandline()
