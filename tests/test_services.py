"""Smoke tests of the real test services started by `make services`.

They check the services and the fixtures of tests/conftest.py, not fleetplan itself.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

TIMEOUT = 30.0


def _consumer(bootstrap: str, topic: str, group_id: str | None = None) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )


@pytest.mark.kafka
async def test_kafka_produce_then_consume(kafka_bootstrap, kafka_topic_factory):
    topic = kafka_topic_factory("svc-roundtrip")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            topic, b"hello broker", key=b"k1", headers=[("h", b"v")]
        )
    finally:
        await producer.stop()
    assert (meta.topic, meta.partition, meta.offset) == (topic, 0, 0)

    consumer = _consumer(kafka_bootstrap, topic)
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), TIMEOUT)
    finally:
        await consumer.stop()
    assert record.topic == topic
    assert record.offset == 0
    assert record.key == b"k1"
    assert record.value == b"hello broker"
    assert list(record.headers) == [("h", b"v")]


@pytest.mark.kafka
async def test_kafka_consumer_group_commits_and_resumes(kafka_bootstrap, kafka_topic_factory):
    topic = kafka_topic_factory("svc-group")
    group = f"{topic}-group"
    tp = TopicPartition(topic, 0)

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(10):
            await producer.send(topic, f"m{i}".encode())
        await producer.flush()
    finally:
        await producer.stop()

    # First member reads four records, commits, and leaves the group.
    first = _consumer(kafka_bootstrap, topic, group)
    await first.start()
    try:
        seen = [(await asyncio.wait_for(first.getone(), TIMEOUT)).value for _ in range(4)]
        await first.commit()
        assert await first.committed(tp) == 4
    finally:
        await first.stop()
    assert seen == [b"m0", b"m1", b"m2", b"m3"]

    # A new member of the same group resumes from the committed offset.
    second = _consumer(kafka_bootstrap, topic, group)
    await second.start()
    try:
        assert await second.committed(tp) == 4
        rest = [(await asyncio.wait_for(second.getone(), TIMEOUT)) for _ in range(6)]
    finally:
        await second.stop()
    assert [r.offset for r in rest] == list(range(4, 10))
    assert [r.value for r in rest] == [f"m{i}".encode() for i in range(4, 10)]


@pytest.mark.kafka
def test_kafka_topic_factory_works_from_sync_tests(kafka_topic_factory):
    a = kafka_topic_factory("svc-sync", partitions=3)
    b = kafka_topic_factory("svc-sync")
    assert a != b
    assert a.startswith("svc-sync-") and b.startswith("svc-sync-")
    assert kafka_topic_factory.created == [a, b]


@pytest.mark.redis
def test_redis_set_get(redis_client: redis.Redis, redis_key_prefix: str):
    key = f"{redis_key_prefix}greeting"
    assert redis_client.get(key) is None
    assert redis_client.set(key, b"hello redis") is True
    assert redis_client.get(key) == b"hello redis"
    assert redis_client.incrby(f"{redis_key_prefix}counter", 5) == 5
    assert redis_client.incrby(f"{redis_key_prefix}counter", 2) == 7
    assert redis_client.ttl(key) == -1  # no expiry set


@pytest.mark.redis
def test_redis_client_isolates_tests_by_prefix(redis_client: redis.Redis, redis_key_prefix):
    # A fresh prefix per test: nothing from another test (or an earlier run) is visible.
    assert list(redis_client.scan_iter(match=f"{redis_key_prefix}*")) == []
