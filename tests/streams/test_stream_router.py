"""The router in-process: records in, outputs out (no broker).

A small harness plays the worker's part (table, outbox sending, offset
commits) so crash recovery can be checked at every point of the write order.
"""

from __future__ import annotations

import random
import re

import orjson
import pytest

from fleetplan.models.planner import Planner
from fleetplan.schemas import topics as canonical
from fleetplan.schemas.codec import MAX_EVENT_BYTES, encode_event
from fleetplan.schemas.events import ControlEvent, Decision
from fleetplan.streams.audit import refold_by_event_time
from fleetplan.streams.router import InputRecord, Router
from fleetplan.streams.tables import StoredDeployment
from fleetplan.streams.topics import CLOCKED, TICKS
from fleetplan.streams.watermark import Watermarks
from tests.streams.traffic import T0, deciding_planner, fpm, traffic

FPM, REQ = canonical.FPM, canonical.REQUESTS


class Log:
    """Input topics of one partition: records with offsets, in append order."""

    def __init__(self) -> None:
        self.records: list[InputRecord] = []
        self.next_offset: dict[str, int] = {}

    def append(self, topic: str, event=None, *, key: bytes | None = None, value: bytes | None = None) -> InputRecord:
        offset = self.next_offset.get(topic, 0)
        self.next_offset[topic] = offset + 1
        if event is not None:
            key = event.deployment.encode() if key is None else key
            value = encode_event(event)
        rec = InputRecord(topic, 0, offset, key, value, handle=(topic, offset))
        self.records.append(rec)
        return rec


def interleaved(deployments: list[str], seconds: float, seed: int, *, batch: int = 1,
                skew: float = 0.4) -> Log:
    """Several deployments' FPMs and requests, interleaved with up to ``skew`` s of skew
    (by default 0.4 s, less than the grace period)."""
    rng = random.Random(seed)
    tagged = []
    for dep in deployments:
        fpms, reqs = traffic(dep, seconds, batch=batch)
        tagged += [(e.time + rng.uniform(0, skew), FPM, e) for e in fpms]
        tagged += [(e.time + rng.uniform(0, skew), REQ, e) for e in reqs]
    tagged.sort(key=lambda x: x[0])
    log = Log()
    for _, topic, event in tagged:
        log.append(topic, event)
    return log


class Harness:
    """Plays the worker: routes batches, keeps the table, sends outboxes, commits offsets."""

    def __init__(self, planner: Planner, table: dict[str, bytes] | None = None) -> None:
        self.table: dict[str, bytes] = dict(table or {})
        self.router = Router(planner, Watermarks(CLOCKED, idle_after_s=1e9),
                             load=lambda n: StoredDeployment.from_bytes(self.table[n]) if n in self.table else None,
                             clock=lambda: T0)
        for name, raw in self.table.items():
            self.router.adopt(name, StoredDeployment.from_bytes(raw))
        self.sent: list[tuple[str, dict]] = []
        self.acked: set[tuple[str, int]] = set()
        self.now = 0.0

    def route(self, records, *, crash_after: str | None = None) -> bool:
        """One batch; ``crash_after`` in {"route", "save", "send"} stops there (kill -9)."""
        self.now += 0.01
        for r in records:
            r.received_at = self.now
        batch = self.router.route(records, self.now)
        if crash_after == "route":
            return False
        for dep, raw in self.router.saved(batch):
            self.table[dep.name] = raw
        if crash_after == "save":
            return False
        for out in batch.outputs():
            self.sent.append((out.topic, out.value))
        self.router.sent(batch)
        if crash_after == "send":
            return False
        self.acked.update(h for h in batch.release if h is not None)
        return True

    def committed(self, log: Log) -> dict[str, int]:
        """Per topic, the first offset not acknowledged: where a restart reads from."""
        out = {}
        for topic in log.next_offset:
            offset = 0
            while (topic, offset) in self.acked:
                offset += 1
            out[topic] = offset
        return out

    def recover_outboxes(self) -> None:
        """What the worker does on recovery: re-send outboxes, skipping recorded decisions."""
        recorded = {(v["deployment"], v["decision_id"]) for t, v in self.sent if t == canonical.DECISIONS}
        for dep in self.router.deployments.values():
            for out in dep.outbox:
                if out.topic == canonical.DECISIONS and (dep.name, out.value["decision_id"]) in recorded:
                    continue
                self.sent.append((out.topic, out.value))
            dep.outbox = []

    def decisions(self, deployment: str | None = None) -> list[dict]:
        return [v for t, v in self.sent if t == canonical.DECISIONS
                and (deployment is None or v["deployment"] == deployment)]


def run(planner: Planner, log: Log, seed: int) -> Harness:
    rng = random.Random(seed)
    h = Harness(planner)
    i = 0
    while i < len(log.records):
        n = rng.randint(1, 40)
        h.route(log.records[i:i + n])
        i += n
    return h


