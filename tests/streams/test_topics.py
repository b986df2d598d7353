"""``ensure_topics`` against the real broker: what an existing topic must agree on."""

from __future__ import annotations

import asyncio

import pytest

from fleetplan.streams.topics import (
    STATE_TABLE,
    TopicMismatch,
    changelog_name,
    changelog_specs,
    ensure_topics,
    event_log_specs,
    partition_counts,
)
from tests.streams.helpers import run_async

pytestmark = [pytest.mark.kafka]


async def _create(bootstrap: str, name: str, partitions: int, config: dict[str, str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config)], timeout_ms=15_000)
    finally:
        await admin.close()
    # the broker's metadata may not list a topic the moment it is created
    for _ in range(100):
        if await partition_counts(bootstrap, [name]):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} was not listed within 10 s")


def test_an_existing_changelog_that_is_not_compacted_is_refused(namespace):
    """A state changelog created by other tooling with ``delete`` loses states to retention."""
    app_id = f"{namespace.app_id}-x"
    name = changelog_name(app_id, STATE_TABLE)
    run_async(_create(namespace.bootstrap, name, namespace.partitions, {"cleanup.policy": "delete"}))
    specs = changelog_specs(app_id, namespace.partitions, traffic_retention_ms=3_600_000)
    with pytest.raises(TopicMismatch, match=rf"topic {name} has cleanup.policy delete, this installation "
                                            r"needs compact"):
        run_async(ensure_topics(namespace.bootstrap, specs, replication=1))


def test_an_existing_event_topic_that_is_compacted_is_refused(namespace):
    """An input topic compacted by deployment would keep one record per deployment."""
    prefix = f"{namespace.prefix}x."
    from fleetplan.streams.topics import Topics

    topics = Topics(prefix)
    run_async(_create(namespace.bootstrap, topics.requests, namespace.partitions, {"cleanup.policy": "compact"}))
    with pytest.raises(TopicMismatch, match=rf"topic {topics.requests} has cleanup.policy compact"):
        run_async(ensure_topics(namespace.bootstrap, event_log_specs(topics, namespace.partitions), replication=1))


def test_existing_topics_with_their_settings_pass_again(namespace):
    """The namespace's own topics (created by the fixture) are accepted as they are;
    ``compact,delete`` matches in any order or spacing."""
    specs = event_log_specs(namespace.topics, namespace.partitions) + changelog_specs(
        namespace.app_id, namespace.partitions, traffic_retention_ms=3_600_000)
    assert run_async(ensure_topics(namespace.bootstrap, specs, replication=1)) == []
