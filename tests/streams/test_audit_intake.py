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
    refused = ControlEvent(deployment="alpha", time=when,
                           body={"command": "set_config", "changes": {"ttft_msx": 300}})
    log, worker = _worker_run(seconds=90, extra=((canonical.CONTROL, refused),))
    assert len(worker.decisions("alpha")) > 0
    _reading(monkeypatch, log, *_written(worker))
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert result.ok, "\n".join(result.lines())
    assert result.invalid == 1


def _worker_run(snapshot_every: float = 0, seconds: float = 120, extra: tuple = (), start: float | None = None):
    """A worker run of one deployment in process: the log it read, and the worker
    (``extra``: more (topic, event) inputs, each before the traffic's of its time)."""
    log = Log()
    fpms, requests = traffic("alpha", seconds, **({} if start is None else {"start": start}))
    for _, topic, event in sorted([(e.time, topic, e) for topic, e in extra] + [(e.time, FPM, e) for e in fpms]
                                  + [(e.time, REQ, e) for e in requests], key=lambda x: (x[0], x[1])):
        log.append(topic, event)
    worker = Harness(deciding_planner())
    worker.router.snapshot_every = snapshot_every
    for i in range(0, len(log.records), 25):
        worker.route(log.records[i:i + 25])
    return log, worker


def _written(worker):
    """What the worker wrote, per output topic, and the topics' names."""
    topics = Topics("")
    written = {topics.decisions: [], topics.deadletter: [], topics.ticks: []}
    named = {canonical.DECISIONS: topics.decisions, canonical.DEADLETTER: topics.deadletter, TICKS: topics.ticks}
    for topic, value in worker.sent:
        written[named[topic]].append(value)
    return written, topics


def _routed_run(snapshot_every: float, seconds: float = 120, extra: tuple = ()):
    """``_worker_run``'s log, and what the worker wrote, per topic."""
    log, worker = _worker_run(snapshot_every, seconds, extra)
    return log, *_written(worker)


def _reading(monkeypatch, log, written, topics, *, cut_at: float | None = None, fpm_from: int | None = None):
    """Serve the run as Kafka would, the input topics' records before ``cut_at`` (event time),
    or the FPMs before offset ``fpm_from``, deleted by retention: the partitions then start past
    offset 0."""
    async def read_partitions(bootstrap, wanted, tail=None, starts=None):
        slices = {}
        for topic, partition in wanted:
            if topic in topics.inputs:
                every = kept = [r for r in log.records if r.topic == topics.logical(topic)]
                if cut_at is not None:
                    kept = [r for r in kept if orjson.loads(r.value)["time"] >= cut_at]
                if fpm_from is not None and topics.logical(topic) == FPM:
                    kept = [r for r in kept if r.offset >= fpm_from]
                slices[topic, partition] = [SimpleNamespace(key=r.key, value=r.value, offset=r.offset, partition=0)
                                            for r in kept]
                if starts is not None:  # the first offset kept; past the last when none is
                    starts[topic, partition] = kept[0].offset if kept else len(every)
            else:
                slices[topic, partition] = [SimpleNamespace(key=b"alpha", value=orjson.dumps(v), offset=i, partition=0)
                                            for i, v in enumerate(written[topic])]
        return slices

    monkeypatch.setattr(kafka_io, "read_partitions", read_partitions)


def test_the_worker_writes_a_snapshot_each_time_its_ticks_cross_the_period():
    _, written, topics = _routed_run(snapshot_every=30)
    snapshots = [r for r in written[topics.ticks] if r.get("type") == "snapshot"]
    assert [s["time"] for s in snapshots] == [1020.0, 1050.0, 1080.0, 1110.0]  # T0 = 1000, ticks every 5 s
    assert all(s["deployment"] == "alpha" and s["state"]["last_tick"] == s["time"] for s in snapshots)
    assert _routed_run(snapshot_every=0)[1][topics.ticks] == [r for r in written[topics.ticks]
                                                              if r.get("type") != "snapshot"]


