"""A recorded run drawn as a simulated one: ``fleetplan audit --report`` on a simulate log.

The simulator's log holds what a live deployment would have recorded
(arrivals, request records with the frontend's TTFT and ITL, inventory,
FPMs, decisions). Rebuilt from those events alone, the run must measure
what the simulator measured from its own engines.
"""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from fleetplan.bootstrap import build_planner
from fleetplan.cli import _register_optional, app
from fleetplan.sim.recorded import recorded_run
from fleetplan.streams.audit import audit_log
from tests.sim.sim_helpers import CODE, ROOT

QUICKSTART = ROOT / "examples" / "configs" / "quickstart.yaml"
runner = CliRunner()


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    _register_optional()
    out = tmp_path_factory.mktemp("sim") / "run"
    result = runner.invoke(app, [
        "simulate", "--trace", str(CODE), "--profile", "h200-llama3.1-8b", "--config", str(QUICKSTART),
        "--duration", "300", "--rate-scale", "6", "--out", str(out), "--json", "--no-baselines",
        "--deployment", "code",
    ])
    assert result.exit_code == 0, result.output
    return out, orjson.loads(result.stdout)["results"]["planner"]


def test_the_rebuilt_run_measures_what_the_simulator_measured(simulated):
    out, measured = simulated
    planner = build_planner(QUICKSTART, "h200-llama3.1-8b")
    audit = audit_log(out / "events.jsonl", "code", planner=planner)
    assert audit.ok, audit.lines()
    cfg = planner.config
    run = recorded_run("code", audit.events, audit.reports, cfg.roles, {"prefill": 1, "decode": 1},
                       cfg.ttft_ms, cfg.itl_ms, 60.0)
    summary = run.result.summary
    assert run.unmeasured == 0
    assert summary.requests == measured["requests"]
    assert summary.sla_attainment == pytest.approx(measured["sla_attainment"], abs=1e-3)
    assert summary.ttft_p90_ms == pytest.approx(measured["ttft_p90_ms"], rel=1e-6)
    assert summary.gpu_hours == pytest.approx(measured["gpu_hours"], rel=0.02)
    assert summary.decisions == measured["decisions"]
    assert sum(n for _, n, _ in run.arrivals) == measured["requests"]
    assert any("predicted_rps" in t for t in run.result.ticks)


def test_audit_report_writes_the_simulators_report(simulated, tmp_path):
    out, _ = simulated
    result = runner.invoke(app, [
        "audit", "--deployment", "code", "--log", str(out / "events.jsonl"), "--config", str(QUICKSTART),
        "--profile", "h200-llama3.1-8b", "--report", str(tmp_path / "audit"),
    ])
    assert result.exit_code == 0, result.output
    assert "OK:" in result.output and "report:" in result.output
    html = (tmp_path / "audit" / "report.html").read_bytes()
    assert b"plotly" in html[:4_000_000] and b"Ready replicas per role" in html


def test_a_deployment_with_nothing_recorded_is_a_clear_error(simulated, tmp_path):
    out, _ = simulated
    result = runner.invoke(app, [
        "audit", "--deployment", "nobody", "--log", str(out / "events.jsonl"), "--config", str(QUICKSTART),
        "--profile", "h200-llama3.1-8b", "--report", str(tmp_path / "audit"),
    ])
    assert result.exit_code == 2
    assert f"no events for deployment 'nobody' in {out / 'events.jsonl'} (found: code)" in result.output


def test_gpu_seconds_integrate_the_timeline():
    from fleetplan.sim.metrics import ReplicaTimeline

    timeline = ReplicaTimeline(("agg",))
    none = {"agg": {"ready": 0, "starting": 0, "draining": 0}}
    timeline.record(0.0, none, 2)
    timeline.record(10.0, none, 4)
    assert timeline.gpu_seconds(25.0) == 2 * 10 + 4 * 15
    assert ReplicaTimeline(("agg",)).gpu_seconds(5.0) == 0


def _rebuilt(simulated, keep=lambda e: True):
    out, _ = simulated
    planner = build_planner(QUICKSTART, "h200-llama3.1-8b")
    audit = audit_log(out / "events.jsonl", "code", planner=planner)
    cfg = planner.config
    events = [e for e in audit.events if keep(e)]
    return recorded_run("code", events, [], cfg.roles, {"prefill": 1, "decode": 1}, cfg.ttft_ms, cfg.itl_ms, 60.0)


def test_the_last_window_is_drawn_at_the_rate_of_the_seconds_it_covers(simulated):
    """The run ends inside its last minute: that window's count is over the seconds it covers
    (until 2026-12-05 the audit's report divided it by a full minute, as the simulator's once did)."""
    run = _rebuilt(simulated)
    *full, (start, _, seconds) = run.arrivals
    assert all(s == 60.0 for _, _, s in full)
    assert seconds == pytest.approx(run.result.end_s - start) and 0 < seconds < 60.0


