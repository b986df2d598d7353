"""The prefill queueing floor: Erlang C against known values and the planner's use of it."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.config import PlannerConfig
from fleetplan.models.perf import Capacity
from fleetplan.models.queueing import (
    RECURSION_SERVERS,
    erlang_c,
    miss_share,
    queueing_replicas,
    slot_replicas,
    wait_exceeds,
    wait_stretch,
    window_miss_share,
)
from fleetplan.models.throughput import burst_rest, slot_budgets
from tests.models.factories import T0, decisions, ready, requests


def test_erlang_c_matches_the_textbook():
    # one server: the probability of waiting is the utilisation
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    # two servers at offered load 1: C = a^2 / (a^2 + 2(1 - a/2)(1 + a)) = 1/3
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # a classic call-centre case: 10 agents, 8 Erlangs -> 0.409
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-4)
    assert erlang_c(3, 0.0) == 0.0 and erlang_c(3, 3.0) == 1.0


def test_wait_tail_is_the_m_m_n_formula():
    # M/M/1: P(W > t) = rho * exp(-(mu - lambda) t)
    assert wait_exceeds(1, 2.0, 5.0, 0.3) == pytest.approx(0.4 * math.exp(-3.0 * 0.3))


@given(st.floats(0.1, 500), st.floats(0.5, 100), st.floats(0.01, 2.0), st.sampled_from([0.9, 0.99, 0.999]))
def test_the_fewest_engines_that_meet_the_share(demand, rate, budget, share):
    n = queueing_replicas(demand, rate, budget, share, 1)
    assert n > demand / rate  # never at or past saturation
    assert wait_exceeds(n, demand, rate, budget) <= 1 - share
    if n - 1 > demand / rate and n > 1:
        assert wait_exceeds(n - 1, demand, rate, budget) > 1 - share


def test_no_budget_means_no_queueing_answer():
    assert queueing_replicas(10.0, 5.0, 0.0, 0.99, 1) is None
    assert queueing_replicas(0.0, 5.0, 0.1, 0.99, 2) == 2


def test_large_fleets_run_hot_and_small_ones_keep_headroom():
    small = queueing_replicas(2.0, 4.0, 0.2, 0.99, 1)
    large = queueing_replicas(400.0, 4.0, 0.2, 0.99, 1)
    assert 2.0 / 4.0 / small < 0.35
    assert 400.0 / 4.0 / large > 0.85


def test_the_planner_floors_prefill_where_a_prompt_fills_the_ttft(make_fleet, h200):
    # 4 rps of 6,000-token prompts: one H200 8B engine serves them by rate, but each
    # pass takes a large part of the 500 ms TTFT, so prompts that arrive behind one wait too long
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(4, T0 + 1, T0 + 182, isl=6000)]
    by_rate = decisions(make_fleet(max_throughput_scaling_replicas=20).run(list(evs)))
    floored = decisions(make_fleet(max_throughput_scaling_replicas=20, prefill_sizing="queueing").run(list(evs)))
    rate_prefill = by_rate[0].targets["prefill"] if by_rate else 1
    assert floored[0].targets["prefill"] > rate_prefill


def test_fleetplan_defaults_size_above_dynamo_on_a_steady_load(make_fleet):
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 182)]
    dynamo = decisions(make_fleet().run(list(evs)))[0].targets
    ours = decisions(make_fleet(sizing="fleetplan").run(list(evs)))[0]
    assert ours.targets["prefill"] >= dynamo["prefill"] and ours.targets["decode"] >= dynamo["decode"]
    assert ours.predicted.horizon_windows == 2  # 120 s startup + one 180 s window


# --- bursty arrivals -------------------------------------------------------------


@given(st.floats(1.0, 200), st.floats(1.0, 50), st.floats(0.05, 1.0), st.floats(1.0, 30.0))
def test_bursty_arrivals_never_need_fewer_engines(demand, rate, budget, dispersion):
    poisson = queueing_replicas(demand, rate, budget, 0.99, 1)
    bursty = queueing_replicas(demand, rate, budget, 0.99, 1, arrival_dispersion=dispersion)
    assert bursty >= poisson
    assert wait_exceeds(bursty, demand, rate, budget, dispersion) <= 0.01


def test_dispersion_stretches_the_wait_tail_by_half_of_one_plus_it():
    # Kingman's heavy-traffic form: waits scale with (c_a^2 + c_s^2) / 2, c_s^2 = 1 here
    assert wait_exceeds(1, 2.0, 5.0, 0.3, 5.0) == pytest.approx(0.4 * math.exp(-3.0 * 0.3 / 3.0))
    # smoother than Poisson is not trusted: the floor stays Poisson's
    assert wait_exceeds(1, 2.0, 5.0, 0.3, 0.2) == wait_exceeds(1, 2.0, 5.0, 0.3)


def _clustered_arrivals(windows: int, cluster: int):
    """5 rps on average: ``cluster`` arrivals at once every ``cluster / 5`` seconds."""
    from tests.models.test_arrivals import arrivals

    evs = []
    for w in range(windows):
        t0 = T0 + 180 * w + 0.5
        for k in range(int(180 * 5 / cluster)):
            start = t0 + k * cluster / 5
            evs += arrivals(1000, start, start + cluster / 1000, isl=6000, tag=f"w{w}c{k}_")
    return evs


def test_window_dispersion_is_one_for_spread_arrivals_and_large_for_clusters():
    from fleetplan.models.state import TrafficWindow

    steady = TrafficWindow(second_arrivals={str(s): 5 for s in range(180)})
    assert steady.arrival_dispersion(0.0, 180) == 0.0
    clustered = TrafficWindow(second_arrivals={str(s): 50 for s in range(0, 180, 10)})
    assert clustered.arrival_dispersion(0.0, 180) == pytest.approx(45.0)  # (2500/10 - 25) / 5
    assert TrafficWindow(second_arrivals={"0": 29}).arrival_dispersion(0.0, 180) is None  # too few


def test_the_planner_adds_prefill_for_clustered_arrivals(make_fleet):
    # the same 5 rps of 6,000-token prompts, spread out or in clusters of 50
    from tests.models.test_arrivals import arrivals

    spread = [ready("p0", "prefill"), ready("d0", "decode"), *arrivals(5, T0 + 0.5, T0 + 540.5, isl=6000),
              *requests(5, T0 + 1, T0 + 541, isl=6000)]
    clustered = [ready("p0", "prefill"), ready("d0", "decode"), *_clustered_arrivals(3, 50),
                 *requests(5, T0 + 1, T0 + 541, isl=6000)]
    kw = {"sizing": "fleetplan", "max_throughput_scaling_replicas": 40}
    calm = decisions(make_fleet(**kw).run(sorted(spread, key=lambda e: e.time)))
    bursty = decisions(make_fleet(**kw).run(sorted(clustered, key=lambda e: e.time)))
    poisson = decisions(make_fleet(queueing_arrivals="poisson", **kw).run(sorted(clustered, key=lambda e: e.time)))
    assert bursty[-1].targets["prefill"] > poisson[-1].targets["prefill"]
    assert poisson[-1].targets["prefill"] == calm[-1].targets["prefill"]


# --- burstiness across time scales ----------------------------------------------


@given(st.floats(1.0, 30.0), st.floats(1.0, 200), st.floats(0.01, 0.99), st.floats(0.02, 1.0))
def test_a_flat_dispersion_curve_is_kingmans_stretch(dispersion, demand, load, budget):
    capacity = demand / load
    flat = [(1.0, dispersion), (2.0, dispersion), (16.0, dispersion)]
    assert wait_stretch(flat, capacity, demand, budget) == pytest.approx(wait_stretch(dispersion, capacity, demand, budget))
    assert wait_stretch(dispersion, capacity, demand, budget) == pytest.approx(max(1.0, (1.0 + dispersion) / 2.0))


@given(st.floats(1.0, 20.0), st.lists(st.floats(0.0, 40.0), min_size=4, max_size=4),
       st.floats(1.0, 200), st.floats(1.0, 50), st.floats(0.05, 1.0))
def test_dispersion_that_grows_with_the_scale_never_needs_fewer_engines(first, rises, demand, rate, budget):
    curve, level = [(1.0, first)], first
    for tau, rise in zip((2.0, 4.0, 8.0, 16.0), rises, strict=True):
        level += rise
        curve.append((tau, level))
    one_second = queueing_replicas(demand, rate, budget, 0.99, 1, arrival_dispersion=first)
    scales = queueing_replicas(demand, rate, budget, 0.99, 1, arrival_dispersion=curve)
    assert scales >= one_second
    assert miss_share(scales, demand, rate, [(1.0, budget)], curve) <= 0.01


def test_bursts_that_last_seconds_stretch_waits_more_the_closer_to_capacity():
    # Azure code's shape: dispersion 10 at 1 s, 40 at 5 s (docs/sizing.md)
    curve = [(1.0, 10.0), (2.0, 18.0), (4.0, 32.0), (8.0, 45.0), (16.0, 55.0)]
    kingman = wait_stretch(10.0, 300.0, 200.0, 0.4)
    assert kingman == pytest.approx(5.5)
    # at 2/3 of capacity a backlog of 0.4 s builds over about 1.2 s: already past the 1-s point
    at_two_thirds = wait_stretch(curve, 300.0, 200.0, 0.4)
    at_nine_tenths = wait_stretch(curve, 300.0, 270.0, 0.4)
    assert kingman < at_two_thirds < at_nine_tenths
    # a fleet far from capacity builds its backlog within a second: close to the 1-s point
    assert kingman <= wait_stretch(curve, 3000.0, 200.0, 0.4) < at_two_thirds


def test_window_dispersion_curve_per_time_scale():
    from fleetplan.models.state import TrafficWindow

    # steady arrivals: no variance at any scale
    steady = TrafficWindow(second_arrivals={str(s): 5 for s in range(180)})
    assert steady.dispersion_curve(0.0, 180.0) == [[1.0, 0.0], [2.0, 0.0], [4.0, 0.0], [8.0, 0.0], [16.0, 0.0]]
    # 10-s bursts at 3x the rate, every 30 s: flat within a burst, so the dispersion grows with the scale
    bursty = TrafficWindow(second_arrivals={str(s): (15 if s % 30 < 10 else 0) for s in range(180)})
    curve = dict((t, i) for t, i in bursty.dispersion_curve(0.0, 180.0))
    assert curve[1.0] == pytest.approx(10.0)  # (15^2 / 3 - 25) / 5
    assert curve[1.0] < curve[4.0] < curve[8.0]
    # the bins count from the window's start, not from the epoch
    shifted = TrafficWindow(second_arrivals={str(int(s) + 1000): n for s, n in bursty.second_arrivals.items()})
    assert shifted.dispersion_curve(1000.0, 180.0) == bursty.dispersion_curve(0.0, 180.0)
    # a one-minute window measures up to 4 s (8 whole bins each); too few arrivals: nothing
    assert [t for t, _ in steady.dispersion_curve(0.0, 60.0)] == [1.0, 2.0, 4.0]
    assert TrafficWindow(second_arrivals={"0": 29}).dispersion_curve(0.0, 180.0) is None


def test_a_window_from_its_first_request_counts_whole_seconds_only():
    """The first window runs from the first request, inside a second: that second, mostly before
    the window, held 5 arrivals where each whole one held 50, and counted as a bin it read as a
    burst. The compose demo's first window (30 s from 149.81) read a 1-s dispersion of 3.57 where
    its whole seconds give 1.52, and the one-number dispersion 0.43 (31 seconds over 30 bins)."""
    from fleetplan.models.state import TrafficWindow

    steady = TrafficWindow(second_arrivals={"100": 5, **{str(s): 50 for s in range(101, 160)}})
    # the window [100.9, 160): a tick ends it, so its last second is whole
    assert steady.dispersion_curve(100.9, 160 - 100.9) == [[1.0, 0.0], [2.0, 0.0], [4.0, 0.0]]
    assert steady.arrival_dispersion(100.9, 160 - 100.9) == 0.0
    # a window from a whole second counts it, as before
    assert steady.dispersion_curve(101.0, 59.0)[0] == [1.0, 0.0]


@pytest.mark.parametrize(("rate", "engine_rps", "budget"), [(2.0, 8.0, 0.3), (20.0, 8.0, 0.3), (170.0, 24.0, 0.4)])
def test_poisson_windows_get_the_same_floor_from_the_curve(rate, engine_rps, budget):
    """Measured on Poisson arrivals, the curve's noise at the long scales does not move the floor."""
    import numpy as np

    from fleetplan.models.state import TrafficWindow

    rng = np.random.default_rng(7)
    for _ in range(40):
        counts = rng.poisson(rate, 180)
        window = TrafficWindow(second_arrivals={str(s): int(c) for s, c in enumerate(counts) if c})
        one_second = window.arrival_dispersion(0.0, 180)
        curve = window.dispersion_curve(0.0, 180.0)
        assert queueing_replicas(rate, engine_rps, budget, 0.99, 1, arrival_dispersion=curve) == \
            queueing_replicas(rate, engine_rps, budget, 0.99, 1, arrival_dispersion=one_second)


