"""The run's HTML report (sim/report.py) drawn from a small hand-made run."""

from __future__ import annotations

import json

from fleetplan.sim.metrics import ReplicaTimeline, RequestLog, summarize
from fleetplan.sim.report import write_report
from fleetplan.sim.runner import RunResult


def _figure(path) -> list[dict]:
    html = path.read_text()
    start = html.index("Plotly.newPlot(")
    body = html[html.index("[", start):]
    data, _ = json.JSONDecoder().raw_decode(body)
    return data


def _run(ticks: list[dict]) -> RunResult:
    log = RequestLog()
    log.record(1.0, 0.1, 0.01, 100, 10, 0, 2.0)
    timeline = ReplicaTimeline(("prefill", "decode"))
    timeline.record(0.0, {r: {"ready": 1, "starting": 0, "draining": 0} for r in ("prefill", "decode")}, 2)
    summary = summarize("planner", log, 500, 50, 300.0, 600.0, {}, {}, 0)
    return RunResult("planner", summary, log, timeline, 300.0, ticks=ticks)


def test_a_load_tick_that_estimated_nothing_breaks_the_estimate_lines(tmp_path):
    # the load loop paused at 10-20 s (a decision in flight): it estimated nothing then, and a
    # line drawn from 5 s straight to 25 s showed estimates and a floor it never had
    ticks = [
        {"t": 5.0, "load_reason": "scale_up", "throughput_reason": "disabled",
         "prefill_est_ttft_ms": 120.0, "prefill_measured_floor": 2},
        {"t": 10.0, "load_reason": "scaling_in_progress", "throughput_reason": "disabled"},
        {"t": 15.0, "load_reason": "scaling_in_progress", "throughput_reason": "disabled"},
        {"t": 20.0, "load_reason": "not_due", "throughput_reason": "disabled"},
        {"t": 25.0, "load_reason": "no_change", "throughput_reason": "disabled",
         "prefill_est_ttft_ms": 40.0, "prefill_measured_floor": 1},
    ]
    path = write_report(tmp_path / "report.html", [_run(ticks)], 500, 50, 60.0, [(0.0, 1, 60.0)], "t")
    traces = {t["name"]: t for t in _figure(path)}
    for name in ("planner estimate (prefill)", "measured floor (prefill)"):
        assert traces[name]["y"][1:3] == [None, None], name  # a gap where the loop ran and had none
        assert len(traces[name]["y"]) == 4  # the not-due tick is no gap: the loop did not run
    assert "planner estimate (decode)" not in traces  # decode never estimates a TTFT


def test_the_report_embeds_plotly_and_fetches_nothing(tmp_path):
    path = write_report(tmp_path / "report.html", [_run([])], 500, 50, 60.0, [(0.0, 1, 60.0)], "t")
    html = path.read_text()
    assert "<script src=" not in html.replace('<script src=""', "")  # no CDN script: opens offline
    assert "plotly.js v" in html


def test_a_token_basis_run_says_its_sized_lines_are_of_tokens(tmp_path):
    ticks = [{"t": 180.0, "throughput_reason": "scale", "sized_rps": 12.0, "window_sized_rps": 10.0}]
    names = {}
    for basis in ("requests", "tokens"):
        path = write_report(tmp_path / f"{basis}.html", [_run(ticks)], 500, 50, 60.0, [(0.0, 1, 60.0)], "t",
                            sized_basis=basis)
        names[basis] = {t["name"] for t in _figure(path)}
    assert {"sized-for rps (planner)", "window sized-for rps (prefill rate count)"} <= names["requests"]
    assert {"sized-for rps (planner; tokens, the most any role's)",
            "window sized-for rps (prefill rate count; prompt tokens)"} <= names["tokens"]
