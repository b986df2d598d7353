"""Fixtures for the real test services (Kafka 4.x KRaft and Redis).

The services are started by `make services` (scripts/services/up.sh); see docs/testing.md.
A test that asks for one of these fixtures FAILS (it is never skipped) when its service
is down, so a missing service can't pass as a green run.

Addresses come from the environment:
  FLEETPLAN_KAFKA_BOOTSTRAP  default 127.0.0.1:19092
  FLEETPLAN_REDIS_URL        default redis://127.0.0.1:16379/0

Keep this file to the service fixtures; put other fixtures in the sub-folder conftests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redis

DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:19092"
DEFAULT_REDIS_URL = "redis://127.0.0.1:16379/0"
_START_HINT = "run `make services` (scripts/services/up.sh) to start it; see docs/testing.md"

T = TypeVar("T")


def _kafka_addresses(bootstrap: str) -> list[tuple[str, int]]:
    addresses = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        addresses.append((host.strip("[]") or "127.0.0.1", int(port)))
    return addresses


def _tcp_reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _run_async(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a private loop in a worker thread.

    This works the same from sync tests and from inside a running event loop
    (async tests), at the cost of blocking the caller for the call's duration.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, factory()).result()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The bootstrap address of the real Kafka broker; fails the test if it is down."""
    bootstrap = os.environ.get("FLEETPLAN_KAFKA_BOOTSTRAP", DEFAULT_KAFKA_BOOTSTRAP)
    try:
        addresses = _kafka_addresses(bootstrap)
    except ValueError:
        addresses = []
    if not addresses:
        pytest.fail(f"FLEETPLAN_KAFKA_BOOTSTRAP={bootstrap!r} is not host:port[,host:port]")
    if not any(_tcp_reachable(host, port) for host, port in addresses):
        pytest.fail(f"Kafka is not reachable at {bootstrap}: {_START_HINT}", pytrace=False)
    return bootstrap


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The URL of the real Redis server; fails the test if it is down."""
    url = os.environ.get("FLEETPLAN_REDIS_URL", DEFAULT_REDIS_URL)
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    error: str | None = None
    try:
        client.ping()
    except redis.RedisError as exc:
        error = str(exc)
    finally:
        client.close()
    if error is not None:
        pytest.fail(f"Redis is not reachable at {url} ({error}): {_START_HINT}", pytrace=False)
    return url


class KafkaTopicFactory:
    """Creates uniquely named topics on the real broker and deletes them afterwards.

    Call it from sync or async tests: ``topic = kafka_topic_factory(partitions=3)``.
    Topics are ready (every partition has a leader) when the call returns.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []

    def __call__(
        self,
        prefix: str = "test",
        *,
        partitions: int = 1,
        config: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        _run_async(lambda: self._create(name, partitions, config or {}, timeout))
        self.created.append(name)
        return name

    async def _create(
        self, name: str, partitions: int, config: dict[str, str], timeout: float
    ) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            topic = NewTopic(
                name=name, num_partitions=partitions, replication_factor=1, topic_configs=config
            )
            response = await admin.create_topics([topic], timeout_ms=int(timeout * 1000))
            errors = [
                (t[0], t[1], t[2] if len(t) > 2 else None)
                for t in getattr(response, "topic_errors", [])
                if t[1] != 0
            ]
            if errors:
                raise RuntimeError(f"creating Kafka topic {name!r} failed: {errors}")
            # Creation is committed by the controller before the broker serves it: wait
            # until metadata shows a leader for every partition.
            deadline = time.monotonic() + timeout
            while True:
                described = await admin.describe_topics([name])
                parts = described[0].get("partitions", []) if described else []
                if (
                    described
                    and described[0].get("error_code", 0) == 0
                    and len(parts) == partitions
                    and all(p.get("leader", -1) >= 0 for p in parts)
                ):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Kafka topic {name!r} has no leader after {timeout} s")
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    def delete_all(self) -> None:
        if not self.created:
            return
        names, self.created = self.created, []

        async def delete() -> None:
            from aiokafka.admin import AIOKafkaAdminClient

            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                await admin.delete_topics(names, timeout_ms=30_000)
            finally:
                await admin.close()

        _run_async(delete)


@pytest.fixture
def kafka_topic_factory(kafka_bootstrap: str) -> Iterator[KafkaTopicFactory]:
    """A callable making unique topics on the real broker; they are deleted after the test."""
    factory = KafkaTopicFactory(kafka_bootstrap)
    yield factory
    factory.delete_all()


@pytest.fixture
def redis_key_prefix() -> str:
    """A key prefix unique to this test; `redis_client` deletes its keys afterwards."""
    return f"test:{uuid.uuid4().hex[:12]}:"


@pytest.fixture
def redis_client(redis_url: str, redis_key_prefix: str) -> Iterator[redis.Redis]:
    """A `redis.Redis` (bytes replies) on the real server.

    The database is shared by concurrent test runs, so it is never flushed: write under
    ``redis_key_prefix``; every key under it is deleted after the test.
    """
    client = redis.Redis.from_url(url=redis_url)
    try:
        yield client
    finally:
        keys = list(client.scan_iter(match=f"{redis_key_prefix}*", count=500))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()