def _bursts_of_seconds(windows: int, rate: float):
    """``rate`` rps on average of 6,000-token prompts: 20 s at half of it, then 20 s at 1.5 times it.

    Evenly spaced within each block, so a second holds what its block's
    rate says: the dispersion at 1 s is ``rate / 4``, and it grows with
    the scale up to the blocks' length.
    """
    from tests.models.test_arrivals import arrivals

    evs = []
    for w in range(windows):
        for k in range(9):
            start = T0 + 180 * w + 20 * k + 0.5
            evs += arrivals(rate * (1.5 if k % 2 else 0.5), start, start + 20, isl=6000, tag=f"w{w}b{k}_")
    return evs


def test_the_planner_adds_prefill_for_bursts_that_last_seconds(make_fleet):
    evs = sorted([ready("p0", "prefill"), ready("d0", "decode"), *_bursts_of_seconds(3, 40),
                  *requests(40, T0 + 1, T0 + 541, isl=6000)], key=lambda e: e.time)
    kw = {"sizing": "fleetplan", "max_throughput_scaling_replicas": 40}
    one_second = decisions(make_fleet(queueing_arrivals="measured", **kw).run(list(evs)))
    scales = decisions(make_fleet(queueing_arrivals="timescales", **kw).run(list(evs)))
    assert scales[-1].targets["prefill"] > one_second[-1].targets["prefill"]
    # the decision says what the floor took: the curve, or the 1-s point alone
    curve = scales[-1].predicted.arrival_dispersion
    assert [t for t, _ in curve] == [1.0, 2.0, 4.0, 8.0, 16.0] and curve[0][1] < curve[-1][1]
    assert one_second[-1].predicted.arrival_dispersion == [curve[0]]
    # Dynamo's sizing has no queueing floor, so nothing to say
    assert decisions(make_fleet(**kw | {"sizing": "reference"}).run(list(evs)))[-1].predicted.arrival_dispersion is None


