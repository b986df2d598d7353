"""Traffic forecasting: idle rules, warm start, bucketing and the loss."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from fleetplan.models.forecast import (
    TrafficForecaster,
    TrafficObservation,
    bucket_traffic,
    window_loss,
)

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def window(num_req: float, isl: float = 0.0, osl: float = 0.0, **extra) -> TrafficObservation:
    return TrafficObservation(duration_s=60.0, num_req=num_req, isl=isl, osl=osl, **extra)


def points(forecaster: TrafficForecaster) -> tuple[int, int, int]:
    return tuple(p.num_points for p in forecaster.predictors)


# --- idle rules --------------------------------------------------------------


def test_no_traffic_forecasts_zeros():
    f = TrafficForecaster("constant")
    assert f.forecast() == (0.0, 0.0, 0.0)
    f.observe(window(0))
    f.observe(window(float("nan"), float("nan"), float("nan")))
    assert f.forecast() == (0.0, 0.0, 0.0)
    assert points(f) == (0, 0, 0)  # an idle start feeds nothing


def test_idle_window_after_traffic_carries_lengths_forward():
    f = TrafficForecaster("constant")
    f.observe(window(10, 3000.0, 150.0))
    assert f.forecast() == (10.0, 3000.0, 150.0)
    f.observe(window(0, 0.0, 0.0))
    # the count drops to 0; ISL/OSL stay at the last busy window's means
    assert f.forecast() == (0.0, 3000.0, 150.0)
    assert points(f) == (2, 2, 2)  # the three series stay aligned
    f.observe(window(4, 1000.0, 50.0))
    assert f.forecast() == (4.0, 1000.0, 50.0)


@pytest.mark.parametrize("kind", ["constant", "kalman", "ensemble"])
@pytest.mark.parametrize("undefined", [float("nan"), 0.0, float("inf"), -1.0])
def test_a_busy_window_with_an_undefined_length_carries_the_last_one(kind, undefined):
    """Requests arrived and none finished (Dynamo's 0/0): the OSL is unmeasured, not 0. Until
    2026-12-05 the 0 was fed and kept, and the next window was forecast at 0 output tokens."""
    carried, measured = TrafficForecaster(kind), TrafficForecaster(kind)
    for n in range(100, 120):
        carried.observe(window(n, 2000.0, 150.0))
        measured.observe(window(n, 2000.0, 150.0))
    carried.observe(window(120, undefined, undefined))
    measured.observe(window(120, 2000.0, 150.0))
    assert carried.forecast() == measured.forecast() and carried.forecast()[2] > 0.0
    assert carried.last_osl == 150.0 and points(carried) == (21, 21, 21)
    carried.observe(window(0))  # an idle window after it carries the same lengths
    measured.observe(window(0))
    assert carried.to_state() == measured.to_state()


def test_a_length_not_measured_yet_starts_at_its_first_measurement():
    """With no OSL known, a 0 is all there is: the OSL predictor drops it as its idle start, and
    no 0 is kept to carry; the count and ISL go on, and the OSL joins them at its first one."""
    f = TrafficForecaster("constant")
    f.observe(window(10, 3000.0, float("nan")))
    assert points(f) == (1, 1, 0) and f.last_osl is None
    assert f.forecast() == (10.0, 3000.0, 0.0)
    f.observe(window(0))  # idle: the ISL is carried; the OSL, still in its idle start, is not
    assert points(f) == (2, 2, 0)
    f.observe(window(12, float("nan"), 140.0))
    assert points(f) == (3, 3, 1) and f.forecast() == (12.0, 3000.0, 140.0)
    f.observe(window(0))
    f.observe(window(9, 2500.0, 0.0))
    assert points(f) == (5, 5, 3) and f.forecast() == (9.0, 2500.0, 140.0)


def test_kalman_lengths_are_not_dragged_down_by_idle_windows():
    f = TrafficForecaster("kalman")
    for n in (20, 22, 0, 0, 0, 21, 0, 0):
        f.observe(window(n, 2000.0, 200.0) if n else window(0))
    _, isl, osl = f.forecast()
    assert isl == pytest.approx(2000.0) and osl == pytest.approx(200.0)


def test_warm_then_idle_live_start_is_skipped():
    f = TrafficForecaster("constant")
    f.warm([window(5, 100.0, 10.0), window(0), window(8, 200.0, 20.0)])
    assert points(f) == (3, 3, 3)
    assert all(p.is_skipping_idle for p in f.predictors)
    f.observe(window(0))  # the deployment starts idle after the warm-up
    assert points(f) == (3, 3, 3)
    assert f.forecast() == (8.0, 200.0, 20.0)
    f.observe(window(2, 300.0, 30.0))
    f.observe(window(0))
    assert points(f) == (5, 5, 5)
    assert f.forecast() == (0.0, 300.0, 30.0)


def test_an_idle_live_start_moves_the_lengths_daily_clock_with_the_counts():
    """Windows without a start are counted, idle ones included (docs/forecasting.md): an idle
    live start moved the count's ensemble clock but fed the lengths nothing, so their daily
    cycle fell behind by every idle window (clocks 14, 11, 11 after 10 busy, 3 idle, 1 busy)."""
    f = TrafficForecaster("ensemble")
    f.warm([window(5 + i, 100.0, 10.0) for i in range(10)])
    for _ in range(3):
        f.observe(window(0))
    f.observe(window(7, 120.0, 12.0))
    assert [p._clock for p in f.predictors] == [14, 14, 14]
    assert points(f) == (11, 11, 11)  # the idle start's zeros were dropped by all three


def test_kv_hit_rate_and_accept_length_are_last_values():
    f = TrafficForecaster("constant")
    assert (f.kv_hit_rate, f.accept_length) == (0.0, 1.0)  # cold start: no discount
    f.observe(window(3, 10.0, 10.0, kv_hit_rate=0.4, accept_length=2.5))
    f.observe(window(0, kv_hit_rate=None, accept_length=float("nan")))
    assert (f.kv_hit_rate, f.accept_length) == (0.4, 2.5)


def test_unknown_kind_fails_at_construction():
    with pytest.raises(ValueError, match="valid kinds"):
        TrafficForecaster("oracle")


@pytest.mark.parametrize(
    "kind,params",
    [("constant", {}), ("kalman", {"log1p": True}), ("arima", {"arima_max_history": 16})],
)
def test_forecaster_state_round_trips_exactly(kind, params):
    windows = [window(n, 1000.0 + 10 * n, 100.0 + n) for n in (5, 9, 0, 12, 7, 0, 15, 11, 9)]
    f = TrafficForecaster(kind, **params)
    f.warm(windows[:6])
    f.observe(window(0, kv_hit_rate=0.25))
    state = json.loads(json.dumps(f.to_state(), allow_nan=False))
    g = TrafficForecaster.from_state(state)
    assert g.to_state() == f.to_state()
    for w in windows[6:]:
        f.observe(w)
        g.observe(w)
    assert [x.hex() for x in g.forecast()] == [x.hex() for x in f.forecast()]
    assert g.kv_hit_rate == 0.25


def test_warm_from_a_real_trace_slice():
    from fleetplan.sim.traces import read_trace, trace_arrivals

    reqs = read_trace(TRACES / "azure2023_code_head30.csv")
    windows = bucket_traffic(trace_arrivals(reqs), 10.0)
    assert sum(w.num_req for w in windows) == 30
    f = TrafficForecaster("kalman", kalman_min_points=2)
    f.warm(windows)
    num_req, isl, osl = f.forecast()
    assert num_req >= 0.0 and isl > 0.0 and osl > 0.0


def test_window_starts_reach_every_predictor_before_its_value():
    seen = []
    f = TrafficForecaster("constant")
    for name, predictor in zip(("num_req", "isl", "osl"), f.predictors, strict=True):
        predictor.note_window_start = lambda start_s, name=name: seen.append((name, start_s))
    f.observe(TrafficObservation(duration_s=60.0, num_req=3.0, isl=10.0, osl=2.0, start_s=120.0))
    f.observe(TrafficObservation(duration_s=60.0, num_req=3.0, isl=10.0, osl=2.0))  # no time: nothing
    f.observe(TrafficObservation(duration_s=60.0, num_req=0.0, isl=0.0, osl=0.0, start_s=float("nan")))
    assert seen == [("num_req", 120.0), ("isl", 120.0), ("osl", 120.0)]


# --- bucketing ---------------------------------------------------------------


def test_bucketing_by_hand():
    # Windows of 60 s from the first arrival (t=5): [5,65) [65,125) [125,185) [185,245)
    arrivals = [(200.0, 400.0, 40.0), (5.0, 100.0, 10.0), (6.0, 300.0, 30.0), (70.0, 50.0, 5.0)]
    got = bucket_traffic(arrivals, 60.0)
    assert [(w.num_req, w.isl, w.osl) for w in got] == [
        (2.0, 200.0, 20.0),
        (1.0, 50.0, 5.0),
        (0.0, 0.0, 0.0),  # the lull in the middle is kept
        (1.0, 400.0, 40.0),
    ]
    assert all(w.duration_s == 60.0 for w in got)
    assert all(w.start_s is None for w in got)  # a trace's clock is not a time of day
    # nothing before the first arrival or after the last
    assert got[0].num_req > 0 and got[-1].num_req > 0


def test_bucketing_edges_and_window_boundaries():
    # an arrival exactly on a boundary opens the next window
    got = bucket_traffic([(0.0, 1.0, 1.0), (10.0, 3.0, 3.0), (29.9, 5.0, 5.0)], 10.0)
    assert [w.num_req for w in got] == [1.0, 1.0, 1.0]
    # a long idle gap between two requests: every empty window kept, no others
    got = bucket_traffic([(100.0, 1.0, 1.0), (145.0, 1.0, 1.0)], 10.0)
    assert [w.num_req for w in got] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert bucket_traffic([], 10.0) == []


def test_bucketing_does_not_depend_on_arrival_order():
    arrivals = [(0.1 * i, 1000.0 / (i + 3), 7.0 * i) for i in range(50)]
    assert bucket_traffic(arrivals, 1.0) == bucket_traffic(list(reversed(arrivals)), 1.0)


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
def test_bucketing_rejects_bad_intervals(interval):
    with pytest.raises(ValueError, match="interval_s must be a positive finite number"):
        bucket_traffic([(0.0, 1.0, 1.0)], interval)


# --- loss --------------------------------------------------------------------


def test_window_loss_by_hand():
    assert window_loss((10.0, 100.0, 5.0), (10.0, 100.0, 5.0)) == 0.0
    # all four terms are |log1p(0) - log1p(1)| = ln 2, weights sum to 1
    assert window_loss((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)) == pytest.approx(math.log(2.0))
    # n̂·î = 6 vs 1, n̂·ô = 2 vs 0, î = 3 vs 1, ô = 1 vs 0
    expected = 0.4 * math.log(7 / 2) + 0.4 * math.log(3) + 0.1 * math.log(4 / 2) + 0.1 * math.log(2)
    assert window_loss((2.0, 3.0, 1.0), (1.0, 1.0, 0.0)) == pytest.approx(expected, rel=1e-12)


def test_window_loss_is_symmetric_and_scale_free():
    a, b = (12.0, 3000.0, 150.0), (20.0, 2500.0, 300.0)
    assert window_loss(a, b) == pytest.approx(window_loss(b, a))
    # missing by 2x costs about the same at any traffic level
    small = window_loss((20.0, 1000.0, 100.0), (10.0, 1000.0, 100.0))
    large = window_loss((2000.0, 1000.0, 100.0), (1000.0, 1000.0, 100.0))
    assert small == pytest.approx(large, abs=1e-3)