def test_decisions_do_not_depend_on_arrival_order_or_batching(planner):
    deps = ["alpha", "beta"]
    a = run(planner, interleaved(deps, 120, seed=1), seed=2)
    b = run(deciding_planner(), interleaved(deps, 120, seed=3), seed=4)
    for dep in deps:
        da, db = a.decisions(dep), b.decisions(dep)
        n = min(len(da), len(db))
        assert n >= 8
        assert da[:n] == db[:n]
        assert [d["decision_id"] for d in da] == list(range(len(da)))


def test_a_deployment_decides_alone_as_beside_another_whatever_the_other_sends():
    """The promise of one worker for many deployments: each one's outputs depend on its own
    events only. Beta changes its grace period, tick interval and engines, floors and
    advisory mode, sends a control intake refuses and one its tick refuses; alpha's and
    beta's decisions, tick reports and dead letters, interleaved in one partition and one
    router, equal each routed alone (all but the clock and watermark a tick fired under,
    which follow how records fall into batches)."""
    def control(t, body):
        return t, canonical.CONTROL, ControlEvent.model_validate({"deployment": "beta", "time": t, "body": body})

    def tagged(dep, extra=()):
        fpms, reqs = traffic(dep, 90)
        return [(e.time, FPM, e) for e in fpms] + [(e.time, REQ, e) for e in reqs] + list(extra)

    beta = tagged("beta", [
        control(T0 + 3.0, {"command": "set_config", "changes": {"grace_seconds": 6}}),
        control(T0 + 30.0, {"command": "set_config", "changes": {"load_adjustment_interval_seconds": 7}}),
        control(T0 + 40.0, {"command": "reset_perf", "changes": {"max_num_seqs": 64}}),
        control(T0 + 50.0, {"command": "set_min_endpoints", "minimums": {"agg": 3}}),
        control(T0 + 55.0, {"command": "set_advisory", "advisory": True}),
        control(T0 + 60.0, {"command": "set_config", "changes": {"max_gpu_budget": 0}}),
        control(T0 + 61.0, {"command": "set_config", "changes": {"ttft_msx": 1}}),
    ])

    def routed(*deployments):
        rng = random.Random(7)
        log = Log()
        for _, topic, event in sorted((x for d in deployments for x in d), key=lambda x: x[0] + rng.uniform(0, 0.9)):
            log.append(topic, event)  # out of order within alpha's 1 s grace
        return run(deciding_planner(), log, seed=8)

    def outputs(h, dep):
        return [(t, {k: v for k, v in value.items() if k not in ("clock", "watermark")})
                for t, value in h.sent if value["deployment"] == dep]

    alpha = tagged("alpha")
    together = routed(alpha, beta)
    for dep, alone in (("alpha", routed(alpha)), ("beta", routed(beta))):
        assert outputs(together, dep) == outputs(alone, dep)
    letters = {(v["deployment"], v["reason"]) for t, v in together.sent if t == canonical.DEADLETTER}
    assert letters == {("beta", "invalid")}
    assert together.router.deployments["beta"].state.rejected_controls == 1
    assert len(together.decisions("alpha")) >= 8


def test_worker_decisions_equal_the_audit_replay(planner):
    log = interleaved(["alpha"], 90, seed=5)
    h = run(planner, log, seed=6)
    events = [Decision.model_validate(v) for v in h.decisions("alpha")]
    from fleetplan.schemas.codec import decode_event

    inputs = [decode_event(r.value) for r in log.records]
    replay = [r.decision for r in refold_by_event_time(deciding_planner(), "alpha", inputs) if r.decision]
    assert events and [d.model_dump() for d in events] == [d.model_dump() for d in replay[:len(events)]]


def test_records_beyond_the_grace_period_decide_as_the_audit_replays(planner):
    """Up to 8 s of skew against 1 s of grace: some events arrive below the watermark
    (the router rolls back what it folded ahead of the tick) and some after their tick
    (late). The decisions still equal the audit's replay of the events it accepted."""
    from fleetplan.schemas.codec import decode_event

    log = interleaved(["alpha"], 120, seed=21, skew=8.0, batch=3)
    h = run(planner, log, seed=22)
    late = {(m[1], int(m[2])) for t, v in h.sent if t == canonical.DEADLETTER
            for m in [re.search(r"\[at ([^:\]]+):\d+:(\d+)\]", v["detail"])]}
    assert late and h.router.deployments["alpha"].ahead.rollbacks > 0
    inputs = [decode_event(r.value) for r in log.records if (r.topic, r.offset) not in late]
    replay = [r.decision for r in refold_by_event_time(deciding_planner(), "alpha", inputs) if r.decision]
    got = [Decision.model_validate(v) for v in h.decisions("alpha")]
    assert len(got) >= 8 and [d.model_dump() for d in got] == [d.model_dump() for d in replay[:len(got)]]


