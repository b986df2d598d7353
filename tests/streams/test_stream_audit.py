"""``fleetplan audit`` on a local JSONL log: every decision reproduced, or the first
divergence named (decision_id, field, recorded, recomputed) with a non-zero exit."""

from __future__ import annotations

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
    assert (result.divergence.decision_id, result.divergence.field) == (3, "decision_id")


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
