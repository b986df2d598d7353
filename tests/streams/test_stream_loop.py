"""The whole loop on the real broker and Redis:

ZMQ -> ``fleetplan bridge`` -> Kafka -> ``fleetplan worker`` -> decision on the
decisions topic -> ``fleetplan connector --backend virtual`` -> Redis -> an
orchestrator (connectors/client.py) completes it -> ack on the acks topic ->
the worker folds the ack and clears its pending decision.

test_stream_bridge.py checks the first half (ZMQ to decision) against the
core's replay on a synthetic time axis. Here the engine publishes in real
time instead, because the connector stamps its acks with the wall clock: an
ack is folded at the worker's first tick after it, so the deployment's event
time must move with the wall clock for it ever to be folded.

The planner's ``ack_timeout_seconds`` is an hour, so nothing but the ack can
clear the pending decision within the test: the tick diagnostics showing
``pending_decision_id`` go from the decision's id to None, with the decision's
targets as the new baseline, is the proof that the worker consumed the ack.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import msgpack
import orjson
import pytest
import yaml
import zmq

from fleetplan.connectors.client import RedisOrchestratorClient
from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.schemas.codec import event_to_dict
from fleetplan.streams.audit import audit_kafka
from tests.streams.helpers import decisions_of, run_async, wait_for
from tests.streams.traffic import DECIDING_CONFIG, fpm, request

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

LOOP_CONFIG = {**DECIDING_CONFIG, "ack_timeout_seconds": 3600}


class LiveEngine(threading.Thread):
    """An overloaded agg engine and its frontend, PUSHing to the bridge stamped with wall time."""

    def __init__(self, address: str, deployment: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.deployment = deployment
        self.halt = threading.Event()

    def run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)
        sock.connect(self.address)
        try:
            n = 0
            while not self.halt.is_set():
                now = time.time()
                events = [fpm(self.deployment, now, n)]
                if n % 3 == 0:
                    events.append(request(self.deployment, now, n))
                sock.send(msgpack.packb([event_to_dict(e) for e in events]))
                n += 1
                self.halt.wait(0.25)
        finally:
            sock.close()


class Orchestrator(threading.Thread):
    """Completes every decision of one deployment as applied, over Redis (the virtual backend)."""

    def __init__(self, redis_url: str, prefix: str, deployment: str) -> None:
        super().__init__(daemon=True)
        self.redis_url, self.prefix, self.deployment = redis_url, prefix, deployment
        self.completed: list[tuple[int, dict]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        async with RedisOrchestratorClient(self.redis_url, prefix=self.prefix, poll_s=0.1) as client:
            task = asyncio.create_task(self._complete_all(client))
            while not self.halt.is_set() and not task.done():
                await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _complete_all(self, client: RedisOrchestratorClient) -> None:
        async for decision in client.decisions(self.deployment):
            if await client.complete(decision, "applied", observed=dict(decision.targets)):
                self.completed.append((decision.decision_id, dict(decision.targets)))


def ticks_of(ns, deployment: str) -> list[dict]:
    diags = [orjson.loads(r.value) for r in run_async(ns.read(ns.topics.ticks))]
    return sorted((d for d in diags if d.get("deployment") == deployment and "pending_decision_id" in d),
                  key=lambda d: d["time"])


def cleared_after_first_decision(ns, deployment: str) -> list[dict] | None:
    """The ticks from the first decision to the first one with it no longer pending, if any."""
    ticks = ticks_of(ns, deployment)
    first = next((i for i, d in enumerate(ticks) if d["decision_id"] == 0), None)
    if first is None:
        return None
    for j in range(first + 1, len(ticks)):
        if ticks[j]["pending_decision_id"] != 0:
            return ticks[first:j + 1]
    return None


def test_decision_is_applied_acked_and_the_ack_folded_by_the_worker(
        namespace, worker_factory, bridge_factory, connector_factory, redis_url, tmp_path):
    config = tmp_path / "loop.yaml"
    config.write_text(yaml.safe_dump(LOOP_CONFIG))
    deployment = f"loop-{uuid.uuid4().hex[:6]}"
    worker = worker_factory(config=config).start()
    bridge = bridge_factory().start()
    connector = connector_factory([deployment]).start()
    orchestrator = Orchestrator(redis_url, connector.virtual_prefix, deployment)
    engine = LiveEngine(bridge.pull, deployment)
    orchestrator.start()
    engine.start()
    try:
        span = wait_for(lambda: cleared_after_first_decision(namespace, deployment), 60,
                        "the worker to fold the ack of decision 0")
    finally:
        engine.halt.set()
        orchestrator.halt.set()
        engine.join(10)
        orchestrator.join(10)

    decisions = decisions_of(namespace, deployment)
    first = decisions[0]
    assert (first["decision_id"], first["advisory"]) == (0, False)
    assert orchestrator.completed[0] == (0, first["targets"])

    acks = [orjson.loads(r.value) for r in run_async(namespace.read(namespace.topics.acks))]
    ack = next(a for a in acks if a["deployment"] == deployment and a["decision_id"] == 0)
    assert (ack["status"], ack["observed"]) == ("applied", first["targets"])
    assert ack["time"] >= first["time"]

    # The guard held while the decision was out, and only the ack released it.
    held, cleared = span[1:-1], span[-1]
    assert all(d["pending_decision_id"] == 0 and d["decision_id"] is None for d in held)
    assert cleared["pending_decision_id"] in (None, cleared["decision_id"])
    assert cleared["time"] > ack["time"]  # folded at the first tick after the ack
    assert cleared["baseline"] == first["targets"]  # "applied": the targets are the fleet now
    assert cleared["time"] - first["time"] < LOOP_CONFIG["ack_timeout_seconds"]
    if cleared["decision_id"] is not None:  # the next decision starts from the acked targets
        second = next(d for d in decisions if d["decision_id"] == cleared["decision_id"])
        assert second["previous"] == first["targets"]

    assert worker.alive() and bridge.alive() and connector.alive()
    assert f"acked {deployment} decision 0: applied" in connector.log()
    planner = Planner(config_from_dict(dict(LOOP_CONFIG)))
    result = audit_kafka(namespace.bootstrap, deployment, planner=planner,
                         topic_prefix=namespace.prefix, partitions=namespace.partitions)
    assert result.ok, result.lines()
