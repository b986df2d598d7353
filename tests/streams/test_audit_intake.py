"""The Kafka audit skips what the worker dead-lettered at intake, as the worker did (no broker)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest

import fleetplan.streams.kafka_io as kafka_io
from fleetplan.schemas import topics as canonical
from fleetplan.schemas.events import ControlEvent
from fleetplan.streams.audit import _audit_kafka
from fleetplan.streams.topics import TICKS, Topics
from tests.streams.test_stream_router import FPM, REQ, Harness, Log
from tests.streams.traffic import T0, deciding_planner, traffic


@pytest.mark.parametrize("when", [T0 - 30, T0 + 30])
def test_a_set_config_refused_at_intake_is_not_folded_by_the_audit(monkeypatch, when):
    """Before the first traffic it would move the audit's first tick and report a false divergence."""
    log = Log()
    log.append(canonical.CONTROL, ControlEvent(
        deployment="alpha", time=when, body={"command": "set_config", "changes": {"ttft_msx": 300}}))
    fpms, requests = traffic("alpha", 90)
    for _, topic, event in sorted([(e.time, FPM, e) for e in fpms] + [(e.time, REQ, e) for e in requests],
                                  key=lambda x: (x[0], x[1])):
        log.append(topic, event)
    worker = Harness(deciding_planner())
    for i in range(0, len(log.records), 25):
        worker.route(log.records[i:i + 25])
    assert len(worker.decisions("alpha")) > 0

    topics = Topics("")
    written = {topics.decisions: [], topics.deadletter: [], topics.ticks: []}
    named = {canonical.DECISIONS: topics.decisions, canonical.DEADLETTER: topics.deadletter, TICKS: topics.ticks}
    for topic, value in worker.sent:
        written[named[topic]].append(value)

    async def read_partitions(bootstrap, wanted, tail=None):
        slices = {}
        for topic, partition in wanted:
            if topic in topics.inputs:
                slices[topic, partition] = [SimpleNamespace(key=r.key, value=r.value, offset=r.offset, partition=0)
                                            for r in log.records if r.topic == topics.logical(topic)]
            else:
                slices[topic, partition] = [SimpleNamespace(key=b"alpha", value=orjson.dumps(v), offset=i, partition=0)
                                            for i, v in enumerate(written[topic])]
        return slices

    monkeypatch.setattr(kafka_io, "read_partitions", read_partitions)
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert result.ok, "\n".join(result.lines())
    assert result.invalid == 1