def test_an_audit_since_a_snapshot_proves_the_decisions_after_it_with_the_older_inputs_gone(monkeypatch):
    """A deployment older than its FPMs' retention: the inputs before 1050 are deleted, so an
    audit from the first event diverges, and one from the snapshot at 1080 proves every decision
    made after it, as a worker restarted from that state made them."""
    log, written, topics = _routed_run(snapshot_every=30)
    decisions = written[topics.decisions]
    _reading(monkeypatch, log, written, topics, cut_at=1050.0)
    assert not asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1)).ok
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1051.0))
    assert result.ok, "\n".join(result.lines())
    after = [d["decision_id"] for d in decisions if d["time"] > 1080.0]
    assert after and result.reproduced == after and "snapshot of its tick at 1080.0" in result.source

    # a decision recorded after the snapshot that the inputs do not give is caught
    tampered = {**written, topics.decisions: [dict(d, targets={"agg": 99}) if d["decision_id"] == after[-1] else d
                                              for d in decisions]}
    _reading(monkeypatch, log, tampered, topics, cut_at=1050.0)
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1051.0))
    assert result.divergence is not None and result.divergence.decision_id == after[-1]


def test_an_audit_since_refuses_a_snapshot_whose_inputs_are_gone_or_none_at_all(monkeypatch):
    from fleetplan.streams.audit import NoSnapshot

    log, written, topics = _routed_run(snapshot_every=30)
    _reading(monkeypatch, log, written, topics, cut_at=1050.0)
    # the requests lost dated before 1050.25, the first kept: maybe after the snapshot at 1050
    with pytest.raises(NoSnapshot, match=r"requests.v1 partition 0 now starts at event time 1050\.25 .*"
                                         r"give a --since after 1051\.25"):
        asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1040.0))
    with pytest.raises(NoSnapshot, match="no snapshot of 'alpha' at or after it"):
        asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=5000.0))


def test_an_audit_since_refuses_a_snapshot_whose_tick_is_the_time_of_the_first_input_kept(monkeypatch):
    """A tick sees the events before it, so the snapshot at 1050 needs those at 1050. Two
    engines report at 1050 and retention keeps the second only: the first, lost, is dated no
    later than it, that is possibly 1050, and the audit cannot start at 1050."""
    from fleetplan.streams.audit import NoSnapshot
    from tests.streams.traffic import fpm

    log, written, topics = _routed_run(snapshot_every=30, extra=((FPM, fpm("alpha", 1050.0, 0, worker="w1")),))
    second = next(r for r in log.records if r.topic == FPM and orjson.loads(r.value)["time"] == 1050.0
                  and orjson.loads(r.value)["worker_id"] == "w0")
    _reading(monkeypatch, log, written, topics, fpm_from=second.offset)
    with pytest.raises(NoSnapshot, match=r"fpm.v1 partition 0 now starts at event time 1050\.0 .*"
                                         r"give a --since after 1051\.0"):
        asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1041.0))
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1050.5))
    assert result.ok and "snapshot of its tick at 1080.0" in result.source, "\n".join(result.lines())


def test_a_snapshot_too_large_for_a_ticks_topic_of_kafkas_default_limit_is_left_out(monkeypatch):
    """A ticks topic created before the snapshots takes 1 MB records: a larger one would fail the
    batch and stop the worker, so it is not written (and counted)."""
    import fleetplan.streams.router as router

    monkeypatch.setattr(router, "SNAPSHOT_MAX_BYTES", 1000)
    _, written, topics = _routed_run(snapshot_every=30)
    assert written[topics.ticks] and not [r for r in written[topics.ticks] if r.get("type") == "snapshot"]


def test_the_report_of_an_audit_since_a_snapshot_starts_with_the_engines_it_held(monkeypatch, tmp_path):
    """Three engines inventory named before the snapshot at 1080, a fourth after it: the report
    of the audit from that snapshot draws all four, not only the one its inputs still name."""
    import fleetplan.sim.report as report
    from fleetplan.schemas.events import InventoryEvent
    from fleetplan.streams.audit import write_audit_report

    def ready(t, worker):
        return canonical.INVENTORY, InventoryEvent(deployment="alpha", time=t, worker_id=worker, role="agg",
                                                   state="ready", gpus=2)

    extra = (ready(T0 + 0.1, "w0"), ready(T0 + 1.1, "w1"), ready(T0 + 2.1, "w2"), ready(T0 + 100.1, "w3"))
    log, written, topics = _routed_run(snapshot_every=30, extra=extra)
    _reading(monkeypatch, log, written, topics)
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1051.0))
    assert result.ok, "\n".join(result.lines())
    drawn = []
    monkeypatch.setattr(report, "write_report", lambda out, results, *args: drawn.extend(results) or out)
    write_audit_report(result, deciding_planner().config, tmp_path)
    points = drawn[0].timeline.points
    assert [(c["agg"]["ready"], gpus) for _, c, gpus in points] == [(3, 6), (4, 8)]


