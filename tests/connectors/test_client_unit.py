"""KafkaOrchestratorClient against in-process fakes of aiokafka: no broker.

The fakes keep the two behaviours of aiokafka the client depends on: a
commit naming a partition that is not assigned is refused as a whole
(``IllegalStateError``), and on a rebalance the listener hears of the
revoked partitions while they are still assigned (eager protocol: all of
them).
"""

from __future__ import annotations

import asyncio
import functools
from types import SimpleNamespace

import pytest
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaConnectionError
from aiokafka.structs import TopicPartition
from pydantic import ValidationError

from fleetplan.connectors import client as client_module
from fleetplan.connectors.client import KafkaOrchestratorClient
from fleetplan.schemas import topics
from fleetplan.schemas.codec import decode_event, encode_event
from tests.connectors.conftest import make_decision

P0 = TopicPartition(topics.DECISIONS, 0)
P1 = TopicPartition(topics.DECISIONS, 1)


class FakeConsumer:
    """Hands out the records given to :meth:`deliver`; records commits."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self.batches: list[dict] = []
        self.commits: list[dict[TopicPartition, int]] = []
        self.failing_commits = 0
        self.listener = None

    def deliver(self, tp: TopicPartition, offset: int, decision) -> None:
        record = SimpleNamespace(offset=offset, value=encode_event(decision), key=b"")
        self.batches.append({tp: [record]})

    def subscribe(self, topics, listener) -> None:
        self.listener = listener

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def getmany(self, timeout_ms=0, max_records=0) -> dict:
        if self.batches:
            return self.batches.pop(0)
        await asyncio.sleep(0.01)
        return {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets) -> None:
        for tp in offsets:
            if tp not in self.assigned:
                raise IllegalStateError(f"Partition {tp} is not assigned")
        if self.failing_commits:
            self.failing_commits -= 1
            raise CommitFailedError("rebalance in progress")
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})

    async def rebalance(self, keep: set[TopicPartition]) -> None:
        await self.listener.on_partitions_revoked(set(self.assigned))
        self.assigned = set(keep)
        await self.listener.on_partitions_assigned(set(keep))


class FakeProducer:
    def __init__(self) -> None:
        self.acks = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send_and_wait(self, topic, value, key=None) -> None:
        self.acks.append(decode_event(value))


@pytest.fixture
def consumer() -> FakeConsumer:
    return FakeConsumer({P0, P1})


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


async def _exists(*_) -> bool:
    return True


@pytest.fixture
async def client(monkeypatch, consumer, producer):
    monkeypatch.setattr(client_module, "AIOKafkaConsumer", lambda *_, **__: consumer)
    monkeypatch.setattr(client_module, "AIOKafkaProducer", lambda *_, **__: producer)
    monkeypatch.setattr(client_module, "topic_exists", _exists)
    async with KafkaOrchestratorClient("unused:1", ["llama", "mistral"]) as started:
        yield started


def acks(producer: FakeProducer) -> list[tuple[str, int, str]]:
    return [(a.deployment, a.decision_id, a.status) for a in producer.acks]


async def next_of(decisions, timeout_s: float = 1.0):
    return await asyncio.wait_for(decisions.__anext__(), timeout_s)


async def settle() -> None:
    """Let the fetch task take what was delivered."""
    await asyncio.sleep(0.05)


async def test_redelivered_decision_is_acked_applied_once(client, consumer, producer):
    consumer.deliver(P0, 7, make_decision("llama", 5))
    consumer.deliver(P0, 7, make_decision("llama", 5))  # again, after a rebalance
    await settle()

    decision = await next_of(client.decisions("llama"))
    assert await client.complete(decision, "applied")

    assert acks(producer) == [("llama", 5, "applied")]
    assert consumer.commits[-1] == {P0: 8}


async def test_an_ack_that_could_not_be_sent_is_sent_when_completed_again(client, consumer, producer):
    """A Kafka error or a bad ``observed`` leaves the decision pending, so a retry acks it."""
    consumer.deliver(P0, 7, make_decision("llama", 5))
    await settle()
    decision = await next_of(client.decisions("llama"))

    with pytest.raises(ValidationError, match="observed"):
        await client.complete(decision, "applied", observed={"decode": -1})
    real_send = producer.send_and_wait

    async def broker_down(*_, **__):
        raise KafkaConnectionError("broker down")

    producer.send_and_wait = broker_down
    with pytest.raises(KafkaConnectionError):
        await client.complete(decision, "applied", observed={"decode": 3})
    assert acks(producer) == [] and all(c[P0] <= 7 for c in consumer.commits)  # not past it

    producer.send_and_wait = real_send
    assert await client.complete(decision, "applied", observed={"decode": 3})
    assert acks(producer) == [("llama", 5, "applied")]
    assert consumer.commits[-1] == {P0: 8}
    assert not await client.complete(decision, "applied")  # answered: no longer current


async def test_a_superseded_ack_that_could_not_be_sent_is_sent_on_the_next_call(client, consumer, producer):
    consumer.deliver(P0, 6, make_decision("llama", 4))
    consumer.deliver(P0, 7, make_decision("llama", 5))
    await settle()
    real_send = producer.send_and_wait

    async def broker_down(*_, **__):
        raise KafkaConnectionError("broker down")

    producer.send_and_wait = broker_down
    with pytest.raises(KafkaConnectionError):
        await next_of(client.decisions("llama"))
    producer.send_and_wait = real_send
    decision = await next_of(client.decisions("llama"))
    assert decision.decision_id == 5 and await client.complete(decision, "applied")
    assert acks(producer) == [("llama", 4, "superseded"), ("llama", 5, "applied")]
    assert consumer.commits[-1] == {P0: 8}


async def test_older_decisions_are_still_superseded(client, consumer, producer):
    consumer.deliver(P0, 6, make_decision("llama", 4))
    consumer.deliver(P0, 7, make_decision("llama", 5))
    consumer.deliver(P0, 7, make_decision("llama", 5))
    await settle()

    decision = await next_of(client.decisions("llama"))
    assert decision.decision_id == 5
    assert await client.complete(decision, "applied")

    assert acks(producer) == [("llama", 4, "superseded"), ("llama", 5, "applied")]
    assert producer.acks[0].error == "decision 5 supersedes it"


async def test_copy_redelivered_while_in_hand_is_not_yielded_again(client, consumer, producer):
    decisions = client.decisions("llama")
    consumer.deliver(P0, 7, make_decision("llama", 5))
    first = await next_of(decisions)
    consumer.deliver(P0, 7, make_decision("llama", 5))
    await settle()
    assert await client.complete(first, "applied")

    consumer.deliver(P0, 8, make_decision("llama", 6))
    assert (await next_of(decisions)).decision_id == 6
    assert acks(producer) == [("llama", 5, "applied")]


async def test_decision_of_a_revoked_partition_completes_without_committing_it(
        client, consumer, producer):
    consumer.deliver(P1, 3, make_decision("mistral", 1))
    mistral = await next_of(client.decisions("mistral"))
    await consumer.rebalance(keep={P0})  # partition 1 goes to another instance
    consumer.deliver(P0, 9, make_decision("llama", 2))
    llama = await next_of(client.decisions("llama"))

    assert await client.complete(mistral, "applied")
    assert await client.complete(llama, "applied")

    assert acks(producer) == [("mistral", 1, "applied"), ("llama", 2, "applied")]
    assert consumer.commits == [{P1: 3}, {P0: 9}, {P0: 10}]  # P1 left at 3 for its new owner


async def test_queued_decision_of_a_revoked_partition_is_left_to_its_new_owner(
        client, consumer, producer):
    consumer.deliver(P1, 3, make_decision("mistral", 1))
    await settle()
    await consumer.rebalance(keep={P0})

    with pytest.raises(TimeoutError):
        await next_of(client.decisions("mistral"), timeout_s=0.2)
    assert not await client.complete(make_decision("mistral", 1), "applied")
    assert producer.acks == []
    assert consumer.commits == [{P1: 3}]


async def test_revoke_commits_what_a_failed_commit_left(client, consumer, producer):
    consumer.deliver(P1, 3, make_decision("mistral", 1))
    mistral = await next_of(client.decisions("mistral"))
    await settle()
    consumer.failing_commits = 1

    assert await client.complete(mistral, "applied")  # the ack is out; the commit failed
    await consumer.rebalance(keep={P0})

    assert acks(producer) == [("mistral", 1, "applied")]
    assert consumer.commits == [{P1: 3}, {P1: 4}]


def test_an_acks_error_is_cut_to_a_size_the_broker_takes():
    """A stack trace from an orchestrator must not make an ack the broker refuses forever."""
    from fleetplan.connectors.base import MAX_ACK_ERROR, ack_error

    assert ack_error(None) is None and ack_error("short") == "short"
    cut = ack_error("x" * (MAX_ACK_ERROR + 500))
    assert cut == "x" * MAX_ACK_ERROR + "... (500 more characters)"


def test_the_last_decision_gauge_never_moves_back():
    """An old decision's ack sent again after a crash must not lower the gauge."""
    from fleetplan.connectors.metrics import ConnectorMetrics

    metrics = ConnectorMetrics("virtual")
    for decision_id in (3, 5, 4):
        metrics.acked("llama", decision_id)
    assert metrics.registry.get_sample_value("fleetplan_connector_last_decision_id", {"deployment": "llama"}) == 5


