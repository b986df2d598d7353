"""The connector service: decisions in, applied at most once, acks out.

It consumes ``fleetplan.decisions.v1`` with manual commits, hands each
decision to a per-deployment *lane* (so one slow deployment never holds up
another), applies it through the ledger and produces an :class:`Ack` keyed
by deployment. A partition's offset is committed only up to its oldest
record not yet done, so a crash redelivers, and the ledger makes the
redelivery harmless.

Order of one decision: ledger claim -> backend apply -> ledger outcome ->
ack on the topic -> ledger "acked" -> offset commit. A kill between any two
steps is recovered from the ledger on redelivery; at worst an identical ack
is sent twice (the planner ignores an ack for a decision no longer pending).

Before each decision a lane looks at what is queued behind it: if a newer
non-advisory decision of the same deployment is already waiting, this one
is skipped and acked ``superseded``. Advisory decisions are never applied
and never acked (the planner does not wait for them).

Records that are not decisions are dead-lettered with the reason and never
stop the service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from pydantic import ValidationError
from redis.exceptions import RedisError

from fleetplan.connectors.base import (
    TOPIC_POLL_S,
    Applier,
    ApplyFailed,
    ConnectorConfigError,
    HandOver,
    Superseded,
    ack_error,
    topic_exists,
    wait_for_topic,
)
from fleetplan.connectors.ledger import Entry, Ledger, Outcome
from fleetplan.connectors.metrics import ConnectorMetrics
from fleetplan.schemas import topics
from fleetplan.schemas.codec import SchemaError, decode_event, encode_event
from fleetplan.schemas.events import MAX_NAME_LENGTH, ROLES, Ack, DeadLetter, Decision

log = logging.getLogger("fleetplan.connector")

CRASH_ENV = "FLEETPLAN_CONNECTOR_CRASH_AT"
"""Test hook: SIGKILL this process at a named step (see CRASH_POINTS)."""

CRASH_POINTS = ("after_claim", "after_apply", "after_record", "after_ack")


@dataclass
class ServiceSettings:
    bootstrap: str
    group_id: str = "fleetplan-connector"
    instance_id: str | None = None
    """Kafka static membership: a restarted connector gets its partitions back at once."""
    deployments: frozenset[str] | None = None
    """Only these deployments; None means every deployment on the topic."""
    decisions_topic: str = topics.DECISIONS
    acks_topic: str = topics.ACKS
    deadletter_topic: str = topics.DEADLETTER
    session_timeout_ms: int = 10_000
    max_inflight: int = 1000
    commit_interval_s: float = 0.2
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 10.0
    stop_grace_s: float = 10.0
    topic_poll_s: float = TOPIC_POLL_S
    """Seconds between two looks for a decision topic that does not exist yet."""
    metrics_port: int | None = None
    crash_at: str | None = field(default_factory=lambda: os.environ.get(CRASH_ENV) or None)


class _PartitionOffsets:
    """Which records of one partition are still in flight; what may be committed."""

    def __init__(self) -> None:
        self.inflight: set[int] = set()
        self.next: int | None = None
        self.committed: int | None = None
        self.revoked = False

    def add(self, offset: int) -> None:
        self.inflight.add(offset)
        self.next = offset + 1

    def done(self, offset: int) -> None:
        self.inflight.discard(offset)

    def committable(self) -> int | None:
        return min(self.inflight) if self.inflight else self.next


@dataclass
class _Ticket:
    """One record's place in its partition; ``done`` lets the offset advance."""

    offsets: _PartitionOffsets
    offset: int
    service: ConnectorService

    def done(self) -> None:
        self.offsets.done(self.offset)
        self.service._record_done()


class _Lane:
    """The queue and task of one deployment."""

    def __init__(self) -> None:
        self.queue: deque[tuple[Decision, _Ticket]] = deque()
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.idle = asyncio.Event()
        self.idle.set()
        self.current: _Ticket | None = None  # the record being handled, while ``idle`` is clear

    def drop(self, partitions: list[_PartitionOffsets]) -> int:
        """Forget the queued records of revoked partitions; their new owner gets them again."""
        kept = deque(item for item in self.queue if not any(item[1].offsets is p for p in partitions))
        dropped = len(self.queue) - len(kept)
        self.queue = kept
        return dropped


