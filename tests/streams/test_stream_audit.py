"""``fleetplan audit`` on a local JSONL log: every decision reproduced, or the first
divergence named (decision_id, field, recorded, recomputed) with a non-zero exit."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import orjson
import pytest

from fleetplan.models.fleet import Fleet
from fleetplan.schemas.codec import encode_event
from fleetplan.streams.audit import audit_log, first_difference
from tests.streams.traffic import FLEETPLAN, deciding_planner, traffic


def write_log(path: Path) -> list[dict]:
    """A log the way ``fleetplan simulate`` writes one: inputs in feed order, each
    decision right after the event whose tick produced it."""
    fpms, reqs = traffic("alpha", 90)
    fleet = Fleet(deciding_planner())
    lines, decisions = [], []
    for event in sorted(fpms + reqs, key=lambda e: e.time):
        lines.append(encode_event(event))
        for report in fleet.feed(event):
            if getattr(report, "decision", None) is not None:
                lines.append(encode_event(report.decision))
                decisions.append(orjson.loads(encode_event(report.decision)))
    for report in fleet.finish():
        if report.decision is not None:
            lines.append(encode_event(report.decision))
            decisions.append(orjson.loads(encode_event(report.decision)))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return decisions


def rewrite(path: Path, change) -> None:
    out = []
    for line in path.read_bytes().splitlines():
        obj = orjson.loads(line)
        obj = change(obj)
        if obj is not None:
            out.append(orjson.dumps(obj))
    path.write_bytes(b"\n".join(out) + b"\n")


def test_a_faithful_log_is_reproduced_decision_by_decision(tmp_path):
    log = tmp_path / "run.jsonl"
    decisions = write_log(log)
    result = audit_log(log, "alpha", planner=deciding_planner())
    assert result.ok, result.lines()
    assert result.reproduced == [d["decision_id"] for d in decisions] and len(decisions) >= 8


def test_a_tampered_decision_is_the_first_divergence(tmp_path):
    log = tmp_path / "run.jsonl"
    write_log(log)
    rewrite(log, lambda o: {**o, "targets": {"agg": 7}} if o.get("decision_id") == 3 else o)
    result = audit_log(log, "alpha", planner=deciding_planner())
    assert not result.ok
    d = result.divergence
    assert (d.decision_id, d.field, d.recorded, d.recomputed) == (3, "targets.agg", 7, 2)
    assert result.reproduced == [0, 1, 2]


def test_a_missing_decision_is_named(tmp_path):
    log = tmp_path / "run.jsonl"
    write_log(log)
    rewrite(log, lambda o: None if o.get("decision_id") == 2 else o)
    result = audit_log(log, "alpha", planner=deciding_planner())
    # the missing one is named (until 2026-12-05 the next, "recorded 3, recomputed 2")
    assert (result.divergence.decision_id, result.divergence.field) == (2, "decision_id")
    assert result.lines()[-1].startswith(
        "DIVERGED at decision 2: field decision_id: recorded \"3 where 2 was expected (missing or out of order)\"")


@pytest.mark.parametrize(("tamper", "code", "needle"), [
    (False, 0, "OK:"),
    (True, 1, "DIVERGED at decision 4: field targets.agg: recorded 9, recomputed 2"),
])
def test_the_cli_exit_code_says_whether_the_audit_passed(tmp_path, config_file, tamper, code, needle):
    log = tmp_path / "run.jsonl"
    write_log(log)
    if tamper:
        rewrite(log, lambda o: {**o, "targets": {"agg": 9}} if o.get("decision_id") == 4 else o)
    run = subprocess.run([FLEETPLAN, "audit", "--deployment", "alpha", "--log", str(log), "--config",
                          str(config_file)], capture_output=True, text=True, timeout=120)
    assert run.returncode == code, run.stdout + run.stderr
    assert needle in run.stdout


def test_first_difference_walks_nested_values():
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == ("a.b[1]", 2, 3)
    assert first_difference({"a": 1.0}, {"a": 1.0}) is None
    assert first_difference({"a": 1}, {"b": 1}) == ("a", 1, None)
    # floats are compared bit for bit: a sum taken in another order is a difference
    assert first_difference({"a": [0.1 + 0.2]}, {"a": [0.3]}) == ("a[0]", 0.1 + 0.2, 0.3)
    assert first_difference({"a": float("nan")}, {"a": float("nan")}) is None


def test_a_decision_one_ulp_off_is_the_first_divergence(tmp_path):
    """The audit's claim is that the core reproduces every decision bit for bit. A recorded
    float one ulp away from the recomputed one (a fold that applied the same events in another
    order can leave no more) diverges: a tolerant float compare would call that replay
    reproduced, and the tampered-decision tests above change only counts, which it still catches."""
    log = tmp_path / "run.jsonl"
    decisions = write_log(log)
    tampered = decisions[3]["time"]
    off = math.nextafter(tampered, math.inf)
    rewrite(log, lambda o: {**o, "time": off} if o.get("decision_id") == 3 else o)
    result = audit_log(log, "alpha", planner=deciding_planner())
    assert not result.ok
    d = result.divergence
    assert (d.decision_id, d.field, d.recorded, d.recomputed) == (3, "time", off, tampered)
    assert result.reproduced == [0, 1, 2]


def test_late_events_in_a_log_are_counted_as_refused(tmp_path):
    """A request moved after a tick that needed it is refused as the simulator's fold refuses
    it; the audit's first line says so (until 2026-12-05: "0 refused as late")."""
    log = tmp_path / "run.jsonl"
    write_log(log)
    lines = log.read_bytes().splitlines()
    first_request = next(i for i, line in enumerate(lines) if b'"type":"request"' in line)
    moved = lines.pop(first_request)
    lines.append(moved)  # fed after every tick: late
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = audit_log(log, "alpha", planner=deciding_planner())
    assert result.excluded_late == 1
    assert result.lines()[0].startswith(f"audit alpha from {log}: {len(lines) - 1 - _decisions(lines)} input events"
                                        " (1 refused as late, left out")


