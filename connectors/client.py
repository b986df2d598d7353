"""The orchestrator client: the other side of the connector, for your own orchestrator.

The same two calls work over Redis and over Kafka::

    async with RedisOrchestratorClient(redis_url) as client:   # or KafkaOrchestratorClient
        async for decision in client.decisions("my-deployment"):
            observed = await my_fleet.scale_to(decision.targets)
            await client.complete(decision, "applied", observed=observed)

- **Redis** (:class:`RedisOrchestratorClient`) pairs with ``fleetplan connector
  --backend virtual``: the connector keeps the ledger, writes the desired
  state and turns your completion into the ack on Kafka. Use it when your
  orchestrator cannot speak Kafka.
- **Kafka** (:class:`KafkaOrchestratorClient`) makes your orchestrator the
  connector: it reads ``fleetplan.decisions.v1`` and writes acks to
  ``fleetplan.acks.v1`` itself. Do not also run ``fleetplan connector`` for
  the same deployments.

Both yield only decisions that are still due: advisory decisions are never
yielded, and a decision with a newer one already behind it is completed as
``superseded`` for you. A decision is yielded again after a restart until
it is completed (at least once); targets are absolute counts, so applying
one twice lands on the same fleet size.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from fleetplan.connectors.base import HandOver, ack_error, topic_exists, wait_for_topic
from fleetplan.connectors.virtual import (
    COMPLETE_SCRIPT,
    DEFAULT_PREFIX,
    VirtualKeys,
    last_stream_id,
)
from fleetplan.options import topic_name_problem
from fleetplan.schemas import topics
from fleetplan.schemas.codec import SchemaError, decode_event, encode_event
from fleetplan.schemas.events import Ack, AckStatus, Decision

log = logging.getLogger("fleetplan.orchestrator")


class OrchestratorClient(abc.ABC):
    """``decisions(deployment)`` to receive, ``complete(decision, status)`` to answer."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @abc.abstractmethod
    def decisions(self, deployment: str) -> AsyncIterator[Decision]:
        """Decisions to act on, in order, forever. One that already has a newer one
        waiting behind it is not yielded (it is completed ``superseded``)."""

    @abc.abstractmethod
    async def complete(
        self, decision: Decision, status: AckStatus = "applied", *,
        observed: Mapping[str, int] | None = None, error: str | None = None,
    ) -> bool:
        """Answer a decision. Returns False if it was no longer current (nothing written)."""


def _observed(decision: Decision, status: str, observed: Mapping[str, int] | None) -> dict:
    if observed is not None:
        return {str(k): v for k, v in observed.items()}  # the ack's schema checks the counts, naming each
    return dict(decision.targets) if status == "applied" else {}


def _ack(decision: Decision, status: str, observed: Mapping[str, int] | None, error: str | None) -> Ack:
    """The ack of an answer; raises ``ValueError`` naming the field the ack schema refuses.

    Both clients build it before anything is written, so an answer that
    cannot become an ack leaves the decision current, over Kafka and over
    Redis alike. Over Redis the connector would read such an answer back as
    ``failed`` (a status it does not know) or drop its counts (roles it
    does not know), after the orchestrator had moved the fleet.
    """
    return Ack(
        deployment=decision.deployment, time=max(time.time(), decision.time),
        decision_id=decision.decision_id, status=status,
        observed=_observed(decision, status, observed), error=ack_error(error),
    )


# --- Redis -------------------------------------------------------------------------

