"""The connector's routing of decision records and its lease on a claim, in process (no broker, no Redis)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from fleetplan.connectors import worker as worker_module
from fleetplan.connectors.base import wait_for_topic
from fleetplan.connectors.ledger import Entry
from fleetplan.connectors.log import LogApplier
from fleetplan.connectors.metrics import ConnectorMetrics
from fleetplan.connectors.worker import (
    ConnectorService,
    ServiceSettings,
    _ClaimBusy,
    _PartitionOffsets,
    _Ticket,
)
from fleetplan.schemas import topics
from fleetplan.schemas.codec import encode_event
from tests.connectors.conftest import make_decision


async def test_decisions_of_other_deployments_are_committed_past_with_one_warning(caplog):
    """Skipping them moves the commit on, so a connector serving them must not share the group."""
    metrics = ConnectorMetrics("log")
    service = ConnectorService(LogApplier(), ledger=None, metrics=metrics,
                               settings=ServiceSettings("unused:1", deployments=frozenset({"llama"})))
    offsets = _PartitionOffsets()
    with caplog.at_level(logging.WARNING, logger="fleetplan.connector"):
        for offset in (4, 5):
            offsets.add(offset)
            service._inflight += 1
            record = SimpleNamespace(value=encode_event(make_decision("mistral", offset)), key=b"mistral",
                                     topic=topics.DECISIONS, partition=0, offset=offset)
            await service._route(record, _Ticket(offsets, offset, service))
    assert offsets.inflight == set() and not service._lanes
    assert metrics.registry.get_sample_value(
        "fleetplan_connector_decisions_total", {"backend": "log", "outcome": "ignored"}) == 2
    warnings = [r.getMessage() for r in caplog.records if "mistral" in r.getMessage()]
    assert len(warnings) == 1 and "--group-id" in warnings[0]


class _SlowApplier(LogApplier):
    """Applies for a long time, noting whether it was stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False

    async def apply(self, decision):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return dict(decision.targets)


class _TakenOverLedger:
    """A ledger whose claim another connector took over: every renewal finds it gone."""

    lease_s = 0.03

    async def renew(self, decision) -> bool:
        return False


