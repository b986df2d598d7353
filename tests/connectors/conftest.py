"""Fixtures for the connector tests: decisions, a counting backend, a running service,
and Kafka helpers. The real Kafka and Redis come from tests/conftest.py."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from fleetplan.connectors.base import Applier, ApplyFailed, Observed
from fleetplan.connectors.ledger import Ledger, connect
from fleetplan.connectors.worker import ConnectorService, ServiceSettings
from fleetplan.schemas.codec import decode_event, encode_event
from fleetplan.schemas.events import Decision
from tests.connectors.fake_kubernetes import FakeKubernetes

T0 = 1_800_000_000.0


def make_decision(deployment: str = "llama", decision_id: int = 0, *, advisory: bool = False,
                  **targets: int) -> Decision:
    targets = targets or {"prefill": 2, "decode": 3}
    return Decision(
        deployment=deployment, time=T0 + 5 * decision_id, decision_id=decision_id,
        targets=targets, previous={r: 1 for r in targets},
        throughput_reason="scale", load_reason="scale_up", advisory=advisory,
    )


class CountingApplier(Applier):
    """A backend that only counts: the test's proof of "applied at most once"."""

    backend = "counting"

    def __init__(self) -> None:
        self.applied: list[tuple[str, int]] = []
        self.recovered: list[tuple[str, int]] = []
        self.fail_with: str | None = None
        self.delay_s = 0.0

    async def apply(self, decision: Decision) -> Observed:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        self.applied.append((decision.deployment, decision.decision_id))
        if self.fail_with:
            raise ApplyFailed(self.fail_with)
        return dict(decision.targets)

    async def recover(self, decision: Decision) -> Observed:
        self.recovered.append((decision.deployment, decision.decision_id))
        return dict(decision.targets)


@pytest.fixture
def decision() -> Callable[..., Decision]:
    return make_decision


@pytest.fixture
async def aredis(redis_url, redis_client):
    """An asyncio Redis client; keys under ``redis_key_prefix`` are removed by redis_client."""
    client = connect(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def connector_topics(kafka_topic_factory) -> dict[str, str]:
    return {
        "decisions_topic": kafka_topic_factory("decisions", partitions=2),
        "acks_topic": kafka_topic_factory("acks"),
        "deadletter_topic": kafka_topic_factory("deadletter"),
    }


_groups = itertools.count()


@pytest.fixture
async def service_factory(kafka_bootstrap, connector_topics, aredis, redis_key_prefix):
    """Start a ConnectorService in this event loop; all are stopped after the test."""
    running: list[tuple[ConnectorService, asyncio.Task]] = []

    async def start(applier: Applier, **overrides) -> ConnectorService:
        settings = ServiceSettings(
            bootstrap=kafka_bootstrap, group_id=f"{redis_key_prefix}group{next(_groups)}",
            session_timeout_ms=6000, commit_interval_s=0.05, stop_grace_s=2.0,
            crash_at=None, **{**connector_topics, **overrides},
        )
        ledger = Ledger(aredis, prefix=f"{redis_key_prefix}ledger", claimant="test")
        service = ConnectorService(applier, ledger, settings)
        await service.start()
        task = asyncio.create_task(service.run())
        running.append((service, task))
        await asyncio.wait_for(service.assigned.wait(), 30)
        return service

    yield start

    for service, task in running:
        service.stop()
        await asyncio.wait_for(task, 30)


async def produce(bootstrap: str, topic: str, values: list[bytes | Decision],
                  key: bytes | None = None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            if isinstance(value, Decision):
                await producer.send_and_wait(topic, encode_event(value),
                                             key=value.deployment.encode())
            else:
                await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def read_events(bootstrap: str, topic: str, count: int, timeout: float = 30.0,
                      settle: float = 0.0) -> list:
    """The first ``count`` events of ``topic`` (waits up to ``timeout``), then ``settle``
    seconds more to catch any extra event that should not be there."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    events: list = []
    try:
        deadline = time.monotonic() + timeout
        while len(events) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                events.extend(decode_event(r.value) for r in records)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                events.extend(decode_event(r.value) for r in records)
    finally:
        await consumer.stop()
    return events


@pytest.fixture
async def fake_k8s():
    server = FakeKubernetes()
    await server.start()
    yield server
    await server.stop()
