"""Fixtures for the streams tests: unique topic namespaces on the real broker, a planner
config file that decides often, and ``fleetplan worker`` as a subprocess.

The event factories and the config live in tests/streams/traffic.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from fleetplan.models.planner import Planner
from fleetplan.schemas.codec import encode_event
from tests.streams.helpers import free_port, run_async, wait_for
from tests.streams.traffic import DECIDING_CONFIG, FLEETPLAN, deciding_planner


@pytest.fixture
def planner() -> Planner:
    return deciding_planner()


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "planner.yaml"
    path.write_text(yaml.safe_dump(DECIDING_CONFIG))
    return path


# --- the real broker ---------------------------------------------------------------


class Namespace:
    """A unique topic prefix and app id on the shared broker; deletes its topics afterwards."""

    def __init__(self, bootstrap: str, partitions: int) -> None:
        tag = uuid.uuid4().hex[:8]
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.prefix = f"t{tag}."
        self.app_id = f"t{tag}-worker"
        from fleetplan.streams.topics import Topics

        self.topics = Topics(self.prefix)

    async def create(self) -> None:
        from fleetplan.streams.topics import changelog_specs, ensure_topics, event_log_specs

        specs = event_log_specs(self.topics, self.partitions) + changelog_specs(
            self.app_id, self.partitions, traffic_retention_ms=3_600_000)
        await ensure_topics(self.bootstrap, specs, replication=1)

    async def produce(self, topic: str, events, *, raw: list[tuple[bytes | None, bytes]] | None = None) -> None:
        """Produce events keyed by deployment (and raw (key, value) records) to ``topic``."""
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True,
                                    linger_ms=5, max_request_size=8 * 1024 * 1024)
        await producer.start()
        try:
            for e in events:
                await producer.send(topic, encode_event(e), key=e.deployment.encode())
            for key, value in raw or []:
                await producer.send(topic, value, key=key)
            await producer.flush()
        finally:
            await producer.stop()

    async def read(self, topic: str) -> list:
        from fleetplan.streams.kafka_io import read_partitions

        slices = await read_partitions(self.bootstrap, [(topic, p) for p in range(self.partitions)])
        return [r for records in slices.values() for r in records]

    async def delete(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            names = [n for n in await admin.list_topics()
                     if n.startswith(self.prefix) or n.startswith(self.app_id)]
            if names:
                await admin.delete_topics(names, timeout_ms=30_000)
        finally:
            await admin.close()


@pytest.fixture
def namespace(kafka_bootstrap: str) -> Iterator[Namespace]:
    ns = Namespace(kafka_bootstrap, partitions=2)
    run_async(ns.create())
    yield ns
    run_async(ns.delete())


class ServiceProcess:
    """A ``fleetplan`` command run as a subprocess, its output in ``log_path``.

    Subclasses set ``args`` and ``log_path``; ``ready_text`` (a line the
    command logs once it serves) makes :meth:`start` wait for it;
    ``stop_timeout`` is how long SIGTERM gets before SIGKILL.
    """

    args: list[str]
    log_path: Path
    ready_text: str | None = None
    stop_timeout: float = 20.0
    proc: subprocess.Popen | None = None

    def start(self):
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if self.ready_text is not None:
            name = self.args[1]
            wait_for(lambda: self.ready_text in self.log() or not self.alive(), 30, f"the {name} to start")
            assert self.alive(), self.log()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, nothing is flushed or committed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if hasattr(self, "_log"):
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class WorkerProcess(ServiceProcess):
    """``fleetplan worker`` as a subprocess, so a test can SIGKILL it."""

    def __init__(self, ns: Namespace, config: Path, tmp: Path, *, metrics_port: int | None = None,
                 instance: str = "w1", extra: list[str] | None = None) -> None:
        self.ns = ns
        self.log_path = tmp / f"worker-{instance}-{uuid.uuid4().hex[:4]}.log"
        self.args = [
            FLEETPLAN, "worker", "--bootstrap", ns.bootstrap, "--config", str(config),
            "--app-id", ns.app_id, "--topic-prefix", ns.prefix, "--partitions", str(ns.partitions),
            "--replication", "1", "--store", "memory://", "--datadir", str(tmp / f"data-{instance}"),
            "--session-timeout", "6", "--heartbeat", "1", "--commit-interval", "0.5",
            "--idle-after", "3", "--batch-within", "0.02", "--instance-id", f"{ns.app_id}-{instance}",
            "--loglevel", "info",
        ] + (["--metrics-port", str(metrics_port)] if metrics_port else []) + (extra or [])


@pytest.fixture
def worker_factory(namespace: Namespace, config_file: Path, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def make(config: Path | None = None, **kwargs) -> WorkerProcess:
        w = WorkerProcess(namespace, config or config_file, tmp_path, **kwargs)
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop()




class BridgeProcess(ServiceProcess):
    """``fleetplan bridge`` as a subprocess with a PULL and a SUB endpoint on free ports."""

    ready_text = "bridge up"
    stop_timeout = 40.0

    def __init__(self, ns: Namespace, tmp: Path, *, extra: list[str] | None = None) -> None:
        self.pull = f"tcp://127.0.0.1:{free_port()}"
        self.sub = f"tcp://127.0.0.1:{free_port()}"
        self.log_path = tmp / f"bridge-{uuid.uuid4().hex[:4]}.log"
        self.args = [
            FLEETPLAN, "bridge", "--bootstrap", ns.bootstrap, "--pull", f"bind:{self.pull}",
            "--sub", f"bind:{self.sub}", "--topic-prefix", ns.prefix, "--partitions", str(ns.partitions),
            "--replication", "1", "--heartbeat", "1", "--loglevel", "info",
        ] + (extra or [])


@pytest.fixture
def bridge_factory(namespace: Namespace, tmp_path: Path) -> Iterator[Callable[..., BridgeProcess]]:
    started: list[BridgeProcess] = []

    def make(**kwargs) -> BridgeProcess:
        b = BridgeProcess(namespace, tmp_path, **kwargs)
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()




class ConnectorProcess(ServiceProcess):
    """``fleetplan connector --backend virtual`` as a subprocess on the namespace's topics,
    with its ledger and desired state under a per-test Redis prefix."""

    ready_text = "connector started"
    stop_timeout = 30.0

    def __init__(self, ns: Namespace, tmp: Path, redis_url: str, redis_prefix: str,
                 deployments: list[str]) -> None:
        self.virtual_prefix = f"{redis_prefix}virtual"
        self.log_path = tmp / f"connector-{uuid.uuid4().hex[:4]}.log"
        self.args = [
            FLEETPLAN, "connector", "--backend", "virtual", "--bootstrap", ns.bootstrap,
            "--redis-url", redis_url, "--decisions-topic", ns.topics.decisions,
            "--acks-topic", ns.topics.acks, "--deadletter-topic", ns.topics.deadletter,
            "--group-id", f"{ns.app_id}-connector", "--ledger-prefix", f"{redis_prefix}ledger",
            "--virtual-prefix", self.virtual_prefix, "--metrics-port", "0",
            "--session-timeout-ms", "6000", "--completion-timeout", "60",
        ] + [a for d in deployments for a in ("--deployment", d)]


@pytest.fixture
def connector_factory(namespace: Namespace, tmp_path: Path, redis_url: str, redis_client,
                      redis_key_prefix: str) -> Iterator[Callable[..., ConnectorProcess]]:
    """Connectors on the namespace's topics; ``redis_client`` deletes their Redis keys afterwards."""
    started: list[ConnectorProcess] = []

    def make(deployments: list[str]) -> ConnectorProcess:
        c = ConnectorProcess(namespace, tmp_path, redis_url, redis_key_prefix, deployments)
        started.append(c)
        return c

    yield make
    for c in started:
        c.stop()