async def test_an_apply_whose_claim_was_taken_over_stops():
    applier = _SlowApplier()
    service = ConnectorService(applier, ledger=_TakenOverLedger(), metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    with pytest.raises(_ClaimBusy, match="taken over"):
        await asyncio.wait_for(service._apply_leased(make_decision("llama", 3), recover=False), 5)
    assert applier.cancelled


class _RecordingApplier(LogApplier):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def apply(self, decision):
        self.calls.append("apply")
        return dict(decision.targets)

    async def recover(self, decision):
        self.calls.append("recover")
        return dict(decision.targets)


class _ReclaimLedger:
    """Answers ``reclaim`` (this run's own claim, asked again); records what it is given."""

    lease_s = 30.0

    def __init__(self) -> None:
        self.fail_record = 0

    async def begin(self, decision):
        return Entry("reclaim")

    async def record(self, decision, outcome):
        if self.fail_record:
            self.fail_record -= 1
            raise RedisConnectionError("reply lost")
        return outcome

    async def renew(self, decision) -> bool:
        return True


async def test_a_reclaimed_decision_is_applied_unless_this_run_had_begun_applying_it(monkeypatch):
    applier, ledger = _RecordingApplier(), _ReclaimLedger()
    service = ConnectorService(applier, ledger=ledger, metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    sent = []

    async def send_ack(decision, outcome):
        sent.append(outcome.status)

    monkeypatch.setattr(service, "_send_ack", send_ack)
    monkeypatch.setattr(service.ledger, "mark_acked", lambda d: asyncio.sleep(0), raising=False)
    # the claim's reply was lost before anything was applied: apply, do not declare it in doubt
    await service._handle(make_decision("llama", 1), None)
    # applied, but storing the outcome failed: asked again, it is recovered, not applied twice
    ledger.fail_record = 1
    with pytest.raises(RedisConnectionError):
        await service._handle(make_decision("llama", 2), None)
    await service._handle(make_decision("llama", 2), None)
    assert applier.calls == ["apply", "apply", "recover"]
    assert sent == ["applied", "applied"]


async def test_a_missing_topic_is_waited_for_with_a_line_that_says_why(caplog):
    answers = iter([False] * 9 + [True])

    async def exists() -> bool:
        return next(answers)

    poll = 2.0 ** -10  # binary fractions: the reminders fall on exact polls
    with caplog.at_level(logging.INFO, logger="test.wait"):
        await asyncio.wait_for(wait_for_topic("fleetplan.decisions.v1", exists, logging.getLogger("test.wait"),
                                              poll_s=poll, remind_s=4 * poll), 5)
    lines = [r.getMessage() for r in caplog.records]
    waiting = [x for x in lines if "does not exist yet" in x]
    assert len(waiting) == 3  # at the first look, then after every four polls (nine looks in all)
    assert "fleetplan.decisions.v1" in waiting[0] and "fleetplan worker or bridge" in waiting[0]
    assert lines[-1] == "topic fleetplan.decisions.v1 exists: subscribing"


async def test_a_topic_already_there_is_not_waited_for(caplog):
    async def exists() -> bool:
        return True

    with caplog.at_level(logging.INFO, logger="test.wait"):
        await wait_for_topic("t", exists, logging.getLogger("test.wait"))
    assert not caplog.records


class _Client:
    """Stands in for aiokafka's producer and consumer: notes what was called, in order."""

    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def subscribe(self, topics, listener) -> None:
        self.calls.append(f"{self.name} subscribe {','.join(topics)}")

    async def start(self) -> None:
        self.calls.append(f"{self.name} start")

    async def stop(self) -> None:
        self.calls.append(f"{self.name} stop")


async def test_the_connector_subscribes_only_once_the_decision_topic_exists(monkeypatch):
    """Until the worker or the bridge creates it (with auto-creation off, as in compose/), the start waits."""
    calls: list[str] = []
    answers = iter([False, False, True])

    async def exists(bootstrap, topic) -> bool:
        calls.append(f"exists {topic}")
        return next(answers)

    monkeypatch.setattr(worker_module, "AIOKafkaProducer", lambda **_: _Client(calls, "producer"))
    monkeypatch.setattr(worker_module, "AIOKafkaConsumer", lambda **_: _Client(calls, "consumer"))
    monkeypatch.setattr(worker_module, "topic_exists", exists)
    service = ConnectorService(LogApplier(), ledger=None, metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1", topic_poll_s=0.001))
    await asyncio.wait_for(service.start(), 5)
    await service._close_clients()
    d = topics.DECISIONS
    assert calls == ["producer start", f"exists {d}", f"exists {d}", f"exists {d}",
                     f"consumer subscribe {d}", "consumer start", "consumer stop", "producer stop"]


class _RebalancingConsumer:
    """One batch of two partitions; a rebalance moves partition 1 away while the connector
    dead-letters the bad record of partition 0 (its produce is an await)."""

    def __init__(self, service, batch) -> None:
        self.service, self.batch = service, batch
        self.assigned = set(batch)

    async def getmany(self, timeout_ms, max_records):
        if self.batch is None:
            self.service.stop()
            return {}
        batch, self.batch = self.batch, None
        return batch

    def assignment(self):
        return set(self.assigned)

    def highwater(self, tp):
        assert tp in self.assigned, "Partition is not assigned"  # as aiokafka's
        return 100

    async def commit(self, offsets) -> None:
        assert set(offsets) <= self.assigned, "Partition is not assigned"  # aiokafka's IllegalStateError

    async def rebalance(self, keep) -> None:
        await self.service._on_revoked(set(self.assigned))
        self.assigned = {keep}


async def test_a_rebalance_while_a_batch_is_handled_leaves_no_offsets_of_a_partition_it_moved():
    """The records after the rebalance are its new owner's (from the committed offset): none
    may be taken here, and no offsets kept for a partition this consumer no longer holds
    (aiokafka's ``highwater`` asserts on it, which ended the fetch loop, and a commit naming
    it is refused whole)."""
    from aiokafka.structs import TopicPartition

    tp0, tp1 = TopicPartition(topics.DECISIONS, 0), TopicPartition(topics.DECISIONS, 1)
    service = ConnectorService(LogApplier(), ledger=None, metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1", deployments=frozenset({"mistral"})))

    def record(tp, offset, value):
        return SimpleNamespace(value=value, key=b"llama", topic=tp.topic, partition=tp.partition, offset=offset)

    consumer = _RebalancingConsumer(service, {
        tp0: [record(tp0, 7, b"not json")],
        tp1: [record(tp1, 3, encode_event(make_decision("llama", 1)))],
    })
    service._consumer = consumer

    async def produce(topic, key, value):
        await consumer.rebalance(keep=tp0)

    service._produce = produce
    await asyncio.wait_for(service._fetch_loop(), 5)
    assert tp1 not in service._offsets
    assert service._inflight == 0


class _CorruptLedger:
    """A ledger whose stored outcome cannot be read: a defect, not an error the lane retries."""

    lease_s = 30.0

    async def begin(self, decision):
        raise ValueError("outcome: not JSON")


async def test_a_lane_that_fails_stops_the_connector_and_run_raises_it(caplog):
    """Before, the lane's task ended and nothing noticed: the deployment's decisions went unacked
    and its partition's commit was held for good, while the connector looked alive."""
    service = ConnectorService(LogApplier(), ledger=_CorruptLedger(), metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    offsets = _PartitionOffsets()
    offsets.add(4)
    service._inflight = 1
    record = SimpleNamespace(value=encode_event(make_decision("llama", 4)), key=b"llama",
                             topic=topics.DECISIONS, partition=0, offset=4)
    with caplog.at_level(logging.ERROR, logger="fleetplan.connector"):
        await service._route(record, _Ticket(offsets, 4, service))
        await asyncio.wait([service._lanes["llama"].task], timeout=5)
    assert service._stopping.is_set()
    assert "lane-llama: its lane failed (ValueError('outcome: not JSON'))" in caplog.text
    assert offsets.inflight == {4}  # not committed past: read again after the restart

    async def fetch_loop():
        return None

    async def shutdown():
        return None

    service._fetch_loop, service._shutdown = fetch_loop, shutdown
    with pytest.raises(ValueError, match="outcome: not JSON"):
        await service.run()


class _SilentLedger:
    """A Redis that stopped answering: a renewal neither returns nor raises (a black-holed socket)."""

    lease_s = 0.3

    async def renew(self, decision) -> bool:
        await asyncio.sleep(3600)
        return True


class _FlakyLedger:
    """Renewals fail ``failures`` times, then hold."""

    lease_s = 0.3

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def renew(self, decision) -> bool:
        if self.failures:
            self.failures -= 1
            raise RedisConnectionError("connection reset")
        return True


class _QuickApplier(LogApplier):
    async def apply(self, decision):
        await asyncio.sleep(0.5)
        return dict(decision.targets)


@pytest.mark.parametrize("ledger", [_SilentLedger(), _FlakyLedger(failures=100)], ids=["silent", "refusing"])
async def test_an_apply_whose_lease_cannot_be_renewed_stops_within_it(ledger):
    """Past its lease the claim may be another connector's. A renewal that hung (no socket
    timeout) let the apply run on for good; one that kept failing, until Redis came back."""
    applier = _SlowApplier()
    service = ConnectorService(applier, ledger=ledger, metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    with pytest.raises(_ClaimBusy, match="no renewal of the claim on decision 3 got through within its 0.3-s lease"):
        await asyncio.wait_for(service._apply_leased(make_decision("llama", 3), recover=False), 5)
    assert applier.cancelled


async def test_one_failed_renewal_within_the_lease_does_not_stop_the_apply():
    service = ConnectorService(_QuickApplier(), ledger=_FlakyLedger(failures=1), metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    observed = await asyncio.wait_for(service._apply_leased(make_decision("llama", 3), recover=False), 5)
    assert observed.status == "applied"


class _CancellingLedger:
    """A renewal that completes as the apply's clean-up cancels the renewing task: the race of
    CPython gh-86296, made certain."""

    lease_s = 0.003

    def __init__(self) -> None:
        self.task: asyncio.Task | None = None

    async def renew(self, decision) -> bool:
        self.task.cancel()
        return True


async def test_the_lease_renewal_ends_when_cancelled_as_a_renewal_completes():
    """Python 3.11's wait_for returns the result of a call that completed as its caller was
    cancelled, and drops the cancellation: around the renewal, the apply's clean-up then waited
    on a renewal loop that never ends."""
    ledger = _CancellingLedger()
    service = ConnectorService(LogApplier(), ledger=ledger, metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    ledger.task = task = asyncio.create_task(service._renew_lease(make_decision("llama", 1)))
    done, _ = await asyncio.wait({task}, timeout=1.0)
    if not done:
        task.cancel()  # the second cancel lands in the sleep and ends it; the test fails below
        await asyncio.wait({task}, timeout=1.0)
    assert done and task.cancelled()


def test_a_partition_whose_records_are_all_done_commits_past_the_last():
    """Kafka's committed offset is the next record to read: committing the last done record's
    own offset would hand it to every restart and rebalance again, and keep the lag gauge at 1."""
    offsets = _PartitionOffsets()
    for offset in (4, 5, 6):
        offsets.add(offset)
    offsets.done(4)
    offsets.done(6)
    assert offsets.committable() == 5  # 5 is still being handled
    offsets.done(5)
    assert offsets.committable() == 7


async def test_an_apply_whose_lease_cannot_be_renewed_stops_before_the_lease_runs_out():
    """Once the lease has run out another connector may take the decision over (the ledger
    counts it on Redis's clock), so the apply must have stopped by then, not only at some point."""
    lease = 1.5
    ledger = _SilentLedger()
    ledger.lease_s = lease
    applier = _SlowApplier()
    service = ConnectorService(applier, ledger=ledger, metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(_ClaimBusy, match="no renewal"):
        await asyncio.wait_for(service._apply_leased(make_decision("llama", 3), recover=False), 10)
    assert applier.cancelled and loop.time() - started < lease


class _AckMarkFailsLedger:
    """Stores outcomes like the real ledger; marking the first ack fails with a Redis error."""

    lease_s = 30.0

    def __init__(self) -> None:
        self.outcomes: dict[int, object] = {}
        self.acked: set[int] = set()
        self.fail_mark = 1

    async def begin(self, decision):
        if decision.decision_id in self.outcomes:
            return Entry("done", self.outcomes[decision.decision_id], decision.decision_id in self.acked)
        return Entry("apply")

    async def record(self, decision, outcome):
        self.outcomes[decision.decision_id] = outcome
        return outcome

    async def renew(self, decision) -> bool:
        return True

    async def mark_acked(self, decision) -> None:
        if self.fail_mark:
            self.fail_mark -= 1
            raise RedisConnectionError("reply lost")
        self.acked.add(decision.decision_id)


async def test_a_failed_ack_mark_is_retried_without_sending_or_counting_the_ack_again(monkeypatch):
    applier, ledger = _RecordingApplier(), _AckMarkFailsLedger()
    metrics = ConnectorMetrics("log")
    service = ConnectorService(applier, ledger=ledger, metrics=metrics,
                               settings=ServiceSettings("unused:1", retry_backoff_s=0.0))
    produced = []

    async def produce(topic, key, value):
        produced.append(topic)

    monkeypatch.setattr(service, "_produce", produce)
    await service._handle_retrying(make_decision("llama", 1), None)
    assert applier.calls == ["apply"] and ledger.acked == {1}
    assert len(produced) == 1  # the ack went out once; only marking it was retried
    assert metrics.registry.get_sample_value(
        "fleetplan_connector_decisions_total", {"backend": "log", "outcome": "applied"}) == 1
    assert metrics.registry.get_sample_value("fleetplan_connector_errors_total", {"component": "redis"}) == 1


async def test_observed_counts_of_roles_the_ack_cannot_carry_are_dropped_with_a_warning(caplog):
    """An orchestrator that reports {"gpus": 8} beside its roles (written straight into the
    virtual backend's hash) had the count dropped from the ack without a word (until 2026-12-05)."""

    class _Reporting(LogApplier):
        async def apply(self, decision):
            return {**decision.targets, "gpus": 8}

    service = ConnectorService(_Reporting(), ledger=_AckMarkFailsLedger(), metrics=ConnectorMetrics("log"),
                               settings=ServiceSettings("unused:1"))
    with caplog.at_level(logging.WARNING, logger="fleetplan.connector"):
        outcome = await service._apply(make_decision("llama", 1), recover=False)
    assert outcome.status == "applied" and "gpus" not in outcome.observed
    assert any("gpus" in r.getMessage() and "not a role" in r.getMessage() for r in caplog.records)
