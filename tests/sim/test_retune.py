"""Replay-based retune (sim/retune.py): its spec fails fast, its windows and timing follow
Dynamo's design, and a retuned run stays event-sourced and deterministic."""

from __future__ import annotations

import io

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app
from fleetplan.eventlog import read_events
from fleetplan.models.config import config_from_dict
from fleetplan.models.fleet import Fleet
from fleetplan.models.planner import Planner
from fleetplan.models.quantiles import QuantileForecaster
from fleetplan.sim.engines import SimRequest
from fleetplan.sim.experiment import run_planner
from fleetplan.sim.retune import RetuneError, Retuner, load_retune
from fleetplan.sim.runner import SimOptions, make_setup, tick_row
from fleetplan.sim.traces import read_trace
from fleetplan.sim.workload import Workload, rate_scale, slice_trace
from tests.sim.sim_helpers import CONV

# one-minute ticks (the throughput loop alone), two-minute retune windows
CONFIG = {"load_predictor": "constant", "max_gpu_budget": 64, "throughput_adjustment_interval_seconds": 60}
# the retuned runs start at a headroom the grid's 0.95 beats: the same attainment for fewer GPUs
RUN_CONFIG = {**CONFIG, "target_utilization": 0.5}
SPEC = {"interval_seconds": 120, "grace_seconds": 10, "planner": {"target_utilization": [0.5, 0.95]}}


def retuner(h200, spec=None, **config):
    setup = make_setup(config_from_dict({**CONFIG, **config}), h200, SimOptions(seed=5))
    return Retuner(load_retune(spec or SPEC), setup, h200)


@pytest.mark.parametrize(
    "spec,message",
    [
        ({**SPEC, "intervall_seconds": 60}, "retune: intervall_seconds: unknown field"),
        ({**SPEC, "interval_seconds": -1}, "retune: interval_seconds: Input should be greater than 0"),
        ({**SPEC, "planner": {}}, "retune: planner: "),
        ({**SPEC, "objective": "cheapest"}, "retune: objective: "),
        ({**SPEC, "planner": {"target_utilisation": [0.9]}}, "retune.planner.target_utilisation: not a planner config field"),
        ({**SPEC, "planner": {"load_predictor": ["kalman"]}}, "retune.planner.load_predictor: cannot be retuned"),
        ({**SPEC, "planner": {"ttft_ms": [200]}}, "retune.planner.ttft_ms: cannot be retuned"),
        ({**SPEC, "planner": {"target_utilization": []}}, "retune.planner.target_utilization: expected a non-empty list"),
        ({**SPEC, "planner": {"target_utilization": [0.8, 1.5]}},
         "retune.planner point 1 {'target_utilization': 1.5}: set_config: target_utilization: Input should be less than or equal to 1"),
        ({**SPEC, "interval_seconds": 90}, "retune.interval_seconds: must be a whole number of ticks (60 s)"),
        ({**SPEC, "grace_seconds": 70}, "retune.grace_seconds + decision latency: must fit in interval_seconds"),
        ({**SPEC, "decision_latency_seconds": 120, "grace_seconds": 1}, "must fit in interval_seconds"),
        ({**SPEC, "max_candidates": 3, "planner": {"target_utilization": [0.6, 0.7], "sizing_quantile": [0.8, 0.9]}},
         "retune.planner: the grid has 4 points, max_candidates is 3"),
    ],
)
def test_a_bad_spec_fails_before_the_run_and_names_its_field(h200, spec, message):
    with pytest.raises(RetuneError) as err:
        retuner(h200, spec)
    assert message in str(err.value)