def test_the_dispersion_curve_round_trips_with_the_state(make_fleet):
    import orjson

    from fleetplan.models.state import DeploymentState

    fleet = make_fleet(sizing="fleetplan")
    fleet.run(sorted([ready("p0", "prefill"), ready("d0", "decode"), *_bursts_of_seconds(1, 40)],
                     key=lambda e: e.time) + [requests(1, T0 + 181, T0 + 182)[0]])
    state = fleet.state("d")
    assert [t for t, _ in state.dispersion_curve] == [1.0, 2.0, 4.0, 8.0, 16.0]
    data = orjson.loads(orjson.dumps(state.to_data()))
    assert DeploymentState.from_data(data).dispersion_curve == state.dispersion_curve


# --- prompt classes: a budget per length bucket ---------------------------------


def test_one_class_is_the_single_budget():
    assert queueing_replicas(30.0, 5.0, [(1.0, 0.2)], 0.99, 1) == queueing_replicas(30.0, 5.0, 0.2, 0.99, 1)


def test_prompts_with_no_budget_are_left_out_of_the_share():
    # a third of the prompts cannot meet the TTFT however many engines wait for them
    mixed = queueing_replicas(30.0, 5.0, [(2.0, 0.2), (1.0, -0.1)], 0.99, 1)
    assert mixed == queueing_replicas(30.0, 5.0, 0.2, 0.99, 1)
    assert queueing_replicas(30.0, 5.0, [(1.0, -0.1), (1.0, 0.0)], 0.99, 1) is None