def test_the_report_prices_engines_no_inventory_names_as_the_profiles(monkeypatch, tmp_path):
    """No inventory: each tick's ready engines cost the profile's engine GPUs (TP2: 2), as
    the planner's budget prices them; at 1 each the report showed half the GPU-hours."""
    import fleetplan.sim.report as report
    from fleetplan.streams.audit import write_audit_report

    log, written, topics = _routed_run(snapshot_every=0)
    _reading(monkeypatch, log, written, topics)
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert result.ok, "\n".join(result.lines())
    drawn = []
    monkeypatch.setattr(report, "write_report", lambda out, results, *args: drawn.extend(results) or out)
    write_audit_report(result, deciding_planner().config, tmp_path, profile_engine_gpus=2)
    points = [(c["agg"]["ready"], gpus) for _, c, gpus in drawn[0].timeline.points]
    assert any(ready for ready, _ in points)
    assert all(gpus == 2 * ready for ready, gpus in points)


def test_an_audit_since_refuses_when_retention_emptied_an_input_partition(monkeypatch):
    """A deployment whose FPMs stopped more than a day ago: the partition keeps none, so any of
    them may be after the snapshot (told by the partition's first offset, past 0)."""
    from fleetplan.streams.audit import NoSnapshot

    log, written, topics = _routed_run(snapshot_every=30)
    _reading(monkeypatch, log, written, topics, fpm_from=10**9)
    with pytest.raises(NoSnapshot, match=r"fpm.v1 partition 0 holds none now \(its retention cut them all\)"):
        asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1051.0))


def test_an_audit_folds_a_reset_perf_as_the_worker_did(monkeypatch):
    """The engines' KV cache grew at 1060: a queue of 9,000 prompt tokens no longer overflows
    it, so the worker's later decisions change, and the audit, folding the same control,
    proves every one of them."""
    reset = ControlEvent(deployment="alpha", time=1060.0,
                         body={"command": "reset_perf", "changes": {"max_kv_tokens": 100_000}})
    log, written, topics = _routed_run(snapshot_every=0, extra=((canonical.CONTROL, reset),))
    _, without, _ = _routed_run(snapshot_every=0)
    decided = [(d["time"], d["targets"]) for d in written[topics.decisions]]
    assert decided != [(d["time"], d["targets"]) for d in without[topics.decisions]]
    assert decided[:3] == [(d["time"], d["targets"]) for d in without[topics.decisions]][:3]
    _reading(monkeypatch, log, written, topics)
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert result.ok, "\n".join(result.lines())
    assert result.reproduced == [d["decision_id"] for d in written[topics.decisions]]


def test_a_late_heartbeat_dated_before_the_first_tick_does_not_move_the_audits_first_tick(monkeypatch):
    """A heartbeat that comes after the deployment's first tick, dated an interval before it
    (a second bridge that caught up late): the worker refuses it as late, so the audit must
    leave it out as it leaves out the other late events. Folded, it dated the audit's first
    tick at T0 + 5 instead of T0 + 15, and the audit diverged at decision 0 from a worker
    that had done nothing wrong."""
    from tests.streams.traffic import clock

    log, worker = _worker_run(seconds=40, start=T0 + 10)
    first = worker.decisions("alpha")[0]["time"]
    assert first == T0 + 15
    worker.route([log.append(REQ, clock("alpha", T0 + 1))])
    assert worker.router.deployments["alpha"].state.late_events == 1
    _reading(monkeypatch, log, *_written(worker))
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert result.ok, "\n".join(result.lines())
    assert result.excluded_late == 1
    assert result.reproduced == [d["decision_id"] for d in worker.decisions("alpha")]