def test_a_gpu_budget_point_is_checked_against_the_profiles_engine_size(tmp_path):
    """The run's own budget is checked against the profile's GPUs per engine (make_setup), so
    a grid point is too: the config alone takes an engine for one GPU."""
    from fleetplan.sim.profiles import load_profile

    h100 = load_profile("h100-llama3.3-70b")  # two GPUs an engine
    setup = make_setup(config_from_dict(CONFIG), h100, SimOptions(seed=5))
    with pytest.raises(RetuneError) as err:
        Retuner(load_retune({**SPEC, "planner": {"max_gpu_budget": [32, 3]}}), setup, h100)
    assert str(err.value) == ("retune.planner point 1 {'max_gpu_budget': 3}: max_gpu_budget: 3 GPUs cannot hold "
                              "one engine of each role (prefill 2 GPUs + decode 2 GPUs)")
    Retuner(load_retune({**SPEC, "planner": {"max_gpu_budget": [4, 32]}}), setup, h100)
    # the command stops before it runs, as with max_gpu_budget: 3 in --config
    _register_optional()
    config = tmp_path / "config.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in RUN_CONFIG.items()))
    spec = tmp_path / "retune.yaml"
    spec.write_text("interval_seconds: 120\ngrace_seconds: 10\nplanner: {max_gpu_budget: [3, 32]}\n")
    out = CliRunner().invoke(app, ["simulate", "--trace", str(CONV), "--duration", "300", "--config", str(config),
                                   "--profile", "h100-llama3.3-70b", "--initial", "prefill=1,decode=1",
                                   "--no-baselines", "--retune", str(spec)])
    assert out.exit_code == 2, out.output
    assert f"--retune: {spec}: retune.planner point 0 {{'max_gpu_budget': 3}}: max_gpu_budget: 3 GPUs" in out.stderr


@pytest.mark.parametrize(
    "field,value",
    [("attainment_goal", True), ("min_improvement_percentage", True), ("max_candidates", True),
     ("grace_seconds", False), ("interval_seconds", True), ("decision_latency_seconds", False)],
)
def test_a_bool_for_a_number_is_refused_as_the_planners_config_refuses_it(field, value):
    """Pydantic's lax mode took ``attainment_goal: true`` as a goal of 1.0."""
    with pytest.raises(RetuneError) as err:
        load_retune({**SPEC, field: value}, source="spec.yaml")
    assert str(err.value) == f"spec.yaml: {field}: expected a number, got {str(value).lower()}"


@pytest.mark.parametrize(
    "spec,message",
    [
        ({**SPEC, "planner": {"target_utilization": [0.9, True]}},
         "retune.planner point 1 {'target_utilization': True}: set_config: target_utilization: expected a number, got true"),
        ({**SPEC, "load_predictor": [{"load_predictor": "kalman", "kalman_min_points": True}]},
         "retune.load_predictor[0]: set_config: kalman_min_points: expected a number, got true"),
    ],
)
def test_a_bool_in_the_grid_or_a_predictor_entry_is_refused_by_the_planners_config(h200, spec, message):
    with pytest.raises(RetuneError) as err:
        retuner(h200, spec)
    assert str(err.value) == message


def test_a_spec_may_come_wrapped_in_a_retune_block(h200):
    assert load_retune({"retune": SPEC}) == load_retune(SPEC)
    with pytest.raises(RetuneError, match="expected a mapping of retune fields, got list"):
        load_retune([SPEC])


FRESH = QuantileForecaster("constant").to_state()


def _request(index, arrival, end, isl=800, osl=40):
    req = SimRequest(index, arrival, isl, osl)
    req.end = end
    return req


def test_a_window_replays_the_requests_that_arrived_in_it_and_had_finished_by_its_cutoff(h200):
    rt = retuner(h200)
    rt.start({"prefill": 1, "decode": 1}, FRESH)
    for req in (_request(0, 5.0, 9.0), _request(1, 100.0, 125.0), _request(2, 110.0, 131.0),
                _request(3, 119.0, 130.0), _request(4, 121.0, 122.0)):
        rt.request_done(req)
    for t in (60.0, 120.0):
        assert rt.tick(t, {"prefill": 1, "decode": 1}, lambda: FRESH) is None
    assert rt.decisions == []  # window [0, 120) is due at 130, so its sweep waits for the tick at 180
    assert rt.tick(180.0, {"prefill": 1, "decode": 1}, lambda: FRESH) is None
    assert rt.tick(239.0, {"prefill": 1, "decode": 1}, lambda: FRESH) is None  # not landed: launched + one tick
    rt.tick(240.0, {"prefill": 1, "decode": 1}, lambda: FRESH)
    (record,) = rt.decisions
    assert record["window"] == [0.0, 120.0]
    # request 2 finished after the cutoff (120 + 10 s); request 4 arrived after the window
    assert record["requests"] == 3
    assert (record["launched_at"], record["decided_at"]) == (180.0, 240.0)
    assert record["start_fleet"] == {"prefill": 1, "decode": 1}
    # the current point (the startup point: 0.8) first, then the grid
    assert [c["changes"] for c in record["candidates"]] == [
        {"target_utilization": 0.8}, {"target_utilization": 0.5}, {"target_utilization": 0.95}]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 300), st.floats(0, 60)), max_size=30), st.randoms(use_true_random=False))