@given(st.floats(1.0, 200), st.floats(1.0, 50), st.floats(0.02, 1.0), st.floats(0.02, 1.0), st.floats(0.05, 0.95))
def test_the_share_weighted_miss_is_met_and_lies_between_the_classes(demand, rate, short, long, weight):
    classes = [(weight, short), (1.0 - weight, long)]
    n = queueing_replicas(demand, rate, classes, 0.99, 1)
    assert miss_share(n, demand, rate, classes) <= 0.01
    tight = queueing_replicas(demand, rate, min(short, long), 0.99, 1)
    loose = queueing_replicas(demand, rate, max(short, long), 0.99, 1)
    assert loose <= n <= tight


def test_short_prompts_get_a_floor_when_the_mean_prompt_cannot_meet_the_ttft(make_fleet):
    # 200 ms TTFT on the H200 8B: a 16k-token prompt's own pass takes ~330 ms and the
    # mean prompt (11.4k tokens) ~235 ms, so by the mean nothing can be done but size
    # by rate; the 500-token prompts (30 %) still meet it if they do not wait
    long = requests(2.1, T0 + 1, T0 + 182, isl=16_000, osl=100, tag="l")
    short = requests(0.9, T0 + 1.3, T0 + 182, isl=500, osl=100, tag="s")
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *long, *short]
    kw = {"sizing": "fleetplan", "ttft_ms": 200, "itl_ms": 20, "max_throughput_scaling_replicas": 20}
    at = T0 + 180
    by_mean = [o for o in make_fleet(capacity_mix="mean", **kw).run(list(evs)) if o.time == at][0]
    by_bucket = [o for o in make_fleet(**kw).run(list(evs)) if o.time == at][0]
    assert by_mean.predicted.isl > 11_000
    assert by_bucket.targets["prefill"] > by_mean.targets["prefill"]
    # the tick says what set the count: the floor, above the rate
    est = by_bucket.estimates["prefill"]
    assert est.queueing_replicas == by_bucket.targets["prefill"] > est.rate_replicas
    assert by_mean.estimates["prefill"].queueing_replicas is None  # the mean prompt has no budget
    assert by_bucket.estimates["decode"].queueing_replicas is None and by_bucket.estimates["decode"].rate_replicas >= 1