def test_packed_fpm_batches_decide_like_single_fpms(planner):
    single = run(planner, interleaved(["alpha"], 80, seed=7), seed=8)
    packed = run(deciding_planner(), interleaved(["alpha"], 80, seed=7, batch=16), seed=8)
    n = min(len(single.decisions()), len(packed.decisions()))
    assert n >= 5 and single.decisions()[:n] == packed.decisions()[:n]


def test_held_records_are_released_only_after_their_tick(planner):
    log = Log()
    h = Harness(planner)
    first = log.append(FPM, fpm("alpha", T0 + 0.5, 0))
    h.route([first])
    assert (FPM, 0) not in h.acked  # buffered for the tick at T0 + 5
    recs = [log.append(FPM, fpm("alpha", T0 + 1 + i, i + 1)) for i in range(6)]
    recs.append(log.append(REQ, None, key=b"alpha", value=encode_event(fpm("alpha", T0 + 6.5, 99))))
    h.route(recs)
    # The clock is T0 + 6.5 minus 1 s of grace: tick T0 + 5 fired, folding offsets 0..4.
    assert {(FPM, o) for o in range(5)} <= h.acked
    assert (FPM, 5) not in h.acked and (FPM, 6) not in h.acked


def test_late_event_is_dead_lettered_with_its_coordinates(planner):
    log = Log()
    h = Harness(planner)
    h.route([log.append(FPM, fpm("alpha", T0 + i, i)) for i in range(12)]
            + [log.append(REQ, fpm("alpha", T0 + 11.5, 100))])
    assert h.router.deployments["alpha"].state.last_tick == T0 + 10
    late = log.append(FPM, fpm("alpha", T0 + 3, 50))
    h.route([late])
    letters = [v for t, v in h.sent if t == canonical.DEADLETTER]
    assert len(letters) == 1
    assert letters[0]["reason"] == "late" and letters[0]["deployment"] == "alpha"
    assert f"[at {FPM}:0:{late.offset}]" in letters[0]["detail"]
    assert (FPM, late.offset) in h.acked
    assert h.router.deployments["alpha"].state.late_events == 1


@pytest.mark.parametrize(("key", "value", "reason", "needle"), [
    (b"alpha", b"\x00\xffgarbage", "invalid", "valid JSON"),
    (b"alpha", b'{"type": "fpm", "deployment": "alpha"}', "invalid", "time"),
    (b"alpha", b'{"type": "fpm", "deployment": "alpha", "time": 1, "role": "agg", "worker_id": "w", "extra": 1}',
     "invalid", "extra"),
    (b"alpha", b" " * (MAX_EVENT_BYTES + 1), "oversize", "bytes"),
    (b"beta", encode_event(fpm("alpha", T0, 0)), "invalid", "key"),
    (None, encode_event(fpm("alpha", T0, 0)), "invalid", "key"),
    (b"alpha", b'{"type": "deadletter", "deployment": "alpha", "time": 1, "reason": "late", "detail": "x"}',
     "invalid", "input event"),
    (b"alpha", b"", "invalid", "empty"),
    (b"alpha", b'{"type": "fpm_batch", "deployment": "alpha", "time": 5, "fpms": ['
               b'{"deployment": "alpha", "time": 5, "role": "agg", "worker_id": "w"},'
               b'{"deployment": "beta", "time": 5, "role": "agg", "worker_id": "w"}]}',
     "invalid", "fpms.1.deployment: the batch's deployment 'alpha', got 'beta'"),
    (b"alpha", b'{"type": "fpm_batch", "deployment": "alpha", "time": 4, "fpms": ['
               b'{"deployment": "alpha", "time": 5, "role": "agg", "worker_id": "w"}]}',
     "invalid", "time: at least the latest time of the batch's FPMs (5.0), got 4.0"),
    (b"alpha", b'{"type": "control", "deployment": "alpha", "time": 1, '
               b'"body": {"command": "set_config", "changes": {"ttft_ms": -1}}}',
     "invalid", "body.changes: set_config: ttft_ms"),
    (b"alpha", b'{"type": "control", "deployment": "alpha", "time": 1, '
               b'"body": {"command": "set_config", "changes": {"max_num_seqs": 3}}}',
     "invalid", "max_num_seqs: fixed when the deployment starts"),
    (b"alpha", b'{"type": "control", "deployment": "alpha", "time": 1, '
               b'"body": {"command": "set_config", "changes": {"ttft_ms": true}}}',
     "invalid", "body.changes: set_config: ttft_ms: expected a number, got true"),
    (b"alpha", b'{"type": "control", "deployment": "alpha", "time": 100, "body": {"command": "seed_traffic", '
               b'"windows": [{"start_s": -70, "duration_s": 180, "num_req": 9, "isl": 1, "osl": 1}]}}',
     "invalid", "body.windows.0: ends at 110, after the event's time 100"),
])
def test_invalid_records_are_dead_lettered_with_a_reason(planner, key, value, reason, needle):
    log = Log()
    h = Harness(planner)
    bad = log.append(FPM, key=key, value=value)
    good = log.append(FPM, fpm("alpha", T0, 0))
    assert h.route([bad, good])
    letters = [v for t, v in h.sent if t == canonical.DEADLETTER]
    assert len(letters) == 1
    assert letters[0]["reason"] == reason
    assert needle in letters[0]["detail"]
    assert len(letters[0]["payload"]) <= 4096
    assert (FPM, bad.offset) in h.acked
    assert "alpha" in h.router.deployments  # the good record after it was routed


