"""The connector service on the real Kafka and Redis, with a backend that counts applies."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

from fleetplan.schemas.events import Ack, DeadLetter
from tests.connectors.conftest import CountingApplier, make_decision, produce, read_events

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def acks_by_id(events) -> dict[int, Ack]:
    return {e.decision_id: e for e in events if isinstance(e, Ack)}


async def test_applies_and_acks(kafka_bootstrap, connector_topics, service_factory):
    applier = CountingApplier()
    await service_factory(applier)
    await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                  [make_decision("a", 0, prefill=2, decode=3), make_decision("b", 0, agg=4)])
    acks = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 2)
    assert {(a.deployment, a.decision_id, a.status) for a in acks} == {
        ("a", 0, "applied"), ("b", 0, "applied")}
    assert {a.deployment: a.observed for a in acks} == {"a": {"prefill": 2, "decode": 3},
                                                        "b": {"agg": 4}}
    assert sorted(applier.applied) == [("a", 0), ("b", 0)]


async def test_superseded_stale_and_duplicate_decisions(kafka_bootstrap, connector_topics,
                                                        service_factory):
    topic, acks_topic = connector_topics["decisions_topic"], connector_topics["acks_topic"]
    # Three decisions waiting before the connector starts: only the newest is applied.
    await produce(kafka_bootstrap, topic, [make_decision("a", i, decode=i + 1) for i in range(3)])
    applier = CountingApplier()
    await service_factory(applier)
    acks = acks_by_id(await read_events(kafka_bootstrap, acks_topic, 3))
    assert len(acks) == 3
    assert {i: a.status for i, a in acks.items()} == {0: "superseded", 1: "superseded", 2: "applied"}
    assert "decision 2 supersedes it" in acks[0].error
    assert applier.applied == [("a", 2)]
    # Out of order: 5 is applied, then 4 (never seen) arrives late, then 5 again, then 6.
    await produce(kafka_bootstrap, topic, [make_decision("a", 5, decode=5)])
    await read_events(kafka_bootstrap, acks_topic, 4)
    await produce(kafka_bootstrap, topic, [make_decision("a", 4, decode=4),
                                          make_decision("a", 5, decode=5),
                                          make_decision("a", 6, decode=6)])
    events = await read_events(kafka_bootstrap, acks_topic, 6, settle=0.5)
    assert [(a.decision_id, a.status) for a in events] == [
        (0, "superseded"), (1, "superseded"), (2, "applied"), (5, "applied"),
        (4, "superseded"), (6, "applied")]
    assert applier.applied == [("a", 2), ("a", 5), ("a", 6)]


async def test_advisory_decisions_are_never_applied(kafka_bootstrap, connector_topics,
                                                    service_factory):
    applier = CountingApplier()
    service = await service_factory(applier)
    await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                  [make_decision("a", 0, advisory=True), make_decision("a", 1, advisory=True),
                   make_decision("a", 2, decode=2)])
    acks = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1, settle=1.0)
    assert [(a.decision_id, a.status) for a in acks] == [(2, "applied")]
    assert applier.applied == [("a", 2)]
    assert service.metrics.decisions("counting", "advisory")._value.get() == 2


async def test_a_failed_apply_is_acked_failed(kafka_bootstrap, connector_topics, service_factory):
    applier = CountingApplier()
    applier.fail_with = "quota exceeded"
    await service_factory(applier)
    await produce(kafka_bootstrap, connector_topics["decisions_topic"], [make_decision("a", 0)])
    (ack,) = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1)
    assert (ack.status, ack.error, ack.observed) == ("failed", "quota exceeded", {})


async def test_garbage_is_dead_lettered_and_the_connector_goes_on(kafka_bootstrap, connector_topics,
                                                                   service_factory):
    applier = CountingApplier()
    service = await service_factory(applier)
    ack_event = Ack(deployment="a", time=1.0, decision_id=0, status="applied")
    from fleetplan.schemas.codec import encode_event

    await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                  [b"\xff\xfenot json", b'{"type": "decision", "deployment": "a"}',
                   encode_event(ack_event), b""], key=b"a")
    await produce(kafka_bootstrap, connector_topics["decisions_topic"], [make_decision("a", 0)])
    (ack,) = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1)
    assert ack.status == "applied"
    letters = await read_events(kafka_bootstrap, connector_topics["deadletter_topic"], 4)
    assert all(isinstance(x, DeadLetter) and x.reason == "invalid" for x in letters)
    assert all(x.source_topic == connector_topics["decisions_topic"] for x in letters)
    details = sorted(x.detail for x in letters)
    assert any("valid JSON" in d for d in details)
    assert any("decision_id" in d or "required" in d for d in details)
    assert any("got ack" in d for d in details)
    assert any("empty message" in d for d in details)
    assert service.metrics.deadlettered.labels("invalid")._value.get() == 4


async def test_one_slow_deployment_does_not_hold_up_another(kafka_bootstrap, connector_topics,
                                                            service_factory):
    class SlowForA(CountingApplier):
        async def apply(self, decision):
            if decision.deployment == "a":
                await asyncio.sleep(3.0)
            return await super().apply(decision)

    applier = SlowForA()
    await service_factory(applier, decisions_topic=connector_topics["decisions_topic"])
    await produce(kafka_bootstrap, connector_topics["decisions_topic"],
                  [make_decision("a", 0), make_decision("b", 0)])
    (first,) = await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1, timeout=2.5)
    assert first.deployment == "b"


async def test_metrics_endpoint(kafka_bootstrap, connector_topics, service_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await service_factory(CountingApplier(), metrics_port=port)
    await produce(kafka_bootstrap, connector_topics["decisions_topic"], [make_decision("a", 0)])
    await read_events(kafka_bootstrap, connector_topics["acks_topic"], 1)
    applied = 'fleetplan_connector_decisions_total{backend="counting",outcome="applied"} 1.0'
    # the worker counts an outcome once the ack's send has returned, which a consumer can beat
    # to the ack by a few milliseconds: scrape until it has (a CI run saw the race)
    for _ in range(50):
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        )
        if applied in body:
            break
        await asyncio.sleep(0.1)
    assert applied in body
    assert 'fleetplan_connector_target_replicas{deployment="a",role="decode"} 3.0' in body
    assert "fleetplan_connector_consumer_lag" in body
