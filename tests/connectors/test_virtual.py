"""Virtual backend + orchestrator client over Redis, and the orchestrator client over Kafka."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetplan.connectors.client import KafkaOrchestratorClient, RedisOrchestratorClient
from fleetplan.connectors.virtual import VirtualApplier, VirtualKeys
from tests.connectors.conftest import make_decision, produce, read_events

ROOT = Path(__file__).resolve().parents[2]


async def next_decision(client, deployment: str, timeout: float = 20.0):
    iterator = client.decisions(deployment)
    return await asyncio.wait_for(anext(iterator), timeout), iterator


@pytest.mark.kafka
@pytest.mark.redis
async def test_virtual_backend_with_the_redis_client(kafka_bootstrap, connector_topics,
                                                     service_factory, aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}virtual"
    await service_factory(VirtualApplier(aredis, prefix=prefix, poll_s=0.1))
    async with RedisOrchestratorClient(client=aredis, prefix=prefix, poll_s=0.1) as client:
        await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                      [make_decision("llama", 0, prefill=2, decode=3)])
        decision, _ = await next_decision(client, "llama")
        assert (decision.decision_id, decision.targets) == (0, {"prefill": 2, "decode": 3})
        state = await aredis.hgetall(VirtualKeys.of("llama", prefix).state)
        # Dynamo's VirtualConnector field names are kept for the counts.
        assert (state[b"num_prefill_workers"], state[b"num_decode_workers"]) == (b"2", b"3")
        assert await client.complete(decision, "applied", observed={"prefill": 2, "decode": 2})
        assert not await client.complete(decision, "applied")  # once only
        (ack,) = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1)
        assert (ack.decision_id, ack.status, ack.observed) == (0, "applied", {"prefill": 2, "decode": 2})

        # The orchestrator can refuse; the refusal is the ack.
        await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                      [make_decision("llama", 1, prefill=9, decode=9)])
        decision, _ = await next_decision(client, "llama")
        await client.complete(decision, "failed", error="no GPUs left")
        acks = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 2)
        assert (acks[1].decision_id, acks[1].status, acks[1].error) == (1, "failed", "no GPUs left")


@pytest.mark.redis
async def test_redis_client_sees_an_uncompleted_decision_again_after_a_restart(
        aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}virtual"
    applier = VirtualApplier(aredis, prefix=prefix, poll_s=0.1, completion_timeout_s=30)
    apply = asyncio.create_task(applier.apply(make_decision("llama", 3, decode=4)))
    async with RedisOrchestratorClient(client=aredis, prefix=prefix, poll_s=0.1) as first:
        seen, _ = await next_decision(first, "llama")  # ... and the orchestrator dies
    async with RedisOrchestratorClient(client=aredis, prefix=prefix, poll_s=0.1) as second:
        again, _ = await next_decision(second, "llama")
        assert again == seen
        await second.complete(again, observed={"decode": 4})
    assert await asyncio.wait_for(apply, 10) == {"decode": 4}


@pytest.mark.redis
async def test_virtual_apply_times_out_when_nobody_completes(aredis, redis_key_prefix):
    """Acked failed, the decision is withdrawn in Redis too: an orchestrator that comes to it
    later no longer sees it due, so it cannot move the fleet the planner was told stayed."""
    from fleetplan.connectors.base import ApplyFailed

    prefix = f"{redis_key_prefix}virtual"
    applier = VirtualApplier(aredis, prefix=prefix, poll_s=0.05, completion_timeout_s=0.3)
    decision = make_decision("llama", 0)
    with pytest.raises(ApplyFailed, match="did not complete.*withdrawn"):
        await applier.apply(decision)
    async with RedisOrchestratorClient(client=aredis, prefix=prefix, poll_s=0.05) as late:
        with pytest.raises(TimeoutError):
            await next_decision(late, "llama", timeout=0.3)
        assert not await late.complete(decision, "applied")
    # a redelivery of the decision does not write it again: its completion is in Redis
    with pytest.raises(ApplyFailed, match="withdrawn"):
        await applier.apply(decision)


@pytest.mark.redis
async def test_a_completion_at_the_deadline_wins_over_the_withdrawal(aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}virtual"
    applier = VirtualApplier(aredis, prefix=prefix, poll_s=0.05, completion_timeout_s=0.3)
    withdraw = applier._withdraw

    async def orchestrator_completes_first(keys, decision):
        async with RedisOrchestratorClient(client=aredis, prefix=prefix) as client:
            assert await client.complete(decision, observed={"decode": 2})
        await withdraw(keys, decision)

    applier._withdraw = orchestrator_completes_first
    assert await applier.apply(make_decision("llama", 0, decode=2)) == {"decode": 2}


@pytest.mark.kafka
async def test_kafka_client_reads_decisions_and_writes_acks(kafka_bootstrap, connector_topics,
                                                            redis_key_prefix):
    topic, acks_topic = connector_topics["decisions_topic"], connector_topics["acks_topic"]
    await produce(kafka_bootstrap, topic, [
        make_decision("llama", 0, advisory=True),
        make_decision("other", 0),
        make_decision("llama", 1, prefill=1, decode=1),
        make_decision("llama", 2, prefill=2, decode=2),
        b"garbage",
    ])
    client = KafkaOrchestratorClient(
        kafka_bootstrap, ["llama"], group_id=f"{redis_key_prefix}orch",
        decisions_topic=topic, acks_topic=acks_topic, session_timeout_ms=6000,
    )
    async with client:
        decision, _ = await next_decision(client, "llama")
        # Advisory 0 is not yielded; 1 was superseded by 2, which was already waiting.
        assert decision.decision_id == 2
        assert await client.complete(decision, "applied")
        acks = await read_events(kafka_bootstrap, acks_topic, 2)
    assert [(a.deployment, a.decision_id, a.status) for a in acks] == [
        ("llama", 1, "superseded"), ("llama", 2, "applied")]
    assert acks[1].observed == {"prefill": 2, "decode": 2}

    # Completed decisions are not delivered again to the same group.
    await produce(kafka_bootstrap, topic, [make_decision("llama", 3, decode=5)])
    client = KafkaOrchestratorClient(
        kafka_bootstrap, ["llama"], group_id=f"{redis_key_prefix}orch",
        decisions_topic=topic, acks_topic=acks_topic, session_timeout_ms=6000,
    )
    async with client:
        decision, _ = await next_decision(client, "llama")
        assert decision.decision_id == 3


@pytest.mark.kafka
@pytest.mark.redis
async def test_example_orchestrator_runs(kafka_bootstrap, connector_topics, service_factory,
                                         aredis, redis_url, redis_key_prefix):
    prefix = f"{redis_key_prefix}virtual"
    await service_factory(VirtualApplier(aredis, prefix=prefix, poll_s=0.1))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    example = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "examples" / "orchestrator.py"), "--transport", "redis",
        "--redis-url", redis_url, "--virtual-prefix", prefix, "--deployment", "llama",
        "--max-decisions", "1", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                  [make_decision("llama", 0, prefill=3, decode=1)])
    out, _ = await asyncio.wait_for(example.communicate(), 30)
    assert example.returncode == 0, out.decode()
    (ack,) = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1)
    assert (ack.decision_id, ack.status, ack.observed) == (0, "applied", {"prefill": 3, "decode": 1})


@pytest.mark.redis
async def test_a_desired_state_deleted_while_waiting_fails_at_the_timeout(aredis, redis_key_prefix):
    """Its hash gone (an operator's DEL, a Redis that lost its data), nothing can complete or
    withdraw the decision: the wait must still end at --completion-timeout, not spin on Redis
    for ever while the lease renewals keep the lane's claim alive."""
    from fleetplan.connectors.base import ApplyFailed

    prefix = f"{redis_key_prefix}virtual"
    keys = VirtualKeys.of("llama", prefix)
    applier = VirtualApplier(aredis, prefix=prefix, poll_s=0.05, completion_timeout_s=0.3)
    apply = asyncio.create_task(applier.apply(make_decision("llama", 4, decode=2)))
    async with asyncio.timeout(5):
        while not await aredis.hget(keys.state, "decision_id"):
            await asyncio.sleep(0.01)
    await aredis.delete(keys.state, keys.desired, keys.completed)
    with pytest.raises(ApplyFailed, match="did not complete decision 4.*no longer in Redis"):
        await asyncio.wait_for(apply, 5)


@pytest.mark.redis
async def test_the_redis_client_cannot_complete_a_decision_that_is_no_longer_desired(aredis, redis_key_prefix):
    """``complete`` of a decision a newer one replaced writes nothing and returns False, as it
    says: the connector waits on the newer one, and the fleet answer is for that one."""
    prefix = f"{redis_key_prefix}virtual"
    applier = VirtualApplier(aredis, prefix=prefix)
    keys = VirtualKeys.of("llama", prefix)
    three, four = make_decision("llama", 3, decode=2), make_decision("llama", 4, decode=5)
    await applier._write(keys, three)
    await applier._write(keys, four)
    async with RedisOrchestratorClient(client=aredis, prefix=prefix) as client:
        assert not await client.complete(three, "applied")
    assert await aredis.hget(keys.state, "scaled_decision_id") is None
    assert await aredis.xlen(keys.completed) == 0


@pytest.mark.redis
async def test_the_redis_client_yields_a_desired_decision_once(aredis, redis_key_prefix):
    """Not again on every turn of the loop until it is completed: an orchestrator that hands
    the scaling to a task of its own would be given the same decision over and over."""
    prefix = f"{redis_key_prefix}virtual"
    keys = VirtualKeys.of("llama", prefix)
    three = make_decision("llama", 3, decode=2)
    await VirtualApplier(aredis, prefix=prefix)._write(keys, three)
    async with RedisOrchestratorClient(client=aredis, prefix=prefix, poll_s=0.05) as client:
        seen, decisions = await next_decision(client, "llama")
        assert seen == three
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(decisions), 0.3)