def test_the_worker_exports_what_set_the_count(make_fleet):
    """fleetplan_sizing_replicas carries both counts of a tick to Prometheus."""
    from fleetplan.streams.metrics import WorkerMetrics

    long = requests(2.1, T0 + 1, T0 + 182, isl=16_000, osl=100, tag="l")
    short = requests(0.9, T0 + 1.3, T0 + 182, isl=500, osl=100, tag="s")
    fleet = make_fleet(sizing="fleetplan", ttft_ms=200, itl_ms=20, max_throughput_scaling_replicas=20)
    report = [o for o in fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *long, *short])
              if o.time == T0 + 180][0]
    metrics = WorkerMetrics()
    metrics.observe_tick(report, next(iter(fleet.states.values())))
    est = report.estimates["prefill"]

    def value(role, by):
        return metrics.registry.get_sample_value("fleetplan_sizing_replicas", {"deployment": "d", "role": role, "by": by})

    assert value("prefill", "queueing") == est.queueing_replicas and value("prefill", "rate") == est.rate_replicas
    assert value("decode", "queueing") is None and value("decode", "rate") >= 1


def test_a_throughput_tick_without_a_queueing_count_exports_none(make_fleet):
    """The series is what the last throughput tick's sizing asked for: where that tick had no
    queueing floor (no prompt of the mix can meet the TTFT by waiting less), the count an
    earlier tick had is not what sized the fleet. It stayed exported, above the target."""
    from fleetplan.streams.metrics import WorkerMetrics

    long = requests(2.1, T0 + 1, T0 + 182, isl=16_000, osl=100, tag="l")
    short = requests(0.9, T0 + 1.3, T0 + 182, isl=500, osl=100, tag="s")
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *long, *short]
    kw = {"sizing": "fleetplan", "ttft_ms": 200, "itl_ms": 20, "max_throughput_scaling_replicas": 20}
    with_floor = make_fleet(**kw)
    floored = [o for o in with_floor.run(list(evs)) if o.time == T0 + 180][0]
    without = [o for o in make_fleet(capacity_mix="mean", **kw).run(list(evs)) if o.time == T0 + 180][0]
    assert floored.estimates["prefill"].queueing_replicas is not None
    assert without.predicted is not None and without.estimates["prefill"].queueing_replicas is None
    metrics = WorkerMetrics()
    state = next(iter(with_floor.states.values()))
    metrics.observe_tick(floored, state)
    metrics.observe_tick(without, state)

    def value(role, by):
        return metrics.registry.get_sample_value("fleetplan_sizing_replicas", {"deployment": "d", "role": role, "by": by})

    assert value("prefill", "queueing") is None
    assert value("prefill", "rate") == without.estimates["prefill"].rate_replicas


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(0.01, 0.99))
def test_a_snapshot_mid_stream_decides_the_same_with_the_dispersion_curve(make_fleet, where):
    """The curve lives in the state a changelog table stores: a worker restored from it decides the same."""
    import orjson

    from fleetplan.models.fleet import Fleet

    events = sorted([ready("p0", "prefill"), ready("d0", "decode"), *_bursts_of_seconds(2, 10),
                     *requests(10, T0 + 1, T0 + 361, isl=6000)], key=lambda e: e.time)
    kw = {"sizing": "fleetplan", "max_throughput_scaling_replicas": 40}
    expected = [o.to_dict() for o in make_fleet(**kw).run(list(events))]
    cut = int(where * len(events))
    first = make_fleet(**kw)
    got = [o.to_dict() for e in events[:cut] for o in first.feed(e)]
    blob = orjson.dumps(first.to_data())
    restored = Fleet(first.planner)
    restored.load_data(orjson.loads(blob))
    assert orjson.dumps(restored.to_data()) == blob
    got += [o.to_dict() for e in events[cut:] for o in restored.feed(e)]
    got += [o.to_dict() for o in restored.finish()]
    assert got == expected
    assert any(o["decision_id"] is not None for o in expected)