class RedisOrchestratorClient(OrchestratorClient):
    """The client of the virtual backend (keys in :mod:`fleetplan.connectors.virtual`)."""

    def __init__(self, redis_url: str | None = None, *, client: aioredis.Redis | None = None,
                 prefix: str = DEFAULT_PREFIX, poll_s: float = 1.0) -> None:
        if client is None and redis_url is None:
            raise ValueError("give redis_url or client")
        self._own = client is None
        self._redis = client if client is not None else aioredis.from_url(redis_url)
        self._prefix = prefix
        self._poll_ms = max(1, int(poll_s * 1000))
        self._complete = self._redis.register_script(COMPLETE_SCRIPT)

    async def stop(self) -> None:
        if self._own:
            await self._redis.aclose()

    async def decisions(self, deployment: str) -> AsyncIterator[Decision]:
        keys = VirtualKeys.of(deployment, self._prefix)
        after = await last_stream_id(self._redis, keys.desired)
        yielded = -1
        while True:
            raw, current, scaled = await self._redis.hmget(
                keys.state, ["decision", "decision_id", "scaled_decision_id"]
            )
            due = -1 if current is None else int(current)
            done = -1 if scaled is None else int(scaled)
            if raw is not None and due > max(done, yielded):
                yielded = due
                try:
                    decision = decode_event(raw)
                except SchemaError as err:
                    log.error("unreadable desired state for %s: %s", deployment, err)
                else:
                    if isinstance(decision, Decision):
                        yield decision
                continue
            got = await self._redis.xread({keys.desired: after}, block=self._poll_ms, count=100)
            if got:
                after = got[0][1][-1][0]

    async def complete(
        self, decision: Decision, status: AckStatus = "applied", *,
        observed: Mapping[str, int] | None = None, error: str | None = None,
    ) -> bool:
        ack = _ack(decision, status, observed, error)
        keys = VirtualKeys.of(decision.deployment, self._prefix)
        written = await self._complete(
            keys=[keys.state, keys.completed],
            args=[decision.decision_id, ack.status, orjson.dumps(ack.observed), ack.error or "",
                  f"{time.time():.3f}"],
        )
        return bool(written)


# --- Kafka ----------------------------------------------------------------------------


def _check_kafka_names(*, decisions_topic: str, acks_topic: str, group_id: str, session_timeout_ms: int) -> None:
    """Refuse, at construction, what Kafka would refuse only later: a topic it
    cannot name is waited for without end (decisions) or fails the first ack
    after the decision was applied (acks); an empty group fails at the join."""
    for name, topic in (("decisions_topic", decisions_topic), ("acks_topic", acks_topic)):
        problem = topic_name_problem(topic)
        if problem is not None:
            raise ValueError(f"{name}: {problem}")
    if not group_id:
        raise ValueError("group_id: must not be empty")
    if not session_timeout_ms > 0:
        raise ValueError(f"session_timeout_ms: must be > 0, got {session_timeout_ms}")