def test_a_windows_requests_do_not_depend_on_the_order_they_finished_in(h200, rows, rng):
    """Requests are reported as they finish, an order the fleet decides; the replayed window
    must not carry it."""
    reqs = [_request(i, arrival, arrival + took) for i, (arrival, took) in enumerate(rows)]
    shuffled = list(reqs)
    rng.shuffle(shuffled)
    picked = []
    for order in (reqs, shuffled):
        rt = retuner(h200)
        for req in order:
            rt.request_done(req)
        picked.append(rt.window_requests(120.0, 240.0, 250.0))
    assert picked[0] == picked[1]
    expected = sorted((a, i) for i, (a, took) in enumerate(rows) if 120 <= a < 240 and a + took <= 250)
    assert [r.arrival_s for r in picked[0]] == [a for a, _ in expected]


def test_a_window_without_a_ready_worker_or_without_requests_decides_nothing(h200):
    rt = retuner(h200)
    rt.start({"prefill": 0, "decode": 1}, FRESH)
    rt.request_done(_request(0, 5.0, 9.0))
    for t in (60.0, 120.0, 180.0, 240.0):
        rt.tick(t, {"prefill": 1, "decode": 1}, lambda: FRESH)
    assert rt.decisions[0]["outcome"] == "failed: no ready prefill worker at the window start"
    for t in (300.0, 360.0, 420.0):
        rt.tick(t, {"prefill": 1, "decode": 1}, lambda: FRESH)
    assert rt.decisions[1]["window"] == [120.0, 240.0]
    assert rt.decisions[1]["outcome"] == "empty_window"
    assert rt.current == {"target_utilization": 0.8}


def test_a_window_whose_decision_would_land_after_the_run_is_recorded_not_replayed(h200, monkeypatch):
    """Its decision could never apply: it is listed (every window that came due is), and
    replaying its candidates would be wasted work."""
    rt = retuner(h200)
    rt.start({"prefill": 1, "decode": 1}, FRESH, end_s=230.0)
    for req in (_request(0, 5.0, 9.0), _request(1, 100.0, 125.0)):
        rt.request_done(req)
    monkeypatch.setattr(rt, "_replay", lambda *a, **k: pytest.fail("replayed a window that cannot land"))
    for t in (60.0, 120.0, 180.0):  # window [0, 120) launches at 180 and would land at 240
        assert rt.tick(t, {"prefill": 1, "decode": 1}, lambda: FRESH) is None
    (record,) = rt.decisions
    assert record["window"] == [0.0, 120.0] and record["requests"] == 2
    assert (record["launched_at"], record["decided_at"], record["changes"], record["candidates"]) == (None, None, None, [])
    assert record["outcome"] == "not run: it would land after the run ends"
    rt.finish()
    assert len(rt.decisions) == 1 and rt.current == {"target_utilization": 0.8}


def test_a_decision_latency_between_ticks_is_judged_at_the_tick_it_lands_on(h200, monkeypatch):
    """The decision lands on the first tick at or after launch + D: with D = 90 s at one-minute
    ticks, window [0, 120) launched at 180 lands at 300, after a 280-s workload. Judged at
    180 + 90 = 270 it was replayed, and its decision then never landed."""
    rt = retuner(h200, {**SPEC, "decision_latency_seconds": 90})
    rt.start({"prefill": 1, "decode": 1}, FRESH, end_s=280.0)
    rt.request_done(_request(0, 5.0, 9.0))
    monkeypatch.setattr(rt, "_replay", lambda *a, **k: pytest.fail("replayed a window that cannot land"))
    for t in (60.0, 120.0, 180.0, 240.0):
        rt.tick(t, {"prefill": 1, "decode": 1}, lambda: FRESH)
    rt.finish()
    assert [d["outcome"] for d in rt.decisions] == ["not run: it would land after the run ends"]