async def test_the_client_subscribes_only_once_the_decision_topic_exists(monkeypatch, consumer, producer):
    """Subscribing first would have the broker create it with its own partition count, or leave
    the client unassigned until its next metadata refresh (connectors/base.py: wait_for_topic)."""
    looks = []

    async def appears_on_the_second_look(bootstrap, topic) -> bool:
        looks.append((topic, consumer.listener is None))  # not subscribed yet
        return len(looks) > 1

    monkeypatch.setattr(client_module, "AIOKafkaConsumer", lambda *_, **__: consumer)
    monkeypatch.setattr(client_module, "AIOKafkaProducer", lambda *_, **__: producer)
    monkeypatch.setattr(client_module, "topic_exists", appears_on_the_second_look)
    monkeypatch.setattr(client_module, "wait_for_topic", functools.partial(client_module.wait_for_topic, poll_s=0.001))
    async with KafkaOrchestratorClient("unused:1", ["llama"]):
        assert looks == [(topics.DECISIONS, True), (topics.DECISIONS, True)]
        assert consumer.listener is not None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decisions_topic": "my decisions"}, "decisions_topic: a Kafka topic name"),
    ({"acks_topic": "acks/v1"}, "acks_topic: a Kafka topic name"),
    ({"group_id": ""}, "group_id: must not be empty"),
    ({"session_timeout_ms": 0}, "session_timeout_ms: must be > 0, got 0"),
])
def test_what_kafka_would_refuse_later_is_refused_at_construction(kwargs, message):
    # a decision topic Kafka cannot name was waited for without end; an acks topic it cannot
    # name failed the first ack, after the orchestrator had applied the decision
    with pytest.raises(ValueError, match=message):
        KafkaOrchestratorClient("unused:1", ["llama"], **kwargs)