# --- decode: the wait for a batch slot ------------------------------------------


@given(st.integers(RECURSION_SERVERS + 1, 300_000), st.floats(0.5, 0.999))
def test_erlang_c_past_the_recursion_is_continuous_with_it(servers, load):
    """Above ``RECURSION_SERVERS`` Erlang B comes from the Poisson law; it is the same function."""
    offered = servers * load
    exact = _erlang_c_by_recursion(servers, offered)
    assert erlang_c(servers, offered) == pytest.approx(exact, rel=1e-8, abs=1e-300)


def _erlang_c_by_recursion(servers: int, offered: float) -> float:
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1.0 - blocking))


@settings(max_examples=40)
@given(st.floats(1.0, 400), st.floats(10.0, 80.0), st.sampled_from([8, 64, 256]), st.floats(0.01, 8.0))
def test_the_fewest_decode_engines_whose_slots_rarely_make_a_request_wait(demand, rate, slots, budget):
    n = slot_replicas(demand, rate, slots, budget, 0.99, 1)
    assert n > demand / rate  # never at or past the batch limit
    assert miss_share(n * slots, demand, rate / slots, [(1.0, budget)]) <= 0.01
    if n - 1 > demand / rate:
        assert miss_share((n - 1) * slots, demand, rate / slots, [(1.0, budget)]) > 0.01