def route_with_crashes(log, rng, crash_after, *, max_batch: int, crash_chance: float,
                       before_crash=None) -> tuple[Harness, int]:
    """Route ``log`` in random batches, killing the worker (up to 3 times) after
    ``crash_after`` and restarting it from the table and the committed offsets.

    ``before_crash(h)`` sees each harness just before it is replaced.
    """
    h = Harness(deciding_planner())
    pending, crashes = list(log.records), 0
    while pending:
        n = rng.randint(1, max_batch)
        batch, pending = pending[:n], pending[n:]
        if crashes < 3 and rng.random() < crash_chance:
            h.route(batch, crash_after=crash_after)
            if before_crash is not None:
                before_crash(h)
            crashes += 1
            survivor = Harness(deciding_planner(), h.table)
            survivor.sent, survivor.acked = h.sent, h.acked
            survivor.recover_outboxes()
            h = survivor
            # Kafka redelivers each topic from its committed offset.
            committed = h.committed(log)
            pending = [r for r in log.records if r.offset >= committed[r.topic]]
            continue
        h.route(batch)
    return h, crashes


@pytest.mark.parametrize("crash_after", ["route", "save", "send"])
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_crash_at_any_point_resumes_without_gap_or_repeat(crash_after, seed):
    """kill -9 between any two steps of the write order, restart from the table and the
    committed offsets: the decision stream equals an uninterrupted run's."""
    log = interleaved(["alpha", "beta"], 150, seed=seed)
    reference = run(deciding_planner(), log, seed=seed)

    h, crashes = route_with_crashes(log, random.Random(seed), crash_after, max_batch=40, crash_chance=0.05)
    assert crashes >= 1
    for dep in ("alpha", "beta"):
        got, want = h.decisions(dep), reference.decisions(dep)
        assert [d["decision_id"] for d in got] == list(range(len(got)))
        n = min(len(got), len(want))
        assert n >= 10 and got[:n] == want[:n]


@pytest.mark.parametrize("crash_after", ["route", "save", "send"])
def test_crash_with_events_beyond_the_grace_period_matches_the_audit(crash_after):
    """Crashes while events arrive below the watermark (rolled back) and after their tick
    (late): what the table holds is the state as of the last tick, so the decisions still
    equal the audit's replay of the accepted events, without gap or repeat."""
    from fleetplan.schemas.codec import decode_event

    log = interleaved(["alpha"], 150, seed=31, skew=8.0, batch=3)
    rollbacks = []

    def count_rollbacks(harness: Harness) -> None:
        rollbacks.append(harness.router.deployments["alpha"].ahead.rollbacks)

    h, crashes = route_with_crashes(log, random.Random(32), crash_after, max_batch=20, crash_chance=0.08,
                                    before_crash=count_rollbacks)
    count_rollbacks(h)
    rollbacks = sum(rollbacks)
    assert crashes >= 1 and rollbacks > 0
    late = {(m[1], int(m[2])) for t, v in h.sent if t == canonical.DEADLETTER
            for m in [re.search(r"\[at ([^:\]]+):\d+:(\d+)\]", v["detail"])]}
    inputs = [decode_event(r.value) for r in log.records if (r.topic, r.offset) not in late]
    replay = [r.decision for r in refold_by_event_time(deciding_planner(), "alpha", inputs) if r.decision]
    got = h.decisions("alpha")
    assert [d["decision_id"] for d in got] == list(range(len(got)))
    assert len(got) >= 8 and got == [orjson.loads(encode_event(d)) for d in replay[:len(got)]]


def test_folding_ahead_changes_no_output_table_record_or_release(monkeypatch):
    """Batch by batch, the router writes, stores and releases exactly what it would
    if it folded every event at its tick (skew beyond grace: rollbacks and late events;
    folding ahead within batches too)."""
    import fleetplan.streams.router as router_module
    from fleetplan.models import sequencer

    log = interleaved(["alpha", "beta"], 90, seed=41, skew=8.0, batch=3)
    rng = random.Random(42)
    eager, plain = Harness(deciding_planner()), Harness(deciding_planner())
    eager.router.fold_every = 4  # fold ahead within batches too
    i = 0
    while i < len(log.records):
        n = rng.randint(1, 20)
        eager.route(log.records[i:i + n])
        with monkeypatch.context() as m:
            m.setattr(router_module, "advance",
                      lambda p, s, w, ahead=None, max_ticks=None: sequencer.advance(p, s, w, max_ticks=max_ticks))
            m.setattr(router_module, "offer", lambda s, e, ahead=None, raw=None: sequencer.offer(s, e))
            plain.route(log.records[i:i + n])
        i += n
        assert eager.table == plain.table
        assert eager.sent == plain.sent and eager.acked == plain.acked
    assert any(d.ahead.rollbacks for d in eager.router.deployments.values())
    assert any(d.state.late_events for d in eager.router.deployments.values())
    assert all(not d.ahead.applied for d in plain.router.deployments.values())


