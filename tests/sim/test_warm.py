"""Warm start: the forecaster fed the traffic before the run, as the planner would have fed it."""

from __future__ import annotations

import pytest

from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.models.predictor_swap import rebuild_forecaster
from fleetplan.models.quantiles import QuantileForecaster
from fleetplan.sim.runner import ClosedLoop, PlannerController, SimOptions, make_setup
from fleetplan.sim.traces import TraceRequest, read_trace
from fleetplan.sim.warm import history_windows
from fleetplan.sim.workload import Workload, rate_scale, slice_trace
from tests.sim.sim_helpers import CONV

CONFIG = {
    "load_predictor": "ensemble", "max_gpu_budget": 64, "throughput_adjustment_interval_seconds": 30,
    "burst_window_seconds": 10, "startup_seconds": 30,  # a short horizon: ten windows calibrate its P90
}
SPAN = 300.0  # the example trace holds 600 s: half to warm on, half to run


def _conv(start: float, seconds: float) -> Workload:
    reqs = slice_trace(read_trace(CONV), start, start + seconds)
    return Workload.from_requests("conv", rate_scale(reqs, 4, seed=1, duration_s=seconds), seconds)


def _run(h200, workload: Workload, seed=None) -> PlannerController:
    cfg = config_from_dict(CONFIG)
    controller = PlannerController(Planner(cfg, profile=h200), seed=seed)
    ClosedLoop(workload, make_setup(cfg, h200, SimOptions(seed=5)), controller, {"prefill": 2, "decode": 2}).run()
    return controller


@pytest.fixture(scope="module")
def history(h200):
    """Five minutes of conv, and the planner that ran on them."""
    workload = _conv(0.0, SPAN)
    return workload, _run(h200, workload)


def test_the_windows_are_the_ones_the_planner_fed_its_forecaster(history):
    workload, controller = history
    (state,) = controller.core.states.values()
    fed = state.traffic_history
    rows = history_windows(workload.requests(), span_s=SPAN, interval_s=30.0, burst_s=10)
    assert len(fed) >= 9
    assert len(rows) == 10
    for planner_row, row in zip(fed, rows, strict=False):
        # the same window on two clocks: the run's own, and one that ends where a next run starts
        assert row[0] == planner_row[0] - SPAN
        assert row[1:4] == planner_row[1:4]  # duration, count, mean ISL
        assert row[7] == planner_row[7]  # the busiest 10 s, as a window's count
        # OSL: arrivals here, finished requests in the planner; the same traffic
        assert row[4] == pytest.approx(planner_row[4], rel=0.25)


def test_the_windows_end_where_the_run_starts_and_a_part_window_is_dropped():
    reqs = [TraceRequest(t, 100 + t, 10) for t in (5.0, 65.0, 70.0, 125.0, 130.0, 131.0)]
    rows = history_windows(reqs, span_s=150.0, interval_s=60.0, burst_s=30)
    # 150 s of history: the first 30 s is a part window; the rest is [-120, -60) and [-60, 0)
    assert [r[0] for r in rows] == [-120.0, -60.0]
    assert [r[2] for r in rows] == [2.0, 3.0]
    assert rows[0][3] == pytest.approx((165.0 + 170.0) / 2)
    # t - 150 on the run's clock: 65, 70 -> -85, -80 (one 30 s bin); 125..131 -> -25..-19 (one bin)
    assert [r[7] for r in rows] == [4.0, 6.0]


def test_idle_windows_before_the_first_request_are_skipped_and_after_it_carry_the_osl():
    reqs = [TraceRequest(130.0, 100, 40), TraceRequest(250.0, 100, 60)]
    rows = history_windows(reqs, span_s=300.0, interval_s=60.0, burst_s=0)
    assert [r[0] for r in rows] == [-180.0, -120.0, -60.0]
    assert [(r[2], r[4], r[7]) for r in rows] == [(1.0, 40.0, None), (0.0, 40.0, None), (1.0, 60.0, None)]


def test_bad_spans_are_refused():
    with pytest.raises(ValueError, match="interval_s > 0"):
        history_windows([], span_s=60.0, interval_s=0.0, burst_s=0)


def test_a_warm_run_starts_from_the_state_the_history_leaves(history, h200):
    workload, _ = history
    cfg = config_from_dict(CONFIG)
    rows = history_windows(workload.requests(), span_s=SPAN, interval_s=30.0, burst_s=10)
    after = _conv(SPAN, SPAN)
    cold, warm = _run(h200, after), _run(h200, after, seed=rows)
    (state,) = warm.core.states.values()
    assert state.traffic_history[: len(rows)] == rows and state.rejected_controls == 0
    # the seed, through the log and the core, is the run that starts from the state the history builds
    built = rebuild_forecaster(cfg, rows).to_state()
    assert QuantileForecaster.from_state(built).to_state() == built
    restored = PlannerController(Planner(cfg, profile=h200), forecaster_state=built)
    ClosedLoop(after, make_setup(cfg, h200, SimOptions(seed=5)), restored, {"prefill": 2, "decode": 2}).run()
    assert restored.ticks == warm.ticks
    assert [(d.decision_id, d.targets) for d in restored.decisions] == [(d.decision_id, d.targets) for d in warm.decisions]

    first_cold, first_warm = (next(r for r in c.ticks if "predicted_rps" in r) for c in (cold, warm))
    assert first_cold["t"] == first_warm["t"]
    # ten windows of history: the P90 has been scored and is conformal from the first tick
    assert first_warm["quantile_calibrated"] is True
    assert first_cold["quantile_calibrated"] is False
    assert first_warm["predicted_rps"] != first_cold["predicted_rps"]


def test_the_bench_moves_a_servegen_day_and_names_its_warm_up():
    from bench.quality import Spec, on_day

    day0 = Spec("servegen-m-large-24h", "servegen", "clients.csv.gz", "h100-llama3.3-70b", 0.17, "m-large")
    moved = on_day(day0, 4, 4)
    assert (moved.name, moved.start_day, moved.warm_days) == ("servegen-m-large-24h-day4-warm4d", 4, 4)
    assert on_day(day0, 4, 0).name == "servegen-m-large-24h-day4"
    with pytest.raises(ValueError, match="--warm-days: 0 to --day"):
        on_day(day0, 2, 3)
    with pytest.raises(ValueError, match="for ServeGen days, not traces"):
        on_day(Spec("azure-conv-30min", "trace", "conv.csv", "h200-llama3.1-8b"), 1, 0)
