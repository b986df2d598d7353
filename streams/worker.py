"""``fleetplan worker``: the Faust agent that carries events to the core and decisions out.

One agent reads every input topic in batches (``take_events``) and hands
each batch to the :class:`~fleetplan.streams.router.Router`. What the
router returns is written in an order that makes a ``kill -9`` at any
point recoverable without gaps or repeats:

1. dirty deployment states (with their outbox of decisions, late-event
   dead letters and tick diagnostics) to the ``deployments`` table;
2. flush: the states are durable;
3. send the outbox records; flush: they are durable;
4. acknowledge the records that are settled, so Faust may commit them.

Records whose events wait for a future tick keep an extra reference and are
acknowledged only once a saved tick has folded them, so a restarted worker
reads them again from the committed offset. On every (re)assignment the
router is rebuilt from the table: Faust seeks back to the committed offsets
then, so in-memory buffers would otherwise see those records twice.
"""

from __future__ import annotations

import asyncio
import logging
import time

import faust
import orjson

from fleetplan.models.planner import Planner
from fleetplan.schemas import topics as canonical
from fleetplan.streams.app import WorkerSettings
from fleetplan.streams.kafka_io import read_partitions
from fleetplan.streams.metrics import WorkerMetrics
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
        self.router = Router(planner, self.watermarks, load=self._load)
        self.owned: set[int] = set()
        self._lock = asyncio.Lock()
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
        self.traffic = TrafficMirror(app, self._partition_of, interval_s=interval,
                                     partitions=settings.partitions, expires_s=4 * interval)
        self.states.on_recover(self._on_recovered)
        app.on_partitions_revoked.connect(self._on_revoked)
        self.source = app.topic(
            *self.topics.inputs, key_type=bytes, value_type=bytes,
            key_serializer="raw", value_serializer="raw", partitions=settings.partitions,
        )
        app.agent(self.source, name="fleetplan.route")(self._agent)

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
        generation = self.app.consumer_generation_id
        records: list[InputRecord] = []
        last_offsets: dict[tuple[str, int], int] = {}
        for event in events:
            message = event.message
            if message.partition not in self.owned or getattr(message, "generation_id", generation) != generation:
                continue  # from before the last rebalance: Faust reads it again
            message.incref()  # released (acked) by us once settled; see the module docstring
            received = getattr(message, "time_in", None) or started
            records.append(InputRecord(
                self.topics.logical(message.topic), message.partition, message.offset,
                event.key, event.value, received, event,
            ))
            last_offsets[(message.topic, message.partition)] = message.offset
        log.debug("batch of %d events, %d routed (generation %s, owned %s)",
                  len(events), len(records), generation, sorted(self.owned))
        if not records:
            return
        batch = self.router.route(records, time.monotonic())
        self._mirror(batch)
        await self._persist(batch)
        for handle in batch.release:
            if handle is not None:
                handle.ack()
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
                self.traffic.add(deployment, start, delta)
        for tick in batch.ticks:
            report, dep = tick.report, tick.deployment
            if report.observed is None:
                continue
            interval = dep.state.config.throughput_adjustment_interval_seconds
            previous, dep.last_throughput_tick = dep.last_throughput_tick, report.time
            if interval != self.traffic.interval_s or previous != report.time - interval:
                continue  # a first or resized window: not comparable
            sums = self.traffic.get(dep.name, report.time - interval)
            wrong = sums.mismatch(report.observed.__dict__)
            tick.diagnostics.value["traffic_mirror"] = {"window_start": report.time - interval,
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
        for dep, raw in saves:
            self.states[dep.name.encode()] = raw
        if saves:
            await producer.flush()
        await self._send(outputs, {d.name: d.partition for d, _ in saves})
        self.router.sent(batch)
        done = time.monotonic()
        for tick in batch.ticks:
            if tick.watermark_at is not None:
                latency = max(done - tick.watermark_at, 0.0)
                self.metrics.tick_latency.observe(latency)
                if tick.report.decision is not None:
                    self.metrics.decision_latency.observe(latency)

    async def _send(self, outputs: list[Output], partitions: dict[str, int]) -> None:
        if not outputs:
            return
        producer = self.app.producer
        for out in outputs:
            # A deployment's outputs go to its own partition; unattributable dead letters anywhere.
            await producer.send(self._output_names[out.topic], out.key.encode(), orjson.dumps(out.value),
                                partitions.get(out.key), None, None)
        await producer.flush()

    def _observe(self, batch: RoutedBatch, last_offsets: dict, started: float) -> None:
        m = self.metrics
        for topic, n in batch.events.items():
            m.events.labels(topic).inc(n)
        if batch.fpms:
            m.fpms.inc(batch.fpms)
        for dep, n in batch.late.items():
            m.late.labels(dep).inc(n)
            m.deadletters.labels("late").inc(n)
        for reason, n in batch.dead.items():
            m.deadletters.labels(reason).inc(n)
        for tick in batch.ticks:
            m.observe_tick(tick.report, tick.deployment.state)
        for (topic, partition), offset in last_offsets.items():
            try:
                high = self.app.consumer.highwater(faust.types.TP(topic, partition))
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
            self.router.drop_partitions(gone)
            if gone:
                log.info("revoked partitions %s", sorted(gone))

    async def _on_recovered(self) -> None:
        """Rebuild the router from the table for the partitions now owned, re-send outboxes."""
        async with self._lock:
            owned = {tp.partition for tp in self.app.consumer.assignment() if tp.topic in self._input_names}
            self.router.drop_partitions(list(self.router.by_partition))
            self.owned = owned
            self.watermarks.assign(owned, time.monotonic())
            pending = []
            for key, raw in list(self.states.items()):
                if not raw:
                    continue
                stored = StoredDeployment.from_bytes(raw)
                if stored.partition not in owned:
                    continue
                name = key.decode() if isinstance(key, bytes) else key
                dep = self.router.adopt(name, stored)
                if dep.outbox:
                    pending.append(dep)
            log.info("owning partitions %s with %d deployments", sorted(owned), len(self.router.deployments))
            if pending:
                await self._resend(pending)

    async def _resend(self, deployments) -> None:
        """Send recovered outboxes, skipping decisions the topic already holds."""
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
        for dep in deployments:
            for out in dep.outbox:
                if out.topic == canonical.DECISIONS and (dep.name, out.value["decision_id"]) in recorded:
                    continue
                outputs.append(out)
            dep.outbox = []
        log.info("re-sending %d outbox records of %d deployments", len(outputs), len(deployments))
        await self._send(outputs, {d.name: d.partition for d in deployments})


def run_worker(settings: WorkerSettings) -> None:
    """Create the topics, build the planner and app, and run until SIGTERM/SIGINT."""
    from faust import Worker

    from fleetplan.bootstrap import build_planner
    from fleetplan.streams.app import create_app
    from fleetplan.streams.topics import changelog_specs, ensure_topics, event_log_specs

    planner = build_planner(settings.config, settings.profile)
    interval = planner.config.throughput_adjustment_interval_seconds
    specs = event_log_specs(settings.topics, settings.partitions) + changelog_specs(
        settings.app_id, settings.partitions, traffic_retention_ms=int(8 * interval * 1000),
    )
    asyncio.run(ensure_topics(settings.bootstrap, specs, replication=settings.replication))
    asyncio.set_event_loop(asyncio.new_event_loop())
    app = create_app(settings)
    worker = PlannerWorker(app, planner, settings)
    if settings.metrics_port is not None:
        worker.metrics.serve(settings.metrics_port, settings.metrics_host)
    Worker(app, loglevel=settings.loglevel, quiet=True, redirect_stdouts=False).execute_from_commandline()