class KafkaOrchestratorClient(OrchestratorClient):
    """Reads decisions and writes acks on Kafka directly (the orchestrator is the connector).

    ``deployments`` are the ones this orchestrator manages; records of other
    deployments are skipped. Offsets are committed when a decision is
    completed, so an orchestrator that dies before completing sees the
    decision again.

    A rebalance hands partitions to another instance of the group. Their
    decisions still queued here are dropped (the new owner gets them again
    from the committed offset; applying them here too could land after a
    newer one there), and their offsets are forgotten (aiokafka refuses a
    commit naming a partition this consumer no longer holds). A decision
    already yielded can still be completed: its ack is sent, its offset is
    left to the new owner.
    """

    def __init__(
        self, bootstrap: str, deployments: Iterable[str], *,
        group_id: str = "fleetplan-orchestrator", instance_id: str | None = None,
        decisions_topic: str = topics.DECISIONS, acks_topic: str = topics.ACKS,
        session_timeout_ms: int = 10_000,
    ) -> None:
        self._deployments = frozenset(deployments)
        if not self._deployments:
            raise ValueError("deployments: name at least one")
        _check_kafka_names(decisions_topic=decisions_topic, acks_topic=acks_topic, group_id=group_id,
                           session_timeout_ms=session_timeout_ms)
        self._bootstrap = bootstrap
        self._group_id = group_id
        self._instance_id = instance_id
        self._decisions_topic = decisions_topic
        self._acks_topic = acks_topic
        self._session_timeout_ms = session_timeout_ms
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._queues: dict[str, asyncio.Queue[Decision]] = {d: asyncio.Queue() for d in self._deployments}
        self._pending: dict[tuple[str, int], tuple[TopicPartition, int]] = {}
        self._handed: set[tuple[str, int]] = set()  # yielded, not yet completed
        self._inflight: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._answered: dict[str, int] = {}  # deployment -> highest decision_id completed here
        self._fetch_task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect; the decision topic is subscribed to once it exists (``wait_for_topic``)."""
        try:
            self._producer = AIOKafkaProducer(
                bootstrap_servers=self._bootstrap, acks="all", enable_idempotence=True
            )
            await self._producer.start()
            await wait_for_topic(self._decisions_topic,
                                 lambda: topic_exists(self._bootstrap, self._decisions_topic), log)
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self._bootstrap, group_id=self._group_id,
                group_instance_id=self._instance_id, enable_auto_commit=False,
                auto_offset_reset="earliest", session_timeout_ms=self._session_timeout_ms,
                heartbeat_interval_ms=max(500, self._session_timeout_ms // 6),
            )
            self._consumer.subscribe([self._decisions_topic], listener=HandOver(self._on_revoked, log))
            await self._consumer.start()
        except BaseException:
            await self.stop()
            raise
        self._fetch_task = asyncio.create_task(self._fetch(), name="orchestrator-fetch")

    async def stop(self) -> None:
        if self._fetch_task is not None:
            self._fetch_task.cancel()
            await asyncio.gather(self._fetch_task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()

    async def decisions(self, deployment: str) -> AsyncIterator[Decision]:
        if deployment not in self._queues:
            raise ValueError(f"deployment {deployment!r} is not one of this client's deployments")
        queue = self._queues[deployment]
        while True:
            waiting = self._due([await queue.get(), *_drain(queue)])
            if not waiting:
                continue
            latest = waiting[max(waiting)]
            for decision_id, stale in waiting.items():
                if decision_id < latest.decision_id:  # something newer is already here
                    try:
                        await self.complete(stale, "superseded",
                                            error=f"decision {latest.decision_id} supersedes it")
                    except BaseException:
                        # still pending: queued again with the rest, so the next call
                        # supersedes it again instead of leaving its offset uncommitted
                        for decision in waiting.values():
                            queue.put_nowait(decision)
                        raise
            self._handed.add((deployment, latest.decision_id))
            yield latest

    def _due(self, queued: list[Decision]) -> dict[int, Decision]:
        """The queued decisions still to answer, one per id.

        A record redelivered after a rebalance is queued a second time with
        the same id; it is the same decision, not a newer one. A decision no
        longer pending was answered already, or its partition went to another
        instance.
        """
        return {d.decision_id: d for d in queued
                if (d.deployment, d.decision_id) in self._pending}

    async def complete(
        self, decision: Decision, status: AckStatus = "applied", *,
        observed: Mapping[str, int] | None = None, error: str | None = None,
    ) -> bool:
        assert self._producer is not None and self._consumer is not None
        key = (decision.deployment, decision.decision_id)
        if key not in self._pending:
            return False
        # Built and sent before the decision stops being pending: a bad ``observed`` or a
        # Kafka error raises to the caller with the decision still pending, so calling
        # again sends the ack (a duplicate ack is harmless, a lost one holds the commit).
        ack = _ack(decision, status, observed, error)
        await self._producer.send_and_wait(
            self._acks_topic, encode_event(ack), key=decision.deployment.encode()
        )
        self._handed.discard(key)
        self._answered[decision.deployment] = max(self._answered.get(decision.deployment, -1),
                                                  decision.decision_id)
        place = self._pending.pop(key, None)
        if place is None:
            return True  # a concurrent call for the same decision got there first
        tp, offset = place
        self._mark_done(tp, offset)
        try:
            await self._commit()
        except KafkaError as err:  # the ack is out; the next commit covers this offset
            log.warning("commit failed: %s", err)
        return True

    async def _fetch(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                batch = await consumer.getmany(timeout_ms=500, max_records=500)
            except KafkaError as err:
                log.warning("fetching decisions failed: %s; retrying", err)
                await asyncio.sleep(1.0)
                continue
            for tp, records in batch.items():
                for record in records:
                    self._inflight.setdefault(tp, set()).add(record.offset)
                    self._next[tp] = record.offset + 1
                    decision = self._parse(record)
                    if decision is None or decision.advisory or self._known(decision, tp, record.offset):
                        self._mark_done(tp, record.offset)
                        continue
                    self._pending[(decision.deployment, decision.decision_id)] = (tp, record.offset)
                    self._queues[decision.deployment].put_nowait(decision)
            if batch:
                try:
                    await self._commit()
                except KafkaError as err:
                    log.warning("commit failed: %s", err)

    def _known(self, decision: Decision, tp: TopicPartition, offset: int) -> bool:
        """Whether another record already brought this decision: answered here, or pending.

        A decision can be recorded twice on its topic (the worker re-sends
        an outbox it cannot find on the topic). The copy is the same
        decision: it is done with its first record, and its own offset is
        done at once. Queued as pending, it replaced the first record's
        offset, which then stayed open and held the partition's commit for
        good (every restart yielded the decision again); arriving after the
        first was completed, it was yielded again, and the orchestrator
        went back to an answered decision's targets. One older than a
        decision answered here is past as well. The same record delivered
        again (a rebalance) is not a copy: it stands for its decision.
        """
        if decision.decision_id <= self._answered.get(decision.deployment, -1):
            return True
        place = self._pending.get((decision.deployment, decision.decision_id))
        return place is not None and place != (tp, offset)

    def _parse(self, record) -> Decision | None:
        try:
            event = decode_event(record.value or b"")
        except SchemaError as err:
            log.warning("skipping unreadable decision record at offset %d: %s", record.offset, err)
            return None
        if not isinstance(event, Decision) or event.deployment not in self._deployments:
            return None
        return event

    def _mark_done(self, tp: TopicPartition, offset: int) -> None:
        self._inflight.get(tp, set()).discard(offset)

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit each assigned partition up to its oldest decision not yet completed.

        Only assigned ones: aiokafka refuses the whole commit if it names a
        partition this consumer does not hold.
        """
        async with self._lock:
            assert self._consumer is not None
            assigned = self._consumer.assignment()
            due = {}
            for tp, nxt in self._next.items():
                if tp not in assigned or (only is not None and tp not in only):
                    continue
                inflight = self._inflight.get(tp)
                upto = min(inflight) if inflight else nxt
                if self._committed.get(tp) != upto:
                    due[tp] = upto
            if due:
                await self._consumer.commit({tp: OffsetAndMetadata(n, "") for tp, n in due.items()})
                self._committed.update(due)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Hand the partitions over, as the connector service does: commit, then forget them.

        Called by aiokafka while they are still assigned, so what is done on
        them is committed; queued decisions of theirs are dropped (see the
        class docstring).
        """
        try:
            await self._commit(revoked)
        except KafkaError as err:  # the new owner redelivers from the last commit
            log.warning("commit on revoke failed: %s", err)
        self._forget(revoked)

    def _forget(self, revoked: set[TopicPartition]) -> None:
        """Drop the offsets of revoked partitions and their decisions not yet yielded."""
        for tp in revoked:
            self._next.pop(tp, None)
            self._inflight.pop(tp, None)
            self._committed.pop(tp, None)
        for key, (tp, _) in list(self._pending.items()):
            if tp in revoked and key not in self._handed:
                del self._pending[key]  # decisions() skips its queued copy


def _drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
