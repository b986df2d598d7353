"""One deployment's lane, in process, with the ledger on the real Redis and the ack topic in memory.

The records are routed as the fetch loop routes them (``_route``), so what is
queued behind a decision when its lane takes it up is what the test queued.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from fleetplan.connectors.base import Superseded
from fleetplan.connectors.ledger import Ledger
from fleetplan.connectors.metrics import ConnectorMetrics
from fleetplan.connectors.worker import (
    ConnectorService,
    ServiceSettings,
    _PartitionOffsets,
    _Ticket,
)
from fleetplan.schemas import topics
from fleetplan.schemas.codec import decode_event, encode_event
from tests.connectors.conftest import CountingApplier, make_decision

pytestmark = pytest.mark.redis


@pytest.fixture
def lane_service(aredis, redis_key_prefix):
    """A connector service whose acks land in ``service.acks``."""

    def make(applier) -> ConnectorService:
        ledger = Ledger(aredis, prefix=f"{redis_key_prefix}ledger", claimant="A")
        service = ConnectorService(applier, ledger, ServiceSettings(bootstrap="unused:1", retry_backoff_s=0.05,
                                                                    crash_at=None),
                                   metrics=ConnectorMetrics(applier.backend))
        service.acks = []

        async def produce(topic, key, value):
            service.acks.append(decode_event(value))

        service._produce = produce
        return service

    return make


async def route_all(service: ConnectorService, decisions) -> None:
    """Queue every decision in its lane before the lane runs, then wait until all are done."""
    offsets = _PartitionOffsets()
    for offset, decision in enumerate(decisions):
        offsets.add(offset)
        service._inflight += 1
        record = SimpleNamespace(value=encode_event(decision), key=decision.deployment.encode(),
                                 topic=topics.DECISIONS, partition=0, offset=offset)
        await service._route(record, _Ticket(offsets, offset, service))
    try:
        async with asyncio.timeout(10):
            while offsets.inflight:
                await asyncio.sleep(0.01)
    finally:
        for lane in service._lanes.values():
            lane.task.cancel()
        await asyncio.gather(*(lane.task for lane in service._lanes.values()), return_exceptions=True)


async def test_a_copy_of_the_same_decision_queued_behind_it_does_not_supersede_it(lane_service):
    """A redelivered record (a rebalance, a retried fetch) is the same decision, not a newer one:
    it is applied once and acked applied, not skipped as superseded by itself."""
    applier = CountingApplier()
    service = lane_service(applier)
    d = make_decision("llama", 5, decode=4)
    await route_all(service, [d, d])
    assert applier.applied == [("llama", 5)]
    assert [(a.decision_id, a.status) for a in service.acks] == [(5, "applied")]


async def test_an_advisory_decision_queued_behind_does_not_supersede_a_real_one(lane_service):
    """An advisory decision is never applied, so skipping the real one for it would leave the
    fleet where it was while the planner waits on the real one's ack."""
    applier = CountingApplier()
    service = lane_service(applier)
    await route_all(service, [make_decision("llama", 5, decode=4), make_decision("llama", 6, advisory=True)])
    assert applier.applied == [("llama", 5)]
    assert [(a.decision_id, a.status) for a in service.acks] == [(5, "applied")]


async def test_an_ack_is_never_dated_before_its_decision(lane_service):
    """The planner folds an ack at its event time, and one dated before the tick that made the
    decision is late and refused: the decision would stay pending until the ack timeout. The
    decision's time is the sources' clock, which can run ahead of the connector's (a backfill,
    a fast publisher clock)."""
    service = lane_service(CountingApplier())
    ahead = make_decision("llama", 5, decode=4).model_copy(update={"time": time.time() + 3600})
    await route_all(service, [ahead])
    (ack,) = service.acks
    assert ack.status == "applied" and ack.time >= ahead.time


class _ReportingApplier(CountingApplier):
    """Reports what it is told to: a backend (or an orchestrator behind one) is someone else's code."""

    def __init__(self, observed) -> None:
        super().__init__()
        self.observed = observed

    async def apply(self, decision):
        await super().apply(decision)
        return self.observed


async def test_an_ack_carries_only_the_roles_counts_a_backend_observed(lane_service):
    """Other keys are left out; the roles' counts stand (the planner times startups by them)."""
    service = lane_service(_ReportingApplier({"decode": 4, "gpus": 8}))
    await route_all(service, [make_decision("llama", 5, decode=4)])
    (ack,) = service.acks
    assert (ack.status, ack.observed, ack.error) == ("applied", {"decode": 4}, None)


async def test_counts_an_ack_cannot_carry_are_dropped_and_the_decision_still_acked(lane_service):
    """A negative count fails the ack's schema: the ack goes out without them, saying so,
    instead of the lane failing and the connector stopping on every redelivery."""
    service = lane_service(_ReportingApplier({"decode": -1}))
    await route_all(service, [make_decision("llama", 5, decode=4)])
    (ack,) = service.acks
    assert (ack.status, ack.observed) == ("applied", {})
    assert "observed dropped" in ack.error
    assert not service._stopping.is_set()


class _OvertakenApplier(CountingApplier):
    async def apply(self, decision):
        await super().apply(decision)
        raise Superseded("decision 6 is already the desired state")


async def test_a_decision_the_backend_found_overtaken_is_acked_superseded(lane_service):
    service = lane_service(_OvertakenApplier())
    await route_all(service, [make_decision("llama", 5, decode=4)])
    (ack,) = service.acks
    assert (ack.status, ack.error) == ("superseded", "decision 6 is already the desired state")


async def test_a_bad_record_with_a_key_too_long_for_a_deployment_is_dead_lettered_as_unknown(lane_service):
    """The key is the producer's: one longer than a deployment name may be must not make the
    dead letter itself invalid, which raised out of the fetch loop and stopped the connector."""
    service = lane_service(CountingApplier())
    offsets = _PartitionOffsets()
    offsets.add(0)
    service._inflight += 1
    record = SimpleNamespace(value=b"not json", key=b"k" * 300, topic=topics.DECISIONS, partition=0, offset=0)
    await service._route(record, _Ticket(offsets, 0, service))
    (letter,) = service.acks  # the dead letter, produced where the acks are
    assert (letter.type, letter.deployment, letter.reason) == ("deadletter", "unknown", "invalid")
    assert offsets.inflight == set()


async def test_a_stop_lets_the_decision_being_applied_finish_and_acks_it(lane_service):
    """SIGTERM stops the connector cleanly: a rollout under way is waited for (up to
    ``stop_grace_s``) and acked, not cut off and left to the next run's recover (which on
    Kubernetes acks it failed "in doubt" if the spec has not caught up)."""
    applier = CountingApplier()
    applier.delay_s = 0.3
    service = lane_service(applier)
    offsets = _PartitionOffsets()
    offsets.add(0)
    service._inflight += 1
    d = make_decision("llama", 5, decode=4)
    record = SimpleNamespace(value=encode_event(d), key=b"llama", topic=topics.DECISIONS, partition=0, offset=0)
    await service._route(record, _Ticket(offsets, 0, service))
    await asyncio.sleep(0.05)  # the lane is applying it
    service.stop()
    await asyncio.wait_for(service._shutdown(), 5)
    assert applier.applied == [("llama", 5)]
    assert [(a.decision_id, a.status) for a in service.acks] == [(5, "applied")]
    assert offsets.inflight == set()