@pytest.mark.redis
@pytest.mark.parametrize(("status", "observed", "named"), [
    ("done", None, "status"),
    ("applied", {"decode": 2, "gpus": 8}, "observed.gpus"),
    ("applied", {"decode": -1}, "observed.decode"),
    ("applied", {"decode": "x"}, "observed.decode"),  # was a bare int() error naming nothing
])
async def test_the_redis_client_refuses_what_the_ack_schema_refuses(aredis, redis_key_prefix,
                                                                    status, observed, named):
    """As the Kafka client does, naming the field, with the decision still due. Before, it
    wrote the answer and returned True; the connector then acked a status it could not read as
    ``failed`` (the fleet had moved) and dropped counts under other names without a word."""
    prefix = f"{redis_key_prefix}virtual"
    keys = VirtualKeys.of("llama", prefix)
    three = make_decision("llama", 3, decode=2)
    await VirtualApplier(aredis, prefix=prefix)._write(keys, three)
    async with RedisOrchestratorClient(client=aredis, prefix=prefix) as client:
        with pytest.raises(ValueError, match=named):
            await client.complete(three, status, observed=observed)
        assert await aredis.hget(keys.state, "scaled_decision_id") is None
        assert await client.complete(three, "applied", observed={"decode": 2})


@pytest.mark.parametrize(("name", "owner", "stream"), [("x:desired", "x", "desired"),
                                                      ("a:b:completed", "a:b", "completed")])
def test_a_name_whose_hash_key_is_another_deployments_stream_is_refused(name, owner, stream):
    """Deployment ``x:desired`` wrote its hash at ``x``'s desired stream; the second writer got WRONGTYPE
    and its lane retried it without end."""
    with pytest.raises(ValueError, match=f"deployment '{owner}''s {stream} stream"):
        VirtualKeys.of(name)
    assert VirtualKeys.of("x:desired-v2").state == "fleetplan:virtual:x:desired-v2"  # a suffix only


async def test_the_virtual_backend_fails_such_a_decision_with_the_reason():
    """The decision is acked failed, naming the collision, before Redis is touched."""
    from fleetplan.connectors.base import ApplyFailed

    class Unreachable:  # a client it must not reach
        def register_script(self, script):
            return None

    applier = VirtualApplier(Unreachable(), poll_s=0.1)
    with pytest.raises(ApplyFailed, match="whose state hash would be deployment 'llama''s desired stream"):
        await applier.apply(make_decision("llama:desired", 0, decode=1))
