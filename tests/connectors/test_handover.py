"""A partition handed over mid-apply: the decision is applied once and acked with what happened.

Kafka redelivers a decision whose offset was not committed to the
partition's new owner, possibly while the old owner is still applying it.
The ledger's lease tells the new owner to wait for the live claim's
outcome instead of taking the claim for a dead run (connectors/ledger.py),
and the old owner drops the queued records of a revoked partition without
committing past them (connectors/worker.py).
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.structs import TopicPartition

from fleetplan.connectors.ledger import Ledger
from fleetplan.connectors.worker import (
    ConnectorService,
    ServiceSettings,
    _Lane,
    _PartitionOffsets,
    _Ticket,
)
from fleetplan.schemas.codec import decode_event
from tests.connectors.conftest import CountingApplier, make_decision


def _service(applier, ledger: Ledger, acks: list) -> ConnectorService:
    service = ConnectorService(applier, ledger, ServiceSettings(bootstrap="unused:1", retry_backoff_s=0.05,
                                                                retry_backoff_max_s=0.1, crash_at=None))

    async def produce(topic, key, value):  # the ack topic, in memory
        acks.append(decode_event(value))

    service._produce = produce
    return service


@pytest.mark.redis
async def test_a_redelivered_decision_waits_for_the_live_claim_instead_of_recovering_it(aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}ledger"
    acks: list = []
    old_owner, new_owner = CountingApplier(), CountingApplier()
    old_owner.delay_s = 0.6  # a rollout in progress: longer than the lease, which is renewed
    a = _service(old_owner, Ledger(aredis, prefix=prefix, claimant="A", lease_s=0.3), acks)
    b = _service(new_owner, Ledger(aredis, prefix=prefix, claimant="B", lease_s=0.3), acks)
    d = make_decision("llama", 5, prefill=2, decode=3)
    applying = asyncio.create_task(a._handle_retrying(d, None))
    await asyncio.sleep(0.05)  # A has claimed 5 and is applying it; the partition moves to B
    await b._handle_retrying(d, None)
    await applying
    # applied once, by A; B neither applied nor "recovered" it, and nobody acked it failed
    assert old_owner.applied == [("llama", 5)] and old_owner.recovered == []
    assert new_owner.applied == [] and new_owner.recovered == []
    assert acks and {(ack.decision_id, ack.status) for ack in acks} == {(5, "applied")}
    assert b.metrics.registry.get_sample_value("fleetplan_connector_errors_total", {"component": "claim_busy"}) >= 1


@pytest.mark.redis
async def test_a_claim_whose_lease_ran_out_is_recovered(aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}ledger"
    d = make_decision("llama", 7)
    dead = Ledger(aredis, prefix=prefix, claimant="A", lease_s=0.2)
    other = Ledger(aredis, prefix=prefix, claimant="B", lease_s=0.2)
    assert (await dead.begin(d)).verdict == "apply"  # ... and A dies without an outcome
    assert (await other.begin(d)).verdict == "busy"
    assert await dead.renew(d)  # a live claimant keeps its claim
    await asyncio.sleep(0.3)
    assert (await other.begin(d)).verdict == "recover"  # the lease ran out: B takes the claim over
    assert not await dead.renew(d)  # ... and A's claim is no longer its own
    snapshot = await other.snapshot("llama")
    assert snapshot["claimed"] == "7" and snapshot["claimed_by"] == "B"
    # the same claimant (a restart with the same --instance-id) recovers at once
    restarted = Ledger(aredis, prefix=prefix, claimant="B", lease_s=0.2)
    assert (await restarted.begin(d)).verdict == "recover"


def test_a_revoked_partition_drops_its_queued_records_and_the_commit_stops_before_them():
    service = ConnectorService(CountingApplier(), ledger=None, settings=ServiceSettings(bootstrap="unused:1"))
    kept_tp, revoked_tp = TopicPartition("d", 0), TopicPartition("d", 1)
    lane = service._lanes["llama"] = _Lane()
    for tp, offsets_list in ((kept_tp, (10, 11)), (revoked_tp, (20, 21, 22))):
        offsets = service._offsets[tp] = _PartitionOffsets()
        for n in offsets_list:
            offsets.add(n)
            service._inflight += 1
            lane.queue.append((make_decision("llama", n), _Ticket(offsets, n, service)))
    revoked = service._offsets[revoked_tp]
    commits: list[dict] = []

    class Consumer:
        async def commit(self, offsets):
            commits.append({tp.partition: meta.offset for tp, meta in offsets.items()})

    service._consumer = Consumer()
    asyncio.run(service._on_revoked([revoked_tp]))
    # the revoked partition's records are gone from the lane; the kept partition's stay, in order
    assert [d.decision_id for d, _ in lane.queue] == [10, 11]
    assert service._inflight == 2
    # none of them counted as done: the commit on revoke is at the first of them, so the new owner gets all three
    assert commits == [{1: 20}] and revoked.committable() == 20
    assert revoked_tp not in service._offsets


@pytest.mark.redis
async def test_a_failure_with_a_huge_message_is_acked_with_it_cut(aredis, redis_key_prefix):
    from fleetplan.connectors.base import MAX_ACK_ERROR

    acks: list = []
    applier = CountingApplier()
    applier.fail_with = "Traceback ...\n" * 10_000  # 140 kB: the broker's limit is 1 MB by default, close enough
    service = _service(applier, Ledger(aredis, prefix=f"{redis_key_prefix}ledger", claimant="A"), acks)
    await service._handle_retrying(make_decision("llama", 3), None)
    (ack,) = acks
    assert ack.status == "failed" and len(ack.error) < MAX_ACK_ERROR + 50
    assert ack.error.endswith("more characters)")