def test_many_slots_run_decode_near_its_limit_where_a_fixed_utilisation_would_not():
    # 3.9 engines of load, 256 slots each, seconds of ITL to spare: 4 engines (96 %), where
    # sizing at 80 % of the rate asks for 5
    assert slot_replicas(218.0, 57.0, 256, 6.0, 0.99, 1) == 4
    # with almost no ITL to spare the wait must be rare: the count goes up
    assert slot_replicas(218.0, 57.0, 256, 0.005, 0.99, 1) == 5
    # one slot an engine is M/M/n over the engines: the prefill floor's model
    assert slot_replicas(20.0, 4.0, 1, 0.5, 0.99, 1) == queueing_replicas(20.0, 4.0, 0.5, 0.99, 1)
    assert slot_replicas(211.0, 57.0, 256, [], 0.99, 1) is None
    assert slot_replicas(0.0, 57.0, 256, 6.0, 0.99, 2) == 2


# Mooncake's decode at seed 1 (docs/sizing.md): 5.5 rps an engine at its 71-sequence KV limit, one
# answer in six short enough to have 0.3 s of ITL to spare, the rest 6 s
MOONCAKE_SLOT_BUDGETS = [(0.17, 0.3), (0.83, 6.0)]


def test_a_burst_weighted_by_its_share_of_the_window_spends_the_engine_only_the_burst_asked_for():
    """Busiest minute 20.3 rps, the rest of the 180-s window 19.6 (66 % of its requests): held to
    1 % misses at 20.3 the slots ask for 5 engines (1.24 % miss on 4); the window's requests miss
    0.61 % on 4, under 1 %."""
    b = MOONCAKE_SLOT_BUDGETS
    rest = 19.6 * 120 / (19.6 * 120 + 20.3 * 60)
    assert slot_replicas(20.3, 5.5, 71, b, 0.99, 1) == 5
    assert slot_replicas(20.3, 5.5, 71, b, 0.99, 1, rest=(rest, 19.6)) == 4 == slot_replicas(19.6, 5.5, 71, b, 0.99, 1)
    on_four = [miss_share(4 * 71, rps, 5.5 / 71, b) for rps in (20.3, 19.6)]
    assert round(on_four[0], 4) == 0.0124
    window = window_miss_share(lambda rps: miss_share(4 * 71, rps, 5.5 / 71, b), 20.3, rest, 19.6)
    assert window == pytest.approx((1 - rest) * on_four[0] + rest * on_four[1])
    assert round(window, 4) == 0.0061
    # a burst past four engines' rate misses for all its requests, whatever the rest do
    rest = 19.6 * 120 / (19.6 * 120 + 21.5 * 60)
    assert slot_replicas(21.5, 5.5, 71, b, 0.99, 1, rest=(rest, 19.6)) == 5


def test_weighting_never_sizes_below_the_bursts_own_rate():
    """Below the burst's rate the fleet has no steady state for that minute: its backlog runs into the
    window's other seconds, which the steady miss at the rest's rate does not see. Searched from the
    rest's rate, a window whose burst holds under ``1 - share`` of its requests (a share of 0.6, or a
    short burst window) was sized under the burst; and a burst more than ``MAX_EXTRA_ENGINES`` over
    the rest ran the search out and returned a count that meets nothing (13,001 engines for a burst
    of 15,000 engines' rate, where the burst alone asks for 15,002)."""
    b = MOONCAKE_SLOT_BUDGETS
    assert slot_replicas(20.3, 5.5, 71, b, 0.6, 1, rest=(0.7, 10.0)) >= 4  # 20.3 rps is 3.7 engines' rate
    burst = 15_000 * 5.5
    assert slot_replicas(burst, 5.5, 71, b, 0.99, 1, rest=(0.5, burst / 5)) > 15_000


@settings(max_examples=40)
@given(st.floats(1.0, 400), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(10.0, 80.0),
       st.sampled_from([8, 64, 256]), st.floats(0.01, 8.0))
def test_weighting_the_burst_never_asks_for_more_than_the_burst_nor_fewer_than_the_rest(
        burst, rest_share, rest_level, rate, slots, budget):
    rest_rps = burst * rest_level
    alone = slot_replicas(burst, rate, slots, budget, 0.99, 1)
    weighted = slot_replicas(burst, rate, slots, budget, 0.99, 1, rest=(rest_share, rest_rps))
    assert weighted <= alone
    if rest_rps > 0:
        assert weighted >= slot_replicas(rest_rps, rate, slots, budget, 0.99, 1)
    if rest_share == 0:
        assert weighted == alone