def test_stored_record_round_trips_without_the_buffer(planner):
    log = interleaved(["alpha"], 30, seed=9)
    h = run(planner, log, seed=10)
    raw = h.table["alpha"]
    stored = StoredDeployment.from_bytes(raw)
    assert stored.state["buffer"] == []
    assert stored.partition == 0 and set(stored.positions) == {FPM, canonical.REQUESTS}
    assert orjson.loads(raw)["v"] == 1


def test_the_traffic_mirror_counts_arrivals_as_the_core_does():
    """Once a deployment sends arrivals the core counts demand from them; so must the mirror."""
    import math

    from fleetplan.models.config import config_from_dict
    from fleetplan.schemas.events import RequestArrival
    from fleetplan.streams.tables import TrafficSums
    from tests.streams.traffic import request

    planner = Planner(config_from_dict({"mode": "agg", "throughput_adjustment_interval_seconds": 20,
                                        "grace_seconds": 1}))
    router = Router(planner, Watermarks(CLOCKED, idle_after_s=1e9))
    offsets: dict[str, int] = {}

    def record(topic, event):
        n = offsets[topic] = offsets.get(topic, -1) + 1
        return InputRecord(topic, 0, n, b"alpha", encode_event(event), received_at=0.0, handle=(topic, n))

    records = []
    for i in range(400):
        t = T0 + i * 0.25
        records.append(record(canonical.FPM, fpm("alpha", t, i)))
        if i % 2 == 0:
            records.append(record(canonical.REQUESTS, RequestArrival(deployment="alpha", time=t, request_id=f"a{i}",
                                                                     input_tokens=100)))
            records.append(record(canonical.REQUESTS, request("alpha", t, i)))
    mirror: dict[float, TrafficSums] = {}
    checked, last = [], None
    for start in range(0, len(records), 30):
        batch = router.route(records[start:start + 30], 0.0)
        for add in batch.mirror:  # what PlannerWorker._mirror folds into its table
            mirror.setdefault(math.floor(add.event.time / 20) * 20, TrafficSums()).add(add.event)
        for tick in batch.ticks:
            report = tick.report
            if report.observed is not None and last == report.time - 20:
                sums = mirror[report.time - 20]
                checked.append(sums.mismatch(report.observed.__dict__,
                                             by_arrival=router.deployments["alpha"].state.seen_arrivals))
            last = report.time if report.observed is not None else last
    assert len(checked) >= 3 and checked == [None] * len(checked)


@pytest.mark.parametrize("read_early", [True, False])
def test_a_set_config_is_judged_in_event_time_whenever_it_is_read(read_early):
    """B (min_gpu_budget 12) is valid only after A (max_gpu_budget 16 over 8) is folded.

    Intake judges a change on its own (models/config_changes.py), so whether B
    is read before or after A's tick, both apply at their ticks, and the worker
    decides what the audit's refold in event time decides.
    """
    from fleetplan.models.config import config_from_dict
    from fleetplan.schemas.events import ControlEvent, SetConfig
    from tests.streams.traffic import DECIDING_CONFIG

    def make_planner():
        return Planner(config_from_dict({**DECIDING_CONFIG, "max_gpu_budget": 8}))

    def control(t, changes):
        return ControlEvent(deployment="alpha", time=t, body=SetConfig(changes=changes))

    a, b = control(T0 + 2.0, {"max_gpu_budget": 16}), control(T0 + 6.0, {"min_gpu_budget": 12})
    fpms, reqs = traffic("alpha", 60)
    log = Log()
    log.append(canonical.CONTROL, a)
    if read_early:
        log.append(canonical.CONTROL, b)
    for e in sorted(fpms + reqs, key=lambda e: e.time):
        log.append(FPM if e.type == "fpm" else canonical.REQUESTS, e)
        if not read_early and e.time == T0 + 6.25:  # within the grace period after its time
            log.append(canonical.CONTROL, b)
    h = Harness(make_planner())
    for i in range(0, len(log.records), 5):
        h.route(log.records[i:i + 5])
    assert [v for t, v in h.sent if t == canonical.DEADLETTER] == []
    state = h.router.deployments["alpha"].state
    assert (state.config.min_gpu_budget, state.config_version, state.rejected_controls) == (12, 2, 0)
    audit = [r.decision for r in refold_by_event_time(make_planner(), "alpha", [a, b, *fpms, *reqs]) if r.decision]
    assert [d["decision_id"] for d in h.decisions("alpha")] == [d.decision_id for d in audit]
    assert [d["config_version"] for d in h.decisions("alpha")] == [d.config_version for d in audit]