def test_a_decision_in_flight_when_the_run_ends_is_recorded_as_not_landed(h200):
    rt = retuner(h200)
    rt.start({"prefill": 1, "decode": 1}, FRESH)
    rt.request_done(_request(0, 5.0, 9.0))
    for t in (60.0, 120.0, 180.0):  # launched at 180, due to land at 240: the run ends first
        rt.tick(t, {"prefill": 1, "decode": 1}, lambda: FRESH)
    assert rt.decisions == []
    rt.finish()
    (record,) = rt.decisions
    assert record["window"] == [0.0, 120.0] and record["launched_at"] == 180.0
    assert (record["decided_at"], record["changes"]) == (None, None)
    assert record["outcome"] == "not landed: the run ended"
    assert len(record["candidates"]) == 3  # the replays ran: their scores are kept
    rt.finish()
    assert len(rt.decisions) == 1


@pytest.mark.parametrize(
    "duration,spec,outcomes",
    [
        # window [120, 240) comes due at the tick at 300 and would land at 360, after the workload
        (300, SPEC, ["applied", "not run: it would land after the run ends"]),
        # window [0, 120) launches at 180 and lands on the first tick from 270 (300), after the workload
        (280, {**SPEC, "decision_latency_seconds": 90}, ["not run: it would land after the run ends"]),
    ],
)
def test_a_run_lists_every_window_that_came_due_even_past_its_end(h200, duration, spec, outcomes):
    """A sweep held until after the run's last tick used to be run and then dropped."""
    reqs = slice_trace(read_trace(CONV), 0, duration)
    short = Workload.from_requests("conv", rate_scale(reqs, 12, seed=1, duration_s=duration), duration)
    result, log = _retuned_run(short, h200, spec)
    assert [d["outcome"] for d in result.retune] == outcomes
    assert all(d["decided_at"] is None for d in result.retune[1 if outcomes[0] == "applied" else 0:])
    controls = [orjson.loads(line) for line in log.splitlines() if b'"type":"control"' in line]
    assert [c["body"]["changes"] for c in controls] == [d["changes"] for d in result.retune if d["outcome"] == "applied"]


def test_gpu_hours_at_goal_takes_the_cheapest_candidate_that_meets_the_goal(h200):
    from fleetplan.sim.retune import Score

    rt = retuner(h200, {**SPEC, "objective": "gpu_hours_at_goal", "attainment_goal": 0.99})
    current = Score({"target_utilization": 0.8}, 0.0, 0.995, 2.0, 0.0)
    cheaper = Score({"target_utilization": 0.95}, 0.0, 0.991, 1.9, 0.0)
    cheapest_missing = Score({"target_utilization": 1.0}, 0.0, 0.98, 1.5, 0.0)
    ranked = sorted([current, cheaper, cheapest_missing], key=rt._rank, reverse=True)
    assert ranked == [cheaper, current, cheapest_missing]
    assert rt._beats(cheaper, current)  # 5 % fewer GPU-hours, the goal still met
    assert not rt._beats(Score({}, 0.0, 0.999, 1.99, 0.0), current)  # 0.5 %: inside the 1 % margin
    # below the goal, attainment decides: reaching it beats any cost, and more of it beats less
    short = Score({}, 0.0, 0.95, 1.0, 0.0)
    assert rt._beats(Score({}, 0.0, 0.99, 3.0, 0.0), short)
    assert rt._beats(Score({}, 0.0, 0.97, 3.0, 0.0), short) and not rt._beats(Score({}, 0.0, 0.955, 0.5, 0.0), short)


@pytest.fixture(scope="module")
def workload():
    reqs = slice_trace(read_trace(CONV), 0, 360)
    return Workload.from_requests("conv6", rate_scale(reqs, 12, seed=1, duration_s=360), 360)


