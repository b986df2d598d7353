"""The Faust app of ``fleetplan worker``, built from explicit settings.

The factory sets what the runtime's guarantees rely on, so a Faust default
can never quietly undo them:

* ``stream_wait_empty=False``: records waiting for their tick stay
  unacknowledged on purpose (their offsets must not be committed), so
  shutdown and rebalances must not wait for them;
* ``topic_disable_leader``: no leader topic, nothing uses it;
* ``stream_recovery_delay=0``: recover as soon as partitions are assigned;
* producer ``acks=all`` and idempotent; records up to 16 MiB (big deployment states).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path

import faust
from faust.transport.drivers.aiokafka import Producer as KafkaProducer

from fleetplan.streams.router import SNAPSHOT_EVERY_SECONDS
from fleetplan.streams.topics import MAX_RECORD_BYTES, Topics


def rocksdb_available() -> bool:
    """Whether the ``rocksdb`` extra (rocksdict) is installed."""
    return importlib.util.find_spec("rocksdict") is not None


def default_store() -> str:
    """``rocksdb://`` when rocksdict is installed (local state survives restarts), else memory."""
    return "rocksdb://" if rocksdb_available() else "memory://"


@dataclass
class WorkerSettings:
    bootstrap: str = field(default_factory=lambda: os.environ.get("FLEETPLAN_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    app_id: str = "fleetplan-worker"
    topic_prefix: str = ""
    partitions: int = 8
    replication: int | None = None
    store: str = field(default_factory=default_store)
    datadir: str = "/tmp/fleetplan-worker"
    config: str | None = None
    profile: str | None = None
    batch_max: int = 2000
    batch_within_s: float = 0.05
    idle_after_s: float = 30.0
    snapshot_every_s: float = SNAPSHOT_EVERY_SECONDS  # 0: none
    session_timeout_s: float = 10.0
    heartbeat_s: float = 1.0
    commit_interval_s: float = 1.0
    instance_id: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    loglevel: str = "warning"

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)


class IdempotentProducer(KafkaProducer):
    """Faust's aiokafka producer with idempotence on (Faust turns it on only for exactly-once).

    aiokafka retries a send whose connection dropped before the broker's
    answer (a broker restart, a network blip); without sequence numbers the
    broker appends the retry too, so a decision would be on its topic twice,
    which the audit refuses as a decision id recorded again.
    """

    def _settings_extra(self):
        return {**super()._settings_extra(), "enable_idempotence": True}


class WorkerApp(faust.App):
    """The worker's Faust app: its producer is :class:`IdempotentProducer`."""

    def _new_producer(self):
        return IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)


def create_app(settings: WorkerSettings) -> faust.App:
    Path(settings.datadir).mkdir(parents=True, exist_ok=True)
    options = dict(
        broker=f"kafka://{settings.bootstrap}",
        store=settings.store,
        datadir=settings.datadir,
        autodiscover=False,
        topic_partitions=settings.partitions,
        topic_disable_leader=True,
        topic_allow_declare=True,
        web_enabled=False,
        stream_wait_empty=False,
        stream_recovery_delay=0.0,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.heartbeat_s,
        broker_commit_interval=settings.commit_interval_s,
        broker_request_timeout=max(40.0, settings.session_timeout_s * 4),
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=MAX_RECORD_BYTES,
        producer_linger_ms=0,
        consumer_max_fetch_size=16 * 1024 * 1024,
        # A batch that fails half-way leaves the router's in-memory state half-applied;
        # Faust's default supervisor would restart the agent on it in this process. Exit
        # instead, so a restart recovers from the changelog and the committed offsets.
        agent_supervisor="mode.CrashingSupervisor",
    )
    if settings.replication:
        options["topic_replication_factor"] = settings.replication
    if settings.instance_id:
        options["consumer_group_instance_id"] = settings.instance_id
    return WorkerApp(settings.app_id, **options)