async def test_the_commit_never_passes_a_decision_not_yet_completed(client, consumer, producer):
    """An orchestrator that dies before completing a decision must see it again: the commit
    stops at the oldest one still open, whatever is completed after it."""
    consumer.deliver(P0, 3, make_decision("llama", 1))
    consumer.deliver(P0, 4, make_decision("mistral", 1))
    consumer.deliver(P0, 5, make_decision("mistral", 2))
    await settle()
    decision = await next_of(client.decisions("mistral"))  # 1 is superseded by 2 on the way
    assert await client.complete(decision, "applied")
    assert acks(producer) == [("mistral", 1, "superseded"), ("mistral", 2, "applied")]
    assert consumer.commits and all(c[P0] == 3 for c in consumer.commits if P0 in c)


async def test_a_copy_at_another_offset_does_not_hold_the_commit(client, consumer, producer):
    """A decision recorded twice on its topic (the worker re-sending an outbox it could not
    find on the topic) is one decision: completing it commits past both records. Before, the
    first record's offset stayed open for good, and every restart yielded, applied and acked
    the decision again."""
    consumer.deliver(P0, 7, make_decision("llama", 5))
    consumer.deliver(P0, 8, make_decision("llama", 5))  # the same decision, recorded again
    await settle()

    decision = await next_of(client.decisions("llama"))
    assert await client.complete(decision, "applied")

    assert acks(producer) == [("llama", 5, "applied")]
    assert consumer.commits[-1] == {P0: 9}


async def test_a_copy_of_a_completed_decision_is_not_yielded_again(client, consumer, producer):
    """Not even once the original was completed: yielded again, the orchestrator would move
    the fleet back to an answered decision's targets, after a newer one's too."""
    decisions = client.decisions("llama")
    consumer.deliver(P0, 7, make_decision("llama", 5))
    assert await client.complete(await next_of(decisions), "applied")
    consumer.deliver(P0, 8, make_decision("llama", 5))  # recorded again
    consumer.deliver(P0, 9, make_decision("llama", 6))
    assert await client.complete(await next_of(decisions), "applied")
    consumer.deliver(P0, 10, make_decision("llama", 5))  # older than the one answered

    with pytest.raises(TimeoutError):
        await next_of(decisions, timeout_s=0.2)
    assert acks(producer) == [("llama", 5, "applied"), ("llama", 6, "applied")]
    assert consumer.commits[-1] == {P0: 11}