def _retuned_run(workload, h200, spec=None):
    cfg = config_from_dict(RUN_CONFIG)
    setup = make_setup(cfg, h200, SimOptions(seed=5))
    rt = Retuner(load_retune(spec or SPEC), setup, h200)
    log = io.BytesIO()
    result = run_planner(workload, setup, Planner(cfg, profile=h200), {"prefill": 2, "decode": 2}, log=log, retune=rt)
    return result, log.getvalue()


@pytest.fixture(scope="module")
def retuned(workload, h200):
    return _retuned_run(workload, h200)


def test_the_best_candidate_is_applied_as_a_control_event_from_the_next_tick(retuned):
    result, log = retuned
    first = result.retune[0]
    best = first["candidates"][first["best"]]
    assert first["outcome"] == "applied", first
    assert first["changes"] == best["changes"] != first["current"]
    assert best["score"] > first["candidates"][0]["score"] * 1.01  # beat the current point by > 1 %
    controls = [orjson.loads(line) for line in log.splitlines() if b'"type":"control"' in line]
    assert [(c["issued_by"], c["body"]["changes"]) for c in controls][:1] == [("retune", first["changes"])]
    # stamped when the landing tick fired (its watermark, a grace after it), before the next tick
    assert first["decided_at"] <= controls[0]["time"] < first["decided_at"] + CONFIG["throughput_adjustment_interval_seconds"]
    # ticks up to the landing tick size at the startup headroom, the ones after at the new one
    new = first["changes"]["target_utilization"]
    used = {row["t"]: row["prefill_utilization"] for row in result.ticks if "prefill_utilization" in row}
    assert first["current"] == {"target_utilization": 0.5}
    assert all(u == 0.5 for t, u in used.items() if t <= first["decided_at"])
    after = [u for t, u in used.items() if t > first["decided_at"]]
    assert after and all(u == new for u in after)


def test_fleetplan_plan_reproduces_a_retuned_run_from_its_log(retuned, tmp_path, h200):
    result, log = retuned
    path = tmp_path / "events.jsonl"
    path.write_bytes(log)
    config = tmp_path / "config.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in RUN_CONFIG.items()))
    _register_optional()
    out = CliRunner().invoke(app, ["plan", "--events", str(path), "--config", str(config), "--profile", "h200-llama3.1-8b"])
    assert out.exit_code == 0, out.output
    replayed = [orjson.loads(line) for line in out.stdout.splitlines() if line.strip()]
    logged = [orjson.loads(line) for line in log.splitlines() if b'"type":"decision"' in line]
    assert replayed == logged and len(logged) == len(result.decisions)
    # every tick, those after the change included, folds back from the log alone
    fleet = Fleet(Planner(config_from_dict(RUN_CONFIG), profile=h200))
    rows = [tick_row(item) for event in read_events(path) for item in fleet.feed(event)]
    rows += [tick_row(item) for item in fleet.finish()]
    assert rows == result.ticks
    assert rows[-1]["prefill_utilization"] == result.retune[0]["changes"]["target_utilization"]


def test_the_same_run_retunes_the_same_way_bit_for_bit(retuned, workload, h200):
    result, log = retuned
    again, log_again = _retuned_run(workload, h200)
    assert log_again == log
    assert orjson.dumps(again.retune) == orjson.dumps(result.retune)


def test_advisory_records_the_choice_and_changes_nothing(workload, h200, retuned):
    result, _ = retuned
    advised, log = _retuned_run(workload, h200, {**SPEC, "advisory": True})
    assert advised.retune[0]["outcome"] == "advisory"
    assert advised.retune[0]["changes"] == result.retune[0]["changes"]
    assert b'"type":"control"' not in log


def test_a_margin_no_candidate_clears_keeps_the_current_point(workload, h200):
    kept, log = _retuned_run(workload, h200, {**SPEC, "min_improvement_percentage": 1000})
    assert [d["outcome"] for d in kept.retune] == ["kept"] * len(kept.retune) and kept.retune
    assert b'"type":"control"' not in log