def test_a_set_config_wrong_only_against_the_config_is_counted_at_its_tick():
    """B before A in event time: at B's tick the ceiling is still 8, so B changes nothing."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.schemas.events import ControlEvent, SetConfig
    from tests.streams.traffic import DECIDING_CONFIG

    planner = Planner(config_from_dict({**DECIDING_CONFIG, "max_gpu_budget": 8}))
    log = Log()
    log.append(canonical.CONTROL, ControlEvent(deployment="alpha", time=T0 + 2.0,
                                               body=SetConfig(changes={"min_gpu_budget": 12})))
    log.append(canonical.CONTROL, ControlEvent(deployment="alpha", time=T0 + 6.0,
                                               body=SetConfig(changes={"max_gpu_budget": 16})))
    fpms, reqs = traffic("alpha", 20)
    for e in sorted(fpms + reqs, key=lambda e: e.time):
        log.append(FPM if e.type == "fpm" else canonical.REQUESTS, e)
    h = Harness(planner)
    h.route(log.records)
    state = h.router.deployments["alpha"].state
    assert [v for t, v in h.sent if t == canonical.DEADLETTER] == []
    assert (state.config.min_gpu_budget, state.config.max_gpu_budget, state.rejected_controls) == (-1, 16, 1)


def test_a_record_on_the_wrong_partition_does_not_decide_where_its_deployment_lives():
    """With the partition count known, a deployment lives on its murmur2 partition from its
    first record on: a stray first record on another partition is refused, not adopted."""
    from fleetplan.streams.topics import partition_for

    right = partition_for("alpha", 8)
    wrong = (right + 1) % 8
    router = Router(deciding_planner(), Watermarks(CLOCKED, idle_after_s=1e9), clock=lambda: T0, partitions=8)
    stray = ControlEvent(deployment="alpha", time=T0 - 1, body={"command": "set_advisory", "advisory": False})
    batch = router.route([InputRecord(canonical.CONTROL, wrong, 0, b"alpha", encode_event(stray))], 0.0)
    assert dict(batch.dead) == {"invalid": 1} and router.partition_of("alpha") is None
    assert f"lives on partition {right}, record came on {wrong}" in batch.invalid[0].value["detail"]
    fpms, _ = traffic("alpha", 5)
    batch = router.route([InputRecord(FPM, right, i, b"alpha", encode_event(e)) for i, e in enumerate(fpms)], 1.0)
    assert not batch.dead and router.partition_of("alpha") == right


def _with_control(seconds: float, control: ControlEvent) -> Log:
    """One deployment's FPMs and requests with one control event, in event-time order."""
    fpms, reqs = traffic("a", seconds)
    tagged = sorted([(e.time, FPM, e) for e in fpms] + [(e.time, REQ, e) for e in reqs]
                    + [(control.time, canonical.CONTROL, control)], key=lambda x: x[0])
    log = Log()
    for _, topic, event in tagged:
        log.append(topic, event)
    return log


def _deliver(h: Harness, records, n: int = 10) -> None:
    for i in range(0, len(records), n):
        h.route(records[i:i + n])


def _a_floor_control_folded():
    """A log with a set_min_endpoints control at T0 + 22.1, and a harness that routed it all."""
    control = ControlEvent.model_validate({"deployment": "a", "time": T0 + 22.1,
                                           "body": {"command": "set_min_endpoints", "minimums": {"agg": 6}}})
    log = _with_control(60, control)
    reference = Harness(deciding_planner())
    _deliver(reference, log.records)
    return log, reference


def test_a_record_buffered_before_a_crash_is_folded_however_the_topics_come_back():
    """Kafka orders records within a partition only: after a restart a busy topic's
    backlog can come back before a sparse topic's record that the saved state had
    buffered. No tick fires before that record is read again, so it is folded as in
    the run without the crash, not dropped (it was, silently, before 2026-12-05)."""
    log, reference = _a_floor_control_folded()

    h = Harness(deciding_planner())
    cut = next(i for i, r in enumerate(log.records) if r.topic == FPM and orjson.loads(r.value)["time"] >= T0 + 24)
    _deliver(h, log.records[:cut])
    assert any(e.type == "control" for e in h.router.deployments["a"].state.buffer)
    survivor = Harness(deciding_planner(), h.table)
    survivor.sent, survivor.acked = h.sent, h.acked
    survivor.recover_outboxes()
    assert survivor.router.deployments["a"].awaiting[canonical.CONTROL] == 0
    committed = survivor.committed(log)
    pending = [r for r in log.records if r.offset >= committed[r.topic]]
    dense = [r for r in pending if r.topic != canonical.CONTROL]
    sparse = [r for r in pending if r.topic == canonical.CONTROL]
    survivor.route(dense[:200])  # the backlog first: the clock passes the control's tick
    assert survivor.router.deployments["a"].state.last_tick == h.router.deployments["a"].state.last_tick
    _deliver(survivor, sparse + dense[200:])

    dep = survivor.router.deployments["a"]
    assert dep.awaiting == {} and dep.state.late_events == 0
    assert dep.state.min_overrides == {"agg": 6}
    assert not [v for t, v in survivor.sent if t == canonical.DEADLETTER]
    assert survivor.decisions("a") == reference.decisions("a")
    assert {"agg": 6} in [d["targets"] for d in survivor.decisions("a")]