def test_an_audit_since_judges_lost_inputs_by_the_grace_period_the_snapshot_had_in_force(monkeypatch):
    """A set_config raised the grace period from 1 s (the config file's) to 10 s, so the worker
    took records up to 10 s out of order. Retention kept the FPMs from 1075 on: one lost may
    be dated up to 1085, after the snapshot at 1080, so the audit from it is refused with the
    time to start at, not run on inputs that may lack one (and so diverge for no fault)."""
    from fleetplan.streams.audit import NoSnapshot

    raise_grace = ControlEvent(deployment="alpha", time=T0 + 0.5,
                               body={"command": "set_config", "changes": {"grace_seconds": 10}})
    log, written, topics = _routed_run(snapshot_every=30, extra=((canonical.CONTROL, raise_grace),))
    snapshot = next(r for r in written[topics.ticks] if r.get("type") == "snapshot" and r["time"] == 1080.0)
    assert snapshot["state"]["config"]["grace_seconds"] == 10
    first_kept = next(r for r in log.records if r.topic == FPM and orjson.loads(r.value)["time"] >= 1075.0)
    _reading(monkeypatch, log, written, topics, fpm_from=first_kept.offset)
    with pytest.raises(NoSnapshot, match=r"fpm.v1 partition 0 now starts at event time 1075\.0 .*10 s out of order\): "
                                         r"give a --since after 1085\.0"):
        asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1051.0))


def test_a_silence_of_days_is_skipped_by_the_worker_and_its_audit_alike(monkeypatch):
    """The traffic's second minute comes two days after its first: past a day of silence the
    worker skips the ticks (models/sequencer.py silent_through), in batches of 25 records and
    snapshots every 30 s, and the audit, folding the log in one go, skips the same ones and
    proves every decision."""
    gap = 2 * 86_400.0
    log = Log()
    fpms, requests = traffic("alpha", 120)
    shifted = [(e.time, topic, e if e.time < T0 + 60 else e.model_copy(update={"time": e.time + gap}))
               for topic, events in ((FPM, fpms), (REQ, requests)) for e in events]
    for _, topic, event in sorted(((e.time, topic, e) for _, topic, e in shifted), key=lambda x: (x[0], x[1])):
        log.append(topic, event)
    worker = Harness(deciding_planner())
    worker.router.snapshot_every = 30
    for i in range(0, len(log.records), 25):
        worker.route(log.records[i:i + 25])
    while True:  # a batch fires at most MAX_TICKS_PER_BATCH ticks: empty ones fire the rest
        sent = len(worker.sent)
        worker.route([])
        if len(worker.sent) == sent:
            break
    written, topics = _written(worker)
    decisions = written[topics.decisions]
    assert any(d["time"] > T0 + gap for d in decisions), "the traffic after the silence must decide"
    ticks = [r["time"] for r in written[topics.ticks] if r.get("type") != "snapshot"]
    assert len(ticks) < 2 * 86_400 / 5  # a day of silent ticks fired, not two
    _reading(monkeypatch, log, written, topics)
    result = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert result.ok, "\n".join(result.lines())
    assert result.reproduced == [d["decision_id"] for d in decisions]


def test_an_audit_since_counts_only_the_refused_and_invalid_inputs_from_the_snapshots_tick_on(monkeypatch):
    """The first line's counts are of the inputs the re-fold considered: from the snapshot's
    tick on. A late heartbeat and a refused set_config dated before it were counted as well,
    beside an input count that starts at the tick."""
    from tests.streams.traffic import clock

    refused = ControlEvent(deployment="alpha", time=T0 + 30,
                           body={"command": "set_config", "changes": {"ttft_msx": 300}})
    log, worker = _worker_run(snapshot_every=30, extra=((canonical.CONTROL, refused),))
    worker.route([log.append(REQ, clock("alpha", T0 + 1))])
    assert worker.router.deployments["alpha"].state.late_events == 1
    _reading(monkeypatch, log, *_written(worker))
    whole = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1))
    assert whole.ok and (whole.excluded_late, whole.invalid) == (1, 1)
    since = asyncio.run(_audit_kafka("fake:1", "alpha", deciding_planner(), "", 1, since=1051.0))
    assert since.ok, "\n".join(since.lines())
    assert (since.excluded_late, since.invalid) == (0, 0)