def test_simulate_retune_prints_each_decision_and_rejects_a_bad_spec(tmp_path):
    _register_optional()
    config = tmp_path / "config.yaml"
    config.write_text("".join(f"{k}: {v}\n" for k, v in RUN_CONFIG.items()))
    spec = tmp_path / "retune.yaml"
    spec.write_text(orjson.dumps(SPEC).decode())
    args = ["simulate", "--trace", str(CONV), "--duration", "300", "--rate-scale", "6", "--config", str(config),
            "--no-baselines", "--retune", str(spec)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "retune [0, 120) s, " in out.stdout
    # window [120, 240) would land at 360, after the 300-s run: listed, without a decision time
    assert "retune [120, 240) s, " in out.stdout and "requests: not run: it would land after the run ends" in out.stdout
    as_json = CliRunner().invoke(app, [*args, "--json", "--out", str(tmp_path / "run")])
    summary = orjson.loads(as_json.stdout)
    assert summary["retune"][0]["window"] == [0.0, 120.0]
    applied = [d for d in summary["retune"] if d["outcome"] == "applied"]
    assert applied
    html = (tmp_path / "run" / "report.html").read_text()
    for d in applied:  # the report marks where a change took effect
        assert "retune: " + ", ".join(f"{k}={v}" for k, v in d["changes"].items()) in html

    spec.write_text("interval_seconds: 120\nplanner:\n  target_utilization: [0.7, 2]\n")
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code == 2
    assert f"--retune: {spec}: retune.planner point 1 {{'target_utilization': 2}}: set_config: target_utilization" in bad.stderr
    spec.write_text("interval_seconds: [\n")
    assert f"--retune: {spec}: not valid YAML" in CliRunner().invoke(app, args).stderr
    spec.write_text("interval_seconds: 120\nplanner: {target_utilization: [0.7]}\nwindow: 3\n")
    assert f"--retune: {spec}: window: unknown field" in CliRunner().invoke(app, args).stderr
    missing = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "nope.yaml: cannot read retune spec" in missing.stderr
    other = CliRunner().invoke(app, [*args[:-2], "--policy", "static-peak", "--retune", str(spec)])
    assert other.exit_code == 2 and "--retune: retunes the planner, not --policy static-peak" in other.stderr
    live = CliRunner().invoke(app, [*args, "--realtime", "1000"])
    assert live.exit_code == 2 and "--retune: replay only (as in Dynamo), not with --publish or --realtime" in live.stderr


# kalman first: on a tie it wins (the swap itself is checked in tests/models/test_predictor_swap.py)
PREDICTORS = [{"load_predictor": "kalman", "kalman_min_points": 1}, {"load_predictor": "constant"}]


@pytest.mark.parametrize(
    "entries,message",
    [
        ([{"load_predictor": "oracle"}], "retune.load_predictor[0]: set_config: load_predictor: Input should be"),
        ([{"constant": 1}], "retune.load_predictor[0].constant: not a predictor field"),
        ([{"load_predictor": "kalman"}, {"kalman_r": -1}], "retune.load_predictor[1]: set_config: kalman_r"),
    ],
)
def test_a_bad_predictor_candidate_fails_before_the_run(h200, entries, message):
    with pytest.raises(RetuneError) as err:
        retuner(h200, {**SPEC, "load_predictor": entries})
    assert str(err.value).startswith(message), str(err.value)
    with pytest.raises(RetuneError, match="the pre-sweep needs the throughput loop"):
        retuner(h200, {**SPEC, "load_predictor": PREDICTORS}, enable_throughput_scaling=False,
                enable_load_scaling=True)


@pytest.fixture(scope="module")
def presweep(workload, h200):
    return _retuned_run(workload, h200, {**SPEC, "load_predictor": PREDICTORS})


def test_the_presweep_scores_each_predictor_one_step_ahead_and_the_rest_take_the_winner(presweep):
    result, log = presweep
    first = result.retune[0]
    sweep = first["predictor_presweep"]
    # window [0, 120) at one-minute ticks: its two windows are scored, but nothing came before,
    # so the current predictor stays (a cold start would be judged on forecasting nothing)
    assert sweep["scored_windows"] == 2 and sweep["warm_windows"] == 0 and sweep["winner"] is None
    assert all(c["changes"]["load_predictor"] == "constant" for c in first["candidates"])
    second = result.retune[1]
    sweep = second["predictor_presweep"]
    assert sweep["warm_windows"] >= 2  # the first window's windows warm the candidates
    losses = [c["loss"] for c in sweep["losses"]]
    assert sweep["winner"] == min(range(2), key=lambda i: (losses[i], i))
    winner = PREDICTORS[sweep["winner"]]
    first = second
    # the current point keeps the run's predictor; every other candidate takes the winner's
    assert first["candidates"][0]["changes"]["load_predictor"] == "constant"
    assert all(c["changes"]["load_predictor"] == winner["load_predictor"] for c in first["candidates"][1:])


def test_a_run_with_the_presweep_folds_back_from_its_log(presweep, tmp_path, h200):
    result, log = presweep
    applied = [d for d in result.retune if d["outcome"] == "applied"]
    controls = [orjson.loads(line) for line in log.splitlines() if b'"type":"control"' in line]
    assert [c["body"]["changes"] for c in controls] == [d["changes"] for d in applied]
    path = tmp_path / "events.jsonl"
    path.write_bytes(log)
    fleet = Fleet(Planner(config_from_dict(RUN_CONFIG), profile=h200))
    rows = [tick_row(item) for event in read_events(path) for item in fleet.feed(event)]
    rows += [tick_row(item) for item in fleet.finish()]
    assert rows == result.ticks
    state = next(iter(fleet.states.values()))
    expected = {**{"load_predictor": "constant"}, **{k: v for d in applied for k, v in d["changes"].items()}}
    assert state.config.load_predictor == expected["load_predictor"]
    assert state.forecaster.to_state()["forecaster"]["kind"] == expected["load_predictor"]


def test_a_warm_run_retunes_from_its_seeded_forecaster(h200):
    """The first window's candidates replay from the forecaster the seed leaves, not an empty one."""
    from fleetplan.models.predictor_swap import rebuild_forecaster
    from fleetplan.sim.warm import history_windows

    cfg = config_from_dict(RUN_CONFIG)
    before = slice_trace(read_trace(CONV), 0, 240)
    rows = history_windows(rate_scale(before, 12, seed=1, duration_s=240), span_s=240.0, interval_s=60.0,
                           burst_s=cfg.burst_seconds)
    after = slice_trace(read_trace(CONV), 240, 480)
    workload = Workload.from_requests("conv4", rate_scale(after, 12, seed=1, duration_s=240), 240)
    setup = make_setup(cfg, h200, SimOptions(seed=5))
    rt = Retuner(load_retune(SPEC), setup, h200)
    started, start = [], rt.start
    rt.start = lambda initial, state, **kw: (started.append(state), start(initial, state, **kw))
    result = run_planner(workload, setup, Planner(cfg, profile=h200), {"prefill": 2, "decode": 2}, retune=rt,
                         seed=rows)
    assert len(rows) == 4 and result.retune
    assert started == [rebuild_forecaster(cfg, rows).to_state()]


def test_a_retune_line_shows_what_its_objective_ranks_by():
    from fleetplan.sim.cli import retune_lines

    cands = [{"score": 4000.0, "attainment": 0.995, "gpu_hours": 2.0},
             {"score": 3900.0, "attainment": 0.991, "gpu_hours": 1.9}]
    record = {"window": [0.0, 120.0], "requests": 10, "decided_at": 180.0, "outcome": "applied",
              "changes": {"target_utilization": 0.95}, "candidates": cands, "best": 1}
    goodput = retune_lines([{**record, "objective": "goodput_per_gpu"}])[0]
    assert goodput.endswith("(score 3,900.0 against the current 4,000.0)")
    at_goal = retune_lines([{**record, "objective": "gpu_hours_at_goal"}])[0]
    assert at_goal.endswith("(99.10% at 1.900 GPU-hours against the current 99.50% at 2.000 GPU-hours)")


def test_a_run_warmed_by_a_warmup_trace_retunes_with_those_windows_before_its_first(workload, h200):
    """``load_predictor_warmup_trace``'s windows carry no start time: they come before the live
    ones. The first sweep took their start for a number and the run stopped with a TypeError."""
    from fleetplan.bootstrap import load_warmup

    cfg = config_from_dict({**RUN_CONFIG, "load_predictor_warmup_trace": str(CONV)})
    warm = load_warmup(cfg)
    assert warm["warmup"] and all(obs.start_s is None for obs in warm["warmup"])
    setup = make_setup(cfg, h200, SimOptions(seed=5))
    rt = Retuner(load_retune({**SPEC, "load_predictor": PREDICTORS}), setup, h200)
    result = run_planner(workload, setup, Planner(cfg, profile=h200, **warm), {"prefill": 2, "decode": 2}, retune=rt)
    first = result.retune[0]
    # the warm-up windows warm the pre-sweep's candidates, so the first window has a winner
    assert first["predictor_presweep"]["warm_windows"] == len(warm["warmup"])
    assert first["predictor_presweep"]["scored_windows"] == 2 and first["predictor_presweep"]["winner"] is not None


def test_a_candidate_with_another_predictor_replays_the_forecaster_a_swap_at_the_window_start_builds(h200, monkeypatch):
    """A swap (``set_config``, models/apply.py) replays the kept windows and then the quantile
    requests made since the last of them: the sizing of the tick that closed it. The candidate's
    rebuild left those out, so its first replayed window moved no adaptive level."""
    from fleetplan.models.forecast import TrafficObservation
    from fleetplan.models.predictor_swap import rebuild_forecaster, remember_window
    from fleetplan.sim import runner
    from fleetplan.sim.retune import _Window

    rt = retuner(h200, {**SPEC, "load_predictor": PREDICTORS})
    cfg = rt.setup.config
    history: list[list] = []
    for i, n in enumerate((300, 420, 360, 480)):
        remember_window(history, TrafficObservation(60.0, n, 900.0, 200.0, start_s=60.0 * i), None, 10)
    run_forecaster = rebuild_forecaster(cfg, history)
    run_forecaster.quantile(cfg.sizing_quantile, 2)  # the window start's tick sized after the window closed
    assert run_forecaster.asked
    window = _Window(2, {"prefill": 1, "decode": 1}, run_forecaster.to_state(), rt._predictor_now())
    cand = rt._candidate({"target_utilization": 0.8, **PREDICTORS[0]}, "kalman")

    class Stop(Exception):
        pass

    def capture(self, workload, setup, controller, initial, start_s=0.0):
        raise Stop(controller._forecaster_state)

    monkeypatch.setattr(runner.ClosedLoop, "__init__", capture)
    with pytest.raises(Stop) as stopped:
        rt._replay(cand, window, [], 240.0, 360.0, history)
    swapped = rebuild_forecaster(cand.config, history, asked=run_forecaster.asked)
    assert stopped.value.args[0] == swapped.to_state()


def test_a_grid_point_that_moves_the_planners_tick_is_refused(h200):
    """A threshold target runs the load loop alone, the SLA target (here) the throughput loop:
    ``optimization_target`` switches the loops as their own switches do. Applied, it moved the
    run's tick from 30 s to 60 s, and every other 90-s window's start fell between ticks: the
    window was never swept nor listed."""
    threshold = {"optimization_target": "load", "prefill_scale_up_queue_tokens": 4, "prefill_scale_down_queue_tokens": 1,
                 "decode_scale_up_kv_rate": 0.9, "decode_scale_down_kv_rate": 0.3, "context_length": 8192,
                 "load_adjustment_interval_seconds": 30}
    spec = {"interval_seconds": 90, "grace_seconds": 0, "planner": {"optimization_target": ["load", "sla"]}}
    with pytest.raises(RetuneError) as err:
        retuner(h200, spec, **threshold)
    assert str(err.value).startswith("retune.planner point 1 {'optimization_target': 'sla'}: it moves the "
                                     "planner's tick from 30 s to 60 s"), str(err.value)
    retuner(h200, {**spec, "planner": {"optimization_target": ["load"]}}, **threshold)  # the same tick: searched