def _decisions(lines: list[bytes]) -> int:
    return sum(b'"type":"decision"' in line for line in lines)


def test_a_set_config_the_worker_dead_letters_is_skipped_in_a_log_as_on_kafka(tmp_path):
    """The worker refuses it at intake and folds nothing from it: the log's audit skips and
    counts it, as the Kafka audit does (until 2026-12-05 it stopped there, exit 2)."""
    log = tmp_path / "run.jsonl"
    decisions = write_log(log)
    bad = {"type": "control", "deployment": "alpha", "time": 1010.0,
           "body": {"command": "set_config", "changes": {"ttft_msx": 1}}}
    lines = log.read_bytes().splitlines()
    lines.insert(len(lines) // 3, orjson.dumps(bad))
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = audit_log(log, "alpha", planner=deciding_planner())
    assert result.ok and result.stopped is None and result.invalid == 1
    assert result.reproduced == [d["decision_id"] for d in decisions]


def test_a_report_that_cannot_be_drawn_keeps_a_divergences_exit_code(tmp_path, config_file):
    log = tmp_path / "run.jsonl"
    write_log(log)
    rewrite(log, lambda o: o if o["type"] == "decision" else None)  # decisions only: nothing to draw
    run = subprocess.run([FLEETPLAN, "audit", "--deployment", "alpha", "--log", str(log), "--config",
                          str(config_file), "--report", str(tmp_path / "rep"), "--seed-out", str(tmp_path / "s.jsonl")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "DIVERGED" in run.stdout
    assert "warning: --report: no events recorded for this deployment" in run.stderr
    assert "alpha: no input folded, no seed written" in run.stderr


# --- the Kafka audit on records handed to it (no broker) --------------------------------------


def _on_topics(monkeypatch, records: dict) -> None:
    """``read_partitions`` answers with ``records`` ({topic: [(key, value bytes), ...]}, partition 0)."""
    import fleetplan.streams.kafka_io as kafka_io
    from fleetplan.streams.kafka_io import LogRecord

    async def read(bootstrap, wanted, **kwargs):
        return {(t, p): [LogRecord(t, p, i, key, value, 0) for i, (key, value) in enumerate(records.get(t, []))]
                for t, p in wanted}

    monkeypatch.setattr(kafka_io, "read_partitions", read)


def _topics_of(log: Path) -> dict:
    from fleetplan.schemas import topics

    by_type = {"fpm": topics.FPM, "fpm_batch": topics.FPM, "request": topics.REQUESTS, "decision": topics.DECISIONS}
    out: dict = {}
    for line in log.read_bytes().splitlines():
        event = orjson.loads(line)
        out.setdefault(by_type[event["type"]], []).append((event["deployment"].encode(), line))
    return out


def test_an_unreadable_decision_on_kafka_stops_the_audit_there_named(tmp_path, monkeypatch):
    """The worker writes the decisions topic: a record it cannot read is damage, and the
    decisions after it cannot be matched to their ids (until 2026-12-05 it was skipped and
    the next decision blamed: "recorded 3, recomputed 2")."""
    from fleetplan.schemas import topics
    from fleetplan.streams.audit import audit_kafka

    log = tmp_path / "run.jsonl"
    write_log(log)
    records = _topics_of(log)
    key, value = records[topics.DECISIONS][2]
    records[topics.DECISIONS][2] = (key, value.replace(b'"throughput_reason":"', b'"throughput_reason":"x'))
    _on_topics(monkeypatch, records)
    result = audit_kafka("fake:9092", "alpha", partitions=1, planner=deciding_planner())
    assert result.ok and result.reproduced == [0, 1]
    assert result.stopped.startswith(f"{topics.DECISIONS}:0:2: not a decision (throughput_reason")
    assert "recomputed after the last recorded one not checked" in result.lines()[-1]


def test_an_unreadable_tick_record_tells_the_kafka_audit_nothing(tmp_path, monkeypatch):
    from fleetplan.streams.audit import audit_kafka
    from fleetplan.streams.topics import TICKS

    log = tmp_path / "run.jsonl"
    write_log(log)
    records = _topics_of(log)
    records[TICKS] = [(b"alpha", b"[1]"), (b"alpha", b'{"deployment": "alpha", "time": null}'), (b"alpha", b"{")]
    _on_topics(monkeypatch, records)
    result = audit_kafka("fake:9092", "alpha", partitions=1, planner=deciding_planner())
    assert result.ok, result.lines()


@pytest.mark.parametrize(("ticks", "diverged"), [
    # the worker fired the last decision's tick (its own ticks: the latest counts) and recorded
    # no decision for it: a decision lost
    (lambda t: [(b"alpha", t[5]), (b"alpha", t[8]), (b"alpha", t[7])], True),
    # the worker's last tick was before it: not yet written; another deployment's later tick
    # on the same partition says nothing of how far this one got
    (lambda t: [(b"alpha", t[7]), (b"beta", t[8] + 100.0)], False),
], ids=["lost", "not-yet-written"])
def test_the_kafka_audit_tells_a_lost_decision_from_one_not_yet_written(tmp_path, monkeypatch, ticks, diverged):
    """The tick records bound what the worker has decided: a recomputed decision up to its
    latest tick that is not on the decisions topic is a divergence, one after it is not yet
    recorded. Only junk tick records were tried: taking the earliest tick, or another
    deployment's, as the bound passed every test here."""
    from fleetplan.schemas import topics
    from fleetplan.streams.audit import audit_kafka
    from fleetplan.streams.topics import TICKS

    log = tmp_path / "run.jsonl"
    decisions = write_log(log)
    assert len(decisions) == 9
    records = _topics_of(log)
    records[topics.DECISIONS] = records[topics.DECISIONS][:-1]  # decision 8 never reached the topic
    times = [d["time"] for d in decisions]
    records[TICKS] = [(key, orjson.dumps({"deployment": key.decode(), "time": t})) for key, t in ticks(times)]
    _on_topics(monkeypatch, records)
    result = audit_kafka("fake:9092", "alpha", partitions=1, planner=deciding_planner())
    assert result.reproduced == list(range(8))
    if diverged:
        assert not result.ok and (result.divergence.decision_id, result.divergence.recorded) == (8, None)
    else:
        assert result.ok and result.beyond_horizon == 1, result.lines()
        assert result.lines()[-1].endswith(f"1 not yet recorded (after tick {times[7]})")