def test_a_grace_period_changed_by_a_tick_applies_to_the_next_tick_of_the_same_batch():
    """A set_config raising the grace period from 1 to 10 s is applied at the tick of
    T0+5; an event 8.7 s behind the clock is then within grace. Whether the ticks after
    the change fire in the batch that applied it or in a later one must not decide
    whether that event is late."""
    from tests.streams.traffic import request

    control = ControlEvent.model_validate({"deployment": "a", "time": T0 + 4.0,
                                           "body": {"command": "set_config", "changes": {"grace_seconds": 10}}})
    log = _with_control(40, control)
    end = next(i for i, r in enumerate(log.records) if r.topic == FPM and orjson.loads(r.value)["time"] >= T0 + 21)
    records = log.records[:end + 1]
    records.append(log.append(REQ, request("a", T0 + 12.3, 9999)))
    after = next(i for i, r in enumerate(records) if r.topic == FPM and orjson.loads(r.value)["time"] >= T0 + 6.5)

    outcomes = set()
    for cuts in ([after + 1, len(records) - 1], [after - 10, len(records) - 1]):
        h, start = Harness(deciding_planner()), 0
        for stop in [*cuts, len(records)]:
            h.route(records[start:stop])
            start = stop
        state = h.router.deployments["a"].state
        outcomes.add((state.config.grace_seconds, state.last_tick, state.late_events))
    assert outcomes == {(10.0, T0 + 10, 0)}


def test_a_clock_that_jumps_fires_its_ticks_a_bounded_number_per_batch(monkeypatch):
    """One FPM dated far ahead moves an FPM-only deployment's clock past thousands
    of ticks. Each tick leaves a diagnostics record in the outbox, saved with the
    deployment, so a day's jump at 5-s ticks (19 MB) broke the 16 MiB record limit
    on every restart. A batch now fires at most MAX_TICKS_PER_BATCH of them; the
    next batches fire the rest, in order."""
    import fleetplan.streams.router as router_module

    monkeypatch.setattr(router_module, "MAX_TICKS_PER_BATCH", 100)
    log = Log()
    h = Harness(deciding_planner())
    h.router.watermarks = Watermarks(CLOCKED, idle_after_s=0.005)  # the FPMs alone drive the clock
    h.route([log.append(FPM, fpm("a", T0 + i * 0.25, i)) for i in range(40)])
    jump = 2000.0  # 400 ticks of 5 s
    fired = []
    h.route([log.append(FPM, fpm("a", T0 + 10 + jump, 999))])
    fired.append(len([t for t, _ in h.sent if t == TICKS]))
    for i in range(5):
        h.route([log.append(FPM, fpm("a", T0 + 11 + jump + i, 1000 + i))])
        fired.append(len([t for t, _ in h.sent if t == TICKS]))
    per_batch = [b - a for a, b in zip([0, *fired], fired, strict=False)]
    assert max(per_batch) <= 100 and per_batch[0] == 100
    state = h.router.deployments["a"].state
    assert state.last_tick == T0 + 10 + jump  # every tick up to the watermark (3,013 s), none skipped
    times = [v["time"] for t, v in h.sent if t == TICKS]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert times[-1] == state.last_tick and len(times) == (times[-1] - times[0]) / 5 + 1
    assert max(len(raw) for raw in h.table.values()) < 200_000


def test_a_record_refused_at_intake_leaves_no_deployment_behind():
    """A set_config that can never apply, for a deployment never seen: dead-lettered, and
    nothing kept for it. The router built a whole planner state (perf models, forecaster;
    about 30 kB and 0.5 ms) for each such name before judging it, and kept it until the next
    rebalance, so a stream of bad controls grew the worker's memory without bound."""
    h = Harness(deciding_planner())
    log = Log()
    bad = [log.append(canonical.CONTROL, ControlEvent.model_validate(
        {"deployment": f"d{i}", "time": T0, "body": {"command": "set_config", "changes": {"ttft_msx": 1}}}))
        for i in range(50)]
    h.route(bad)
    letters = [v for t, v in h.sent if t == canonical.DEADLETTER]
    assert len(letters) == 50 and all("ttft_msx: unknown field" in v["detail"] for v in letters)
    assert h.router.deployments == {} and h.router.by_partition == {}
    assert {(canonical.CONTROL, r.offset) for r in bad} <= h.acked


