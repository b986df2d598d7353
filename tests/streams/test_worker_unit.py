"""The worker's persistence steps, without a broker.

- A worker given a deployment back re-sends the outbox it finds in the
  changelog. It remembers which stored state it delivered the outbox of,
  by content, not by the deployment's name: while the deployment was away
  another worker may have stored a new outbox (a decision) and died before
  sending it.
- The states are on the broker before the outputs go out: Faust's flush
  alone returns while changelog messages still wait in its buffer.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import fleetplan.streams.worker as worker_module
from fleetplan.schemas import topics as canonical
from fleetplan.streams.app import WorkerSettings, create_app
from fleetplan.streams.tables import Output, StoredDeployment
from fleetplan.streams.worker import PlannerWorker
from tests.streams.traffic import deciding_planner


def _stored(*decision_ids: int) -> bytes:
    state = deciding_planner().new_state("alpha").to_data()
    state["buffer"] = []
    outbox = [Output(canonical.DECISIONS, "alpha", {"type": "decision", "deployment": "alpha",
                                                     "decision_id": i, "time": 1.0}) for i in decision_ids]
    return StoredDeployment(0, state, {}, outbox).to_bytes()


@pytest.fixture
def worker(tmp_path, monkeypatch):
    settings = WorkerSettings(bootstrap="127.0.0.1:1", store="memory://", datadir=str(tmp_path), partitions=1)
    app = create_app(settings)
    w = PlannerWorker(app, deciding_planner(), settings)
    w.states = {}  # the changelog table (a dict stands in)
    w.sent = []

    async def seek(owned):
        pass

    async def send(outputs, partitions):
        w.sent.extend(outputs)

    async def read_back(bootstrap, parts, tail=None):  # the decisions topic holds none of them
        return {p: [] for p in parts}

    w._seek_to_resume, w._send = seek, send
    monkeypatch.setattr(worker_module, "read_partitions", read_back)
    inputs = [SimpleNamespace(topic=t, partition=0) for t in w.topics.inputs]
    monkeypatch.setattr(type(app), "consumer", property(lambda self: SimpleNamespace(assignment=lambda: inputs)))
    w.inputs = inputs
    return w


def test_an_outbox_stored_by_another_worker_is_sent_when_the_deployment_comes_back(worker):
    async def main():
        delivered = _stored(2)
        worker.states[b"alpha"] = delivered
        await worker._on_recovered()  # this worker owns alpha and delivers decision 2
        assert [o.value["decision_id"] for o in worker.sent] == [2]
        await worker._on_revoked(None, worker.inputs)
        worker.states[b"alpha"] = _stored(3)  # another worker stored decision 3, then died
        await worker._on_recovered()
        assert [o.value["decision_id"] for o in worker.sent] == [2, 3]

    asyncio.run(main())


def test_the_outbox_this_worker_delivered_is_not_sent_again(worker):
    async def main():
        worker.states[b"alpha"] = _stored(2)
        await worker._on_recovered()
        await worker._on_revoked(None, worker.inputs)
        await worker._on_recovered()  # the same stored state comes back: already delivered
        assert [o.value["decision_id"] for o in worker.sent] == [2]

    asyncio.run(main())


def test_the_states_are_acknowledged_before_persisting_goes_on():
    """_durable waits for every changelog message a table write put in the buffer."""
    from fleetplan.streams.worker import _changelog_writes, _durable

    class Buffer:  # Faust's ProducerBuffer, as far as a table write uses it
        def __init__(self):
            self.queued = []

        def put(self, fut):
            self.queued.append(fut)

    class Producer:
        def __init__(self):
            self.buffer = Buffer()

        async def flush(self):  # Faust's flush: may return with messages still waiting
            return None

    async def main():
        loop = asyncio.get_running_loop()
        producer = Producer()
        futures = [loop.create_future() for _ in range(2)]
        with _changelog_writes(producer.buffer) as written:
            for fut in futures:
                producer.buffer.put(fut)  # what a table write does
        assert written == futures and producer.buffer.queued == futures
        assert "put" not in vars(producer.buffer)  # the capture is gone
        waiting = asyncio.ensure_future(_durable(producer, written))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the broker has not acknowledged them
        futures[0].set_result("meta")
        await asyncio.sleep(0.01)
        assert not waiting.done()
        futures[1].set_result("meta")
        await asyncio.wait_for(waiting, 1)

    asyncio.run(main())


def test_state_writes_never_acknowledged_stop_the_worker_instead_of_hanging_it():
    from fleetplan.streams.worker import _durable

    class Producer:
        async def flush(self):
            return None

    async def main():
        never = [asyncio.get_running_loop().create_future() for _ in range(3)]
        never[0].set_result("meta")
        with pytest.raises(RuntimeError, match="2 of 3 state writes to the changelog not acknowledged within 0.05 s"):
            await _durable(Producer(), never, timeout_s=0.05)

    asyncio.run(main())


def test_a_revoked_partition_leaves_none_of_its_gauges_behind(worker, monkeypatch):
    """After a rebalance the new owner exports the deployment's gauges and its partitions' lag.
    The old owner's last values, frozen, were exported beside them for good: the dashboard's
    consumer lag (a sum by topic) counted the revoked partitions' backlog as never read, and the
    replicas panel drew the deployment's old targets as a second line."""
    from fleetplan.schemas.codec import encode_event
    from fleetplan.streams.router import InputRecord
    from tests.streams.traffic import traffic

    fpms, requests = traffic("alpha", 12.0)
    events = sorted([(canonical.FPM, e) for e in fpms] + [(canonical.REQUESTS, e) for e in requests],
                    key=lambda te: te[1].time)
    offsets: dict[str, int] = {}
    records = []
    for topic, event in events:
        offsets[topic] = offsets.get(topic, -1) + 1
        records.append(InputRecord(topic, 0, offsets[topic], b"alpha", encode_event(event), 0.0, offsets[topic]))
    consumer = SimpleNamespace(assignment=lambda: worker.inputs, highwater=lambda tp: 1000)
    monkeypatch.setattr(type(worker.app), "consumer", property(lambda self: consumer))
    registry = worker.metrics.registry

    def series(name: str) -> list:
        return [s for m in registry.collect() for s in m.samples if s.name == name]

    async def main():
        await worker._on_recovered()
        batch = worker.router.route(records, 1.0)
        assert batch.ticks
        worker._observe(batch, {(worker.topics.name(t), 0): o for t, o in offsets.items()}, 0.0)
        for name in ("fleetplan_replica_target", "fleetplan_consumer_lag", "fleetplan_engine_queue_depth",
                     "fleetplan_load_reason", "fleetplan_event_clock_seconds"):
            assert series(name), name
        await worker._on_revoked(None, worker.inputs)
        for name in ("fleetplan_replica_target", "fleetplan_replicas_ready", "fleetplan_throughput_lower_bound",
                     "fleetplan_startup_seconds", "fleetplan_consumer_lag", "fleetplan_engine_queue_depth",
                     "fleetplan_load_reason", "fleetplan_throughput_reason", "fleetplan_event_clock_seconds"):
            assert series(name) == [], name
        # counters stay: their rate falls to nothing, and they go on if the partition comes back
        assert series("fleetplan_ticks_total")

    asyncio.run(main())


def test_the_workers_producer_is_idempotent(tmp_path):
    """A send retried after a lost acknowledgement (a dropped connection, a broker restart)
    must not write a decision twice: the audit refuses a decision id recorded again."""
    settings = WorkerSettings(bootstrap="127.0.0.1:1", store="memory://", datadir=str(tmp_path), partitions=1)
    app = create_app(settings)

    async def main():
        return app.producer._new_producer()

    producer = asyncio.run(main())
    assert producer._txn_manager is not None  # aiokafka's idempotence: sequence numbers per partition
    assert producer._max_request_size >= 16 * 1024 * 1024