LEASE_MARGIN = 0.9
"""Share of the lease a connector applies on without a renewal that held: Redis's clock, which
times the lease, started it a little before this connector's did."""


class _ClaimBusy(Exception):
    """Another connector holds a live claim on this decision: ask the ledger again later."""


class _ClaimLost(_ClaimBusy):
    """This connector's claim ran out mid-apply: another took the decision over, or may have."""


class ConnectorService:
    """Runs one applier against the decision topic (see the module docstring)."""

    def __init__(self, applier: Applier, ledger: Ledger, settings: ServiceSettings,
                 metrics: ConnectorMetrics | None = None) -> None:
        self.applier = applier
        self.ledger = ledger
        self.settings = settings
        self.metrics = metrics or ConnectorMetrics(applier.backend)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._offsets: dict[TopicPartition, _PartitionOffsets] = {}
        self._lanes: dict[str, _Lane] = {}
        self._ignored: set[str] = set()  # deployments whose decisions were skipped (warned once)
        self._begun: set[tuple[str, int]] = set()  # decisions this run began applying, outcome not stored
        # decisions whose ack this run sent and has not yet marked in the ledger: a retry after
        # a failed mark only marks it (the ack is on the topic; sending it again counted it twice)
        self._ack_sent: set[tuple[str, int]] = set()
        self._inflight = 0
        self._rebalances = 0  # partitions revoked so far (a fetched batch is stale after one)
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._lane_failure: BaseException | None = None  # what ended a lane, raised by run()
        self.assigned = asyncio.Event()
        """Set once the consumer has partitions: the service is live."""

    # --- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Validate the backend, then connect; raises before consuming on any setup error.

        The decision topic is subscribed to once it exists (``wait_for_topic``):
        until the worker or the bridge has created it, the start waits.
        """
        s = self.settings
        if s.crash_at is not None and s.crash_at not in CRASH_POINTS:
            raise ConnectorConfigError(CRASH_ENV, f"must be one of {', '.join(CRASH_POINTS)}")
        try:
            await self.applier.start()
        except BaseException:
            await self.applier.stop()  # what it opened before failing (a Redis pool, an API client)
            raise
        try:
            self._producer = AIOKafkaProducer(
                bootstrap_servers=s.bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
            )
            await self._producer.start()
            await wait_for_topic(s.decisions_topic, lambda: topic_exists(s.bootstrap, s.decisions_topic),
                                 log, poll_s=s.topic_poll_s)
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=s.bootstrap, group_id=s.group_id,
                group_instance_id=s.instance_id, enable_auto_commit=False,
                auto_offset_reset="earliest", session_timeout_ms=s.session_timeout_ms,
                heartbeat_interval_ms=max(500, s.session_timeout_ms // 6),
                isolation_level="read_committed",
            )
            self._consumer.subscribe([s.decisions_topic], listener=HandOver(self._on_revoked, log))
            await self._consumer.start()
            if s.metrics_port is not None:
                self.metrics.serve(s.metrics_port)
        except BaseException:
            await self._close_clients()
            raise
        log.info("connector started: backend %s, topic %s, group %s",
                 self.applier.describe(), s.decisions_topic, s.group_id)

    async def run(self) -> None:
        """Consume until :meth:`stop`; start it first."""
        self._tasks.append(asyncio.create_task(self._commit_loop(), name="connector-commit"))
        try:
            await self._fetch_loop()
        finally:
            await self._shutdown()
        if self._lane_failure is not None:
            raise self._lane_failure

    def stop(self) -> None:
        self._stopping.set()

    async def _shutdown(self) -> None:
        lanes = [lane.task for lane in self._lanes.values() if lane.task is not None]
        # Let in-flight applies finish; a cut-off one is settled by recover() next time.
        await self._let_finish([lane for lane in self._lanes.values() if not lane.idle.is_set()])
        for task in lanes + self._tasks:
            task.cancel()
        await asyncio.gather(*lanes, *self._tasks, return_exceptions=True)
        try:
            await self._commit()
        except KafkaError as err:  # the next run redelivers; the ledger makes that harmless
            log.warning("final commit failed: %s", err)
        await self._close_clients()
        log.info("connector stopped")

    async def _let_finish(self, lanes: list[_Lane]) -> None:
        """Wait up to ``stop_grace_s`` for these lanes to finish the decision they are handling."""
        busy = [asyncio.ensure_future(lane.idle.wait()) for lane in lanes]
        if busy:
            await asyncio.wait(busy, timeout=self.settings.stop_grace_s)
            for waiter in busy:
                waiter.cancel()

    async def _close_clients(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        await self.applier.stop()

    # --- consuming ------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self._stopping.is_set():
            if self._inflight >= self.settings.max_inflight:
                self._capacity.clear()
                stop = asyncio.ensure_future(self._stopping.wait())
                room = asyncio.ensure_future(self._capacity.wait())
                await asyncio.wait([stop, room], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                room.cancel()
                continue
            try:
                batch = await consumer.getmany(timeout_ms=200, max_records=500)
            except KafkaError as err:
                self.metrics.errors.labels("kafka").inc()
                log.warning("fetch failed: %s", err)
                await asyncio.sleep(self.settings.retry_backoff_s)
                continue
            if consumer.assignment():
                self.assigned.set()
            rebalances = self._rebalances
            for tp, records in batch.items():
                for record in records:
                    if self._rebalances != rebalances:
                        # revoked while an earlier record was dead-lettered: the rest of the batch
                        # is the new owner's, from the committed offset (this consumer's too, if
                        # it got the partition back), and no offsets of it may be kept here
                        break
                    offsets = self._offsets.setdefault(tp, _PartitionOffsets())
                    offsets.add(record.offset)
                    self._inflight += 1
                    self.metrics.inflight.set(self._inflight)
                    await self._route(record, _Ticket(offsets, record.offset, self))
            self._update_lag(consumer)

    async def _route(self, record, ticket: _Ticket) -> None:
        decision = await self._parse(record)
        if decision is None:
            ticket.done()
            return
        wanted = self.settings.deployments
        if wanted is not None and decision.deployment not in wanted:
            self.metrics.outcome("ignored")
            if decision.deployment not in self._ignored:
                # its offset is committed: a connector serving it in this consumer group never
                # sees this partition's records, so the decision is lost to it
                self._ignored.add(decision.deployment)
                log.warning(
                    "decisions of %s are skipped (not one of --deployment) and committed; a connector "
                    "that serves %s must use its own --group-id", decision.deployment, decision.deployment,
                )
            ticket.done()
            return
        lane = self._lanes.get(decision.deployment)
        if lane is None:
            lane = self._lanes[decision.deployment] = _Lane()
            lane.task = asyncio.create_task(
                self._run_lane(decision.deployment, lane), name=f"lane-{decision.deployment}"
            )
            lane.task.add_done_callback(self._lane_ended)
        lane.queue.append((decision, ticket))
        lane.wakeup.set()

    async def _parse(self, record) -> Decision | None:
        value: bytes = record.value or b""
        try:
            event = decode_event(value)
        except SchemaError as err:
            await self._dead_letter(record, "oversize" if err.oversize else "invalid", str(err))
            return None
        if not isinstance(event, Decision):
            await self._dead_letter(record, "invalid", f"type: a decision, got {event.type}")
            return None
        return event

    async def _dead_letter(self, record, reason: str, detail: str) -> None:
        self.metrics.deadlettered.labels(reason).inc()
        key = (record.key or b"").decode("utf-8", "replace")
        deployment = key if 0 < len(key) <= MAX_NAME_LENGTH else "unknown"
        log.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition,
                    record.offset, detail)
        letter = DeadLetter(
            deployment=deployment, time=time.time(), reason=reason, detail=detail[:2000],
            source_topic=record.topic,
            payload=(record.value or b"")[:4096].decode("utf-8", "replace"),
        )
        delay = self.settings.retry_backoff_s
        while True:
            try:
                await self._produce(self.settings.deadletter_topic, deployment, encode_event(letter))
                return
            except KafkaError as err:
                self.metrics.errors.labels("kafka").inc()
                log.warning("dead-lettering failed: %s; retrying in %.1f s", err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_backoff_max_s)

    # --- one deployment's lane ------------------------------------------------------------

    def _lane_ended(self, task: asyncio.Task) -> None:
        """A lane that raised stops the connector, which :meth:`run` then raises.

        A lane only ends by being cancelled at shutdown: what it retries
        (Redis, Kafka, a busy claim) it retries, and anything else is a
        defect. Ended silently, it left its deployment's decisions unacked
        and held its partition's commit for good. Stopped, the process exits
        non-zero, its orchestrator restarts it, and the uncommitted decision
        is read again; the ledger makes that safe.
        """
        if task.cancelled() or task.exception() is None:
            return
        if self._lane_failure is None:
            self._lane_failure = task.exception()
        log.error("%s: its lane failed (%r); stopping the connector", task.get_name(), task.exception())
        self._stopping.set()

    async def _run_lane(self, deployment: str, lane: _Lane) -> None:
        while True:
            await lane.wakeup.wait()
            lane.wakeup.clear()
            while lane.queue and not self._stopping.is_set():
                decision, ticket = lane.queue.popleft()
                newer = max(
                    (d.decision_id for d, _ in lane.queue
                     if not d.advisory and d.decision_id > decision.decision_id),
                    default=None,
                )
                lane.idle.clear()
                lane.current = ticket
                try:
                    await self._handle_retrying(decision, newer)
                    ticket.done()
                finally:
                    lane.current = None
                    lane.idle.set()

    async def _handle_retrying(self, decision: Decision, newer: int | None) -> None:
        """Handle one decision; infrastructure errors are retried (the ledger makes it safe)."""
        delay = self.settings.retry_backoff_s
        while True:
            try:
                await self._handle(decision, newer)
                return
            except (RedisError, OSError) as err:
                self.metrics.errors.labels("redis").inc()
                problem = f"Redis: {err}"
            except KafkaError as err:
                self.metrics.errors.labels("kafka").inc()
                problem = f"Kafka: {err}"
            except _ClaimBusy as err:
                self.metrics.errors.labels("claim_busy").inc()
                problem = str(err)
            log.warning("%s decision %d: %s; retrying in %.1f s", decision.deployment,
                        decision.decision_id, problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.retry_backoff_max_s)

    async def _handle(self, decision: Decision, newer: int | None) -> None:
        if decision.advisory:
            log.info("%s decision %d is advisory: not applied, targets %s",
                     decision.deployment, decision.decision_id, decision.targets)
            self.metrics.outcome("advisory")
            return
        entry: Entry
        if newer is not None:
            entry = await self.ledger.supersede(decision, newer)
        else:
            entry = await self.ledger.begin(decision)
        if entry.verdict == "busy":
            raise _ClaimBusy("another connector is applying it (a live claim in the ledger)")
        key = (decision.deployment, decision.decision_id)
        if entry.verdict in ("apply", "recover", "reclaim"):
            self._crash_point("after_claim")
            # reclaim: this run's own claim, asked again after a Redis error; recovering is only
            # needed if this run had begun applying it
            recover = entry.verdict == "recover" or (entry.verdict == "reclaim" and key in self._begun)
            self._begun.add(key)  # until its outcome is stored: a retry after that recovers
            outcome = await self._apply_leased(decision, recover=recover)
            self._crash_point("after_apply")
            outcome = await self.ledger.record(decision, outcome)
            self._begun.discard(key)
            self._crash_point("after_record")
            acked = False
        else:
            assert entry.outcome is not None
            outcome, acked = entry.outcome, entry.acked
        if acked:
            self.metrics.outcome("duplicate")
            log.info("%s decision %d already acked (%s); skipped", decision.deployment,
                     decision.decision_id, outcome.status)
            return
        if key not in self._ack_sent:
            await self._send_ack(decision, outcome)
            self._ack_sent.add(key)
        self._crash_point("after_ack")
        await self.ledger.mark_acked(decision)
        self._ack_sent.discard(key)

    async def _apply_leased(self, decision: Decision, *, recover: bool) -> Outcome:
        """Apply while renewing the claim's lease, so a slow rollout is not taken for a dead run.

        A renewal that finds the claim gone (Redis was out of reach past the
        lease and another connector took the decision over) stops the apply:
        going on would change the deployment beside the new holder. The
        decision is then asked about again, and the ledger says ``busy`` or
        gives the new holder's outcome.
        """
        applying = asyncio.create_task(self._apply(decision, recover=recover),
                                       name=f"apply-{decision.deployment}")
        renewing = asyncio.create_task(self._renew_lease(decision), name=f"lease-{decision.deployment}")
        try:
            await asyncio.wait({applying, renewing}, return_when=asyncio.FIRST_COMPLETED)
            if applying.done():
                return applying.result()
            renewing.result()  # it ends only by raising _ClaimLost
            raise AssertionError("the lease renewal ended without losing the claim")
        finally:
            for task in (applying, renewing):
                task.cancel()
            await asyncio.gather(applying, renewing, return_exceptions=True)

    async def _renew_lease(self, decision: Decision) -> None:
        """Renew every third of the lease; give the claim up when no renewal got through within it.

        A renewal that fails (Redis out of reach) is tried again at the next
        third, but once ``LEASE_MARGIN`` of the lease has passed since the
        last one that held, another connector may already have taken the
        decision over, and applying on would change the deployment beside
        it. Each renewal is bounded by that deadline too: a Redis that
        stopped answering (a black-holed connection raises nothing) hung the
        renewal, and the apply went on past the lease, for good.
        """
        lease = self.ledger.lease_s
        held_at = time.monotonic()  # the claim was taken just before the apply began
        while True:
            await asyncio.sleep(lease / 3)
            attempt = time.monotonic()
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can drop the cancellation that
                # ends this task as the renewal completes (pyproject.toml's note on redis-py 8), and
                # the apply's clean-up would then wait on a renewal loop that never ends
                async with asyncio.timeout(max(0.0, held_at + LEASE_MARGIN * lease - attempt)):
                    held = await self.ledger.renew(decision)
            except (RedisError, OSError) as err:  # TimeoutError is an OSError
                self.metrics.errors.labels("redis").inc()
                problem = str(err) or "no answer"
                if time.monotonic() >= held_at + LEASE_MARGIN * lease:
                    raise _ClaimLost(f"no renewal of the claim on decision {decision.decision_id} got through "
                                     f"within its {lease:g}-s lease ({problem}): another connector may hold "
                                     "it; applying it stopped") from None
                log.warning("%s decision %d: lease renewal failed: %s", decision.deployment,
                            decision.decision_id, problem)
                continue
            if not held:
                raise _ClaimLost(f"the claim on decision {decision.decision_id} was taken over; "
                                 f"applying it stopped")
            held_at = attempt


    async def _apply(self, decision: Decision, *, recover: bool) -> Outcome:
        started = time.monotonic()
        verb = "recovering" if recover else "applying"
        log.info("%s %s decision %d: %s", verb, decision.deployment, decision.decision_id,
                 decision.targets)
        try:
            if recover:
                observed = await self.applier.recover(decision)
            else:
                observed = await self.applier.apply(decision)
            outcome = Outcome("applied", _role_counts(decision, observed))
        except Superseded as err:
            outcome = Outcome("superseded", {}, str(err))
        except ApplyFailed as err:
            outcome = Outcome("failed", {}, str(err))
        except (asyncio.CancelledError, RedisError):
            # Redis is the ledger (and the virtual backend): retried from the claim, whose
            # recover() does not apply twice.
            raise
        except Exception as err:  # a backend bug must not kill the lane; never re-applied
            log.exception("backend error on %s decision %d", decision.deployment,
                          decision.decision_id)
            outcome = Outcome("failed", {}, f"{type(err).__name__}: {err}")
        self.metrics.apply_seconds.observe(time.monotonic() - started)
        if outcome.status == "applied":
            for role, count in decision.targets.items():
                self.metrics.target.labels(decision.deployment, role).set(count)
            for role, count in outcome.observed.items():
                self.metrics.observed.labels(decision.deployment, role).set(count)
        return outcome

    async def _send_ack(self, decision: Decision, outcome: Outcome) -> None:
        fields = dict(
            deployment=decision.deployment, time=max(time.time(), decision.time),
            decision_id=decision.decision_id, status=outcome.status, error=ack_error(outcome.error),
        )
        try:
            ack = Ack(observed=outcome.observed, **fields)
        except ValidationError as err:
            ack = Ack(**{**fields, "error": f"{outcome.error or ''} (observed dropped: {err})"})
        await self._produce(self.settings.acks_topic, decision.deployment, encode_event(ack))
        self.metrics.outcome(outcome.status)
        self.metrics.acked(decision.deployment, decision.decision_id)
        self.metrics.ack_latency.observe(max(0.0, time.time() - decision.time))
        log.info("acked %s decision %d: %s%s", decision.deployment, decision.decision_id,
                 outcome.status, f" ({outcome.error})" if outcome.error else "")

    async def _produce(self, topic: str, key: str, value: bytes) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(topic, value, key=key.encode())

    def _crash_point(self, name: str) -> None:
        if self.settings.crash_at == name:
            log.critical("crash point %s: killing the connector", name)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    # --- offsets ----------------------------------------------------------------------

    def _record_done(self) -> None:
        self._inflight -= 1
        self.metrics.inflight.set(self._inflight)
        if self._inflight < self.settings.max_inflight:
            self._capacity.set()

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.commit_interval_s)
            try:
                await self._commit()
            except KafkaError as err:
                self.metrics.errors.labels("kafka").inc()
                log.warning("commit failed: %s", err)

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        if self._consumer is None:
            return
        due = {}
        for tp, offsets in self._offsets.items():
            if offsets.revoked or (only is not None and tp not in only):
                continue
            nxt = offsets.committable()
            if nxt is not None and nxt != offsets.committed:
                due[tp] = (nxt, offsets)
        if not due:
            return
        await self._consumer.commit({tp: OffsetAndMetadata(n, "") for tp, (n, _) in due.items()})
        for n, offsets in due.values():
            offsets.committed = n

    async def _on_revoked(self, revoked) -> None:
        """Hand the partitions over: drop their queued records, let the one being applied finish.

        The new owner gets every record past the committed offset again, so
        nothing queued here may still be applied here, and the commit must not
        pass it. A decision mid-apply is given up to ``stop_grace_s`` to finish
        (the rebalance waits for this callback); one still running after that
        stays uncommitted, and the ledger's live claim makes its new owner wait
        for its outcome instead of taking it for a dead run.
        """
        self._rebalances += 1
        partitions = [self._offsets[tp] for tp in revoked if tp in self._offsets]
        for lane in self._lanes.values():
            for _ in range(lane.drop(partitions)):
                self._record_done()  # not done in its partition: the commit stops before it
        await self._let_finish([lane for lane in self._lanes.values()
                                if lane.current is not None and any(lane.current.offsets is p for p in partitions)])
        try:
            await self._commit(set(revoked))
        except KafkaError as err:
            log.warning("commit on revoke failed: %s", err)
        for tp in revoked:
            offsets = self._offsets.pop(tp, None)
            if offsets is not None:
                offsets.revoked = True

    def _update_lag(self, consumer: AIOKafkaConsumer) -> None:
        for tp, offsets in self._offsets.items():
            high = consumer.highwater(tp)
            done = offsets.committable()
            if high is not None and done is not None:
                self.metrics.lag.labels(str(tp.partition)).set(max(0, high - done))


def _role_counts(decision: Decision, observed) -> dict[str, int]:
    """The observed counts an ack carries: those of roles; any other name is said, then dropped."""
    others = sorted(str(k) for k in observed if k not in ROLES)
    if others:
        log.warning("%s decision %d: observed %s not a role (%s): left out of the ack", decision.deployment,
                    decision.decision_id, ", ".join(others), ", ".join(ROLES))
    return {k: int(v) for k, v in observed.items() if k in ROLES}