def test_a_record_buffered_after_the_last_save_is_folded_however_the_topics_come_back():
    """As above, but the control record is read in a batch after the deployment's last
    save (its tick at T0+20 fired in an earlier batch, and no tick fires before the crash),
    so no saved record names it as awaited. Between ticks nothing made the deployment
    dirty: after the crash the FPM and request backlog fired T0+25 without it, and the
    control, read next, was dead-lettered late (it had been folded in the run without
    the crash). A buffered record of a topic that does not drive the clock (a control,
    an ack, an inventory event) now saves its deployment, so the stored record awaits it."""
    log, reference = _a_floor_control_folded()

    h = Harness(deciding_planner())
    at = next(i for i, r in enumerate(log.records) if r.topic == canonical.CONTROL)
    cut = next(i for i, r in enumerate(log.records) if r.topic == FPM and orjson.loads(r.value)["time"] >= T0 + 24)
    _deliver(h, log.records[:at])
    assert h.router.deployments["a"].state.last_tick == T0 + 20
    _deliver(h, log.records[at:cut], n=1)  # the control, then records that fire no tick
    assert h.router.deployments["a"].state.last_tick == T0 + 20
    survivor = Harness(deciding_planner(), h.table)
    survivor.sent, survivor.acked = h.sent, h.acked
    survivor.recover_outboxes()
    committed = survivor.committed(log)
    pending = [r for r in log.records if r.offset >= committed[r.topic]]
    dense = [r for r in pending if r.topic != canonical.CONTROL]
    sparse = [r for r in pending if r.topic == canonical.CONTROL]
    survivor.route(dense[:200])  # the backlog first: the clock passes the control's tick
    _deliver(survivor, sparse + dense[200:])

    dep = survivor.router.deployments["a"]
    assert dep.state.late_events == 0 and dep.state.min_overrides == {"agg": 6}
    assert not [v for t, v in survivor.sent if t == canonical.DEADLETTER]
    assert survivor.decisions("a") == reference.decisions("a")


def test_a_deployment_does_not_wait_for_a_buffered_record_that_retention_deleted():
    """The record a recovered deployment waits for (``awaiting``) is gone from its topic
    (retention: a control event buffered for a week, a worker down longer than that). It
    can never be read again, so the deployment must not wait for it: it waited forever,
    fired no tick, and held every record it read from then on."""
    control = ControlEvent.model_validate({"deployment": "a", "time": T0 + 22.1,
                                           "body": {"command": "set_min_endpoints", "minimums": {"agg": 6}}})
    log = _with_control(80, control)
    h = Harness(deciding_planner())
    cut = next(i for i, r in enumerate(log.records) if r.topic == FPM and orjson.loads(r.value)["time"] >= T0 + 24)
    _deliver(h, log.records[:cut])
    survivor = Harness(deciding_planner(), h.table)
    survivor.sent, survivor.acked = h.sent, h.acked
    assert survivor.router.deployments["a"].awaiting[canonical.CONTROL] == 0
    committed = survivor.committed(log)
    survivor.router.inputs_start_at(0, {canonical.CONTROL: 1, FPM: committed[FPM], REQ: committed[REQ]})
    _deliver(survivor, [r for r in log.records if r.offset >= committed[r.topic] and r.topic != canonical.CONTROL])
    dep = survivor.router.deployments["a"]
    assert dep.awaiting == {} and dep.state.last_tick == T0 + 75
    assert len(dep.held) < 40


def test_a_pause_of_every_source_makes_no_record_late_when_they_come_back():
    """Every input of a deployment pauses longer than ``idle_after`` (the broker or the bridge
    was down), then the backlog is read, one topic's records first. The request records were
    as silent as the FPMs, not down: none of them may come in late for a tick that the FPMs
    alone moved the clock past (until 2026-12-05 every one of them did, dead-lettered)."""
    log = Log()
    h = Harness(deciding_planner())
    h.router.watermarks = Watermarks(CLOCKED, idle_after_s=5)
    fpms, reqs = traffic("a", 40)
    h.route([log.append(FPM, e) for e in fpms if e.time < T0 + 15]
            + [log.append(REQ, e) for e in reqs if e.time < T0 + 15])
    h.now += 30.0  # the outage: nothing read for 30 s of wall time
    h.route([log.append(FPM, e) for e in fpms if e.time >= T0 + 15])
    h.route([log.append(REQ, e) for e in reqs if e.time >= T0 + 15])
    assert [v["detail"] for t, v in h.sent if t == canonical.DEADLETTER] == []
    assert h.router.deployments["a"].state.late_events == 0