def test_the_rest_of_a_window_is_what_its_quantile_leaves_outside_the_busiest_burst():
    cfg = PlannerConfig()  # 180-s windows, a 60-s burst
    share, rps = burst_rest(cfg, 20.3, 19.6 * 180)
    assert share == pytest.approx(1 - 20.3 * 60 / (19.6 * 180))
    assert rps == pytest.approx((19.6 * 180 - 20.3 * 60) / 120)
    # a spike that holds the window's quantile, or no burst sub-window: the burst is sized alone
    assert burst_rest(cfg, 60.0, 20.0 * 180) is None
    assert burst_rest(PlannerConfig(burst_window_seconds=0), 20.3, 19.6 * 180) is None
    assert burst_rest(PlannerConfig(burst_window_seconds=180), 20.3, 19.6 * 180) is None


def test_with_no_itl_to_spare_the_slot_count_is_where_a_request_rarely_waits():
    """docs/sizing.md: on a few engines that is the headroom's count; on a large fleet fewer, since
    its slots pool their waits (the page said the count was then what it was by rate)."""
    from fleetplan.models.throughput import replicas_for

    assert slot_replicas(218.0, 57.0, 256, 1e-6, 0.99, 1) == 5 == replicas_for(218.0, 57.0 * 0.8, 1)
    assert slot_replicas(5700.0, 57.0, 256, 1e-6, 0.99, 1) == 102
    assert replicas_for(5700.0, 57.0 * 0.8, 1) == 125
    # a budget of nothing leaves bursts no wait to stretch
    assert slot_replicas(5700.0, 57.0, 256, 1e-6, 0.99, 1, arrival_dispersion=20.0) == 102


def test_slot_budgets_are_the_itl_to_spare_over_each_answer():
    cfg = PlannerConfig(itl_ms=50.0)
    at_limit = Capacity(55.0, 256, None, 20.0, True, at_limit=True)
    # 30 ms of ITL over 99 and 399 further tokens
    assert slot_budgets(cfg, at_limit, [(0.75, 100.0), (0.25, 400.0)]) == [
        (0.75, pytest.approx(2.97)), (0.25, pytest.approx(11.97))]
    # where the ITL target set the batch, a request over it joins and slows the batch: no wait model
    itl_bound = Capacity(55.0, 120, None, 49.9, True, at_limit=False)
    assert slot_budgets(cfg, itl_bound, [(1.0, 100.0)]) == []
    missed = Capacity(55.0, 256, None, 60.0, False, at_limit=True)
    assert slot_budgets(cfg, missed, [(1.0, 100.0)]) == []


def test_the_planner_sizes_decode_by_its_slots_where_the_itl_has_room(make_fleet):
    # 20 rps of 3,000/150 requests at 500/50 on the H200 8B: decode runs at its sequence
    # limit with ITL to spare, so the slot queue sets the count, at or below the headroom's
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(60, T0 + 1, T0 + 182, osl=300)]
    kw = {"sizing": "fleetplan", "max_throughput_scaling_replicas": 20}
    slots = decisions(make_fleet(**kw).run(list(evs)))[0]
    rate = decisions(make_fleet(decode_sizing="rate", **kw).run(list(evs)))[0]
    est = slots.estimates["decode"]
    assert est.queueing_replicas == slots.targets["decode"] <= est.rate_replicas
    assert rate.targets["decode"] == rate.estimates["decode"].rate_replicas
    assert rate.estimates["decode"].queueing_replicas is None
    assert slots.targets["prefill"] == rate.targets["prefill"]  # prefill is untouched


def test_the_queueing_floor_stops_at_max_engines_just_below_it():
    """An offered load just under MAX_ENGINES with bursty arrivals searched past the cap
    (100,748 engines) until 2026-12-05; the cap holds wherever the search starts."""
    from fleetplan.models.queueing import MAX_ENGINES, queueing_replicas

    assert queueing_replicas(99_999, 1, 0.001, 0.99, 1, arrival_dispersion=50) == MAX_ENGINES