def test_requests_that_arrived_before_the_log_begins_are_in_the_per_minute_series(simulated):
    """A log cut after the traffic began (a topic's retention) holds requests that arrived
    before its first event: the run starts at the earliest arrival, so every request is in
    some minute (until 2026-12-05 a third of them were in none)."""
    from fleetplan.sim.metrics import windowed

    run = _rebuilt(simulated, keep=lambda e: e.time >= 60.0)
    summary = run.result.summary
    series = windowed(run.result.requests, 60.0, run.result.end_s, 500, 50)
    assert sum(series["count"]) == summary.requests
    assert run.result.requests.arrays()["arrival"].min() >= 0.0


def test_audit_report_does_not_replace_a_report_already_in_its_directory(simulated, tmp_path):
    """``--report`` given the simulate run's ``--out`` (where its log is) would write over the
    simulator's own report.html, the one with the baselines, and said nothing (until
    2026-12-05): a report.html already there stops the audit at start, naming it."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(simulated[0], out)
    before = (out / "report.html").read_bytes()
    result = runner.invoke(app, [
        "audit", "--deployment", "code", "--log", str(out / "events.jsonl"), "--config", str(QUICKSTART),
        "--profile", "h200-llama3.1-8b", "--report", str(out),
    ])
    assert result.exit_code == 2, result.output
    assert f"--report: {out / 'report.html'} exists" in result.output
    assert "OK:" not in result.output  # refused before the audit ran
    assert (out / "report.html").read_bytes() == before


def test_a_record_of_a_longer_answer_without_its_itl_is_not_judged_as_meeting_it():
    """A finished request of 20 tokens whose record carries a TTFT but no ``avg_itl_ms``
    cannot be judged against the ITL target, as one without a TTFT cannot be judged at all.
    Until 2026-12-05 it was taken for a one-token answer, which meets any ITL, and counted
    as meeting the SLA: here attainment read 2/3 where the judged records give 1/2."""
    from fleetplan.schemas.events import RequestRecord

    def record(n: int, itl: float | None) -> RequestRecord:
        return RequestRecord(deployment="d", time=10.0 + n, request_id=f"r{n}", input_tokens=100,
                             output_tokens=20, request_received_ms=(9.0 + n) * 1000.0, ttft_ms=40.0,
                             avg_itl_ms=itl)

    run = recorded_run("d", [record(0, 8.0), record(1, None), record(2, 80.0)], [], ("agg",), {"agg": 1},
                       500.0, 50.0, 60.0)
    assert run.unmeasured == 1
    assert (run.result.summary.requests, run.result.summary.sla_attainment) == (2, 0.5)


def test_audit_report_says_how_many_finished_requests_its_figures_leave_out(simulated, tmp_path):
    """Records without a TTFT, or a longer answer's ITL, are left out of the report's figures;
    the CLI said nothing of them (until 2026-12-05), so a report of a half-measured run read as
    a whole one."""
    lines = (simulated[0] / "events.jsonl").read_bytes().splitlines()
    stripped = 0
    for i, line in enumerate(lines):
        event = orjson.loads(line)
        if event.get("type") == "request" and event.get("output_tokens", 0) > 1 and stripped < 3:
            event.pop("avg_itl_ms")
            lines[i] = orjson.dumps(event)
            stripped += 1
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    result = runner.invoke(app, [
        "audit", "--deployment", "code", "--log", str(log), "--config", str(QUICKSTART),
        "--profile", "h200-llama3.1-8b", "--report", str(tmp_path / "report"),
    ])
    assert f"report: {tmp_path / 'report' / 'report.html'} (3 finished request(s) without a measured TTFT or ITL " \
           "left out of its figures)" in result.output, result.output


def test_an_audit_without_the_runs_profile_says_to_give_it(tmp_path):
    """A simulate log audited without --profile diverges at its first decision, since the
    simulator planned with one; the audit said only DIVERGED (until 2026-12-05)."""
    _register_optional()
    # 420 s: the first decision comes once a forecast is scored (hold_until_scored: all; until 2026-12-07
    # the first tick's release made one within 300 s)
    run = runner.invoke(app, ["simulate", "--trace", str(CODE), "--duration", "420", "--no-baselines",
                              "--out", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    log = tmp_path / "run" / "events.jsonl"
    bare = runner.invoke(app, ["audit", "--deployment", "sim", "--log", str(log)])
    assert bare.exit_code == 1, bare.output
    assert "hint: audited without an engine profile" in bare.output
    given = runner.invoke(app, ["audit", "--deployment", "sim", "--log", str(log), "--profile", "h200-llama3.1-8b"])
    assert given.exit_code == 0 and "hint:" not in given.output, given.output
