"""Sizing past the reference: startup-aware quantiles and the ISL/OSL mix."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetplan.models.mix import LengthMix, bucket_of, mix_capacity, mix_factor
from fleetplan.models.state import DeploymentState
from fleetplan.schemas import Ack, ClockEvent, ControlEvent, InventoryEvent, SetConfig
from tests.models.factories import T0, ack, decisions, fpm, ready, requests

INTERVAL = 180


def _inventory(worker, state, t, decision_id=None, role="prefill"):
    return InventoryEvent(deployment="d", time=t, worker_id=worker, role=role, state=state,
                          decision_id=decision_id)


def _clock(t: float) -> ClockEvent:
    """Move event time on, so buffered events are folded at the ticks before ``t``."""
    return ClockEvent(deployment="d", time=t)


def _state(fleet) -> DeploymentState:
    return fleet.states["d"]


# --- the startup horizon ---------------------------------------------------------


@pytest.mark.parametrize(("startup", "windows"), [(0, 1), (60, 2), (180, 2), (181, 3), (600, 5)])
def test_horizon_covers_startup_plus_one_interval(make_fleet, startup, windows):
    from fleetplan.models.startup import startup_horizon_windows

    fleet = make_fleet(throughput_sizing="startup_quantile", startup_seconds=startup)
    fleet.run([ready("p0", "prefill"), ready("d0", "decode")])
    assert startup_horizon_windows(_state(fleet)) == windows


def test_startup_is_measured_from_the_decision_to_ready(make_fleet):
    from fleetplan.models.startup import measured_startup_seconds

    fleet = make_fleet(throughput_sizing="startup_quantile", startup_seconds=30)
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(40, T0 + 1, T0 + 181)])
    (d,) = decisions(out)
    assert d.targets["prefill"] > 1
    t_ready = T0 + 180 + 450.0
    fleet.run([
        _inventory("p1", "starting", T0 + 181, d.decision_id),
        _inventory("p1", "ready", t_ready, d.decision_id),
        _clock(T0 + 5 * INTERVAL),
    ])
    assert _state(fleet).startup_samples == [450.0]
    assert measured_startup_seconds(_state(fleet)) == 450.0


def test_startup_without_a_decision_id_is_timed_from_starting(make_fleet):
    fleet = make_fleet()
    fleet.run([_inventory("p9", "starting", T0 + 1), _inventory("p9", "ready", T0 + 91),
               _clock(T0 + INTERVAL + 5)])
    assert _state(fleet).startup_samples == [90.0]


def test_a_starting_event_sent_again_does_not_restart_the_startup(make_fleet):
    """An orchestrator's producer retried (at least once): the second ``starting`` says nothing new,
    and timing from it measured 40 s of a 90-s startup."""
    fleet = make_fleet()
    fleet.run([_inventory("p9", "starting", T0 + 1), _inventory("p9", "starting", T0 + 51),
               _inventory("p9", "ready", T0 + 91), _inventory("p9", "ready", T0 + 95),
               _clock(T0 + INTERVAL + 5)])
    state = _state(fleet)
    assert state.startup_samples == [90.0] and state.workers["p9"].since == T0 + 91


def test_median_of_recent_startups_resists_one_slow_pull(make_fleet):
    from fleetplan.models.startup import measured_startup_seconds

    fleet = make_fleet(startup_seconds=120)
    evs = []
    for i, seconds in enumerate([100, 110, 900, 105]):
        evs += [_inventory(f"p{i}", "starting", T0 + 10 * i),
                _inventory(f"p{i}", "ready", T0 + 10 * i + seconds)]
    fleet.run(sorted(evs, key=lambda e: e.time) + [_clock(T0 + 6 * INTERVAL)])
    assert measured_startup_seconds(_state(fleet)) == 110


def test_only_the_recent_startups_count(make_fleet):
    """The median is of the last ``STARTUP_SAMPLES`` startups: after eight slow ones (a cold image
    cache) eight fast ones are the startup, and the state keeps no more than that. The test above
    has four samples, so keeping every startup ever measured (a horizon stretched by pulls long
    past, and a state that grows for good) passed it."""
    from fleetplan.models.startup import STARTUP_SAMPLES, measured_startup_seconds

    fleet = make_fleet(startup_seconds=120)
    evs = []
    for i in range(2 * STARTUP_SAMPLES):
        start, seconds = (T0 + 10 * i, 600) if i < STARTUP_SAMPLES else (T0 + 700 + 10 * i, 100)
        evs += [_inventory(f"p{i}", "starting", start), _inventory(f"p{i}", "ready", start + seconds)]
    fleet.run(sorted(evs, key=lambda e: e.time) + [_clock(T0 + 12 * INTERVAL)])
    state = _state(fleet)
    assert state.startup_samples == [100.0] * STARTUP_SAMPLES
    assert measured_startup_seconds(state) == 100


# --- startups timed by acks, where no inventory is written -------------------------


def _scale_up_without_inventory(make_fleet):
    """Engines known only from their FPMs (the live stack), and a scale-up decision for them."""
    fleet = make_fleet(throughput_sizing="startup_quantile", startup_seconds=30)
    out = fleet.run([fpm("p0", "prefill", T0 + 0.5), fpm("d0", "decode", T0 + 0.5),
                     *requests(40, T0 + 1, T0 + 181)])
    (d,) = decisions(out)
    assert d.targets["prefill"] > d.previous["prefill"] == 1
    assert not _state(fleet).inventory_seen
    return fleet, d


def test_a_measured_startup_is_held_to_the_configs_bound(make_fleet):
    """A ready event from a clock-skewed orchestrator (three years after its ``starting``; the
    schema takes any time before 2100) is no startup a horizon can span: the horizon is that many
    windows of quantiles (5.6e5 at 180 s took 6 s and 90 MB a quantile, two a tick), which is why
    ``startup_seconds`` stops at a day."""
    from fleetplan.models.config import MAX_STARTUP_SECONDS
    from fleetplan.models.startup import measured_startup_seconds, startup_horizon_windows

    fleet = make_fleet(throughput_sizing="startup_quantile")
    state = fleet.planner.new_state("d")
    fleet.planner.apply(state, _inventory("p9", "starting", T0 + 1))
    fleet.planner.apply(state, _inventory("p9", "ready", T0 + 1 + 1e8))
    assert state.startup_samples == [1e8]  # measured as it came
    assert measured_startup_seconds(state) == MAX_STARTUP_SECONDS
    assert startup_horizon_windows(state) == math.ceil((MAX_STARTUP_SECONDS + INTERVAL) / INTERVAL)


def _applied(d, t, observed):
    return Ack(deployment="d", time=t, decision_id=d.decision_id, status="applied", observed=observed)


def test_without_inventory_the_ack_of_a_served_scale_up_times_the_startup(make_fleet):
    from fleetplan.models.startup import measured_startup_seconds, startup_horizon_windows

    fleet, d = _scale_up_without_inventory(make_fleet)
    assert startup_horizon_windows(_state(fleet)) == 2  # the configured 30 s
    fleet.run([_applied(d, d.time + 400.0, dict(d.targets)), _clock(T0 + 5 * INTERVAL)])
    assert _state(fleet).startup_samples == [400.0]
    assert measured_startup_seconds(_state(fleet)) == 400.0
    assert startup_horizon_windows(_state(fleet)) == 4  # ceil((400 + 180) / 180)


@pytest.mark.parametrize("observed", [
    {},                              # the connector could not read what serves
    {"decode": 1},                   # nothing said of the role that rose
    {"prefill": 1, "decode": 1},     # it stopped waiting before the new engines served
], ids=["none", "role-missing", "short"])
def test_an_ack_short_of_a_target_times_nothing(make_fleet, observed):
    fleet, d = _scale_up_without_inventory(make_fleet)
    fleet.run([_applied(d, d.time + 400.0, observed), _clock(T0 + 5 * INTERVAL)])
    state = _state(fleet)
    assert state.startup_samples == []
    assert state.desired == dict(d.targets)  # the ack itself is folded as before


@pytest.mark.parametrize("status", ["failed", "superseded"])
def test_an_ack_that_did_not_apply_times_nothing(make_fleet, status):
    fleet, d = _scale_up_without_inventory(make_fleet)
    fleet.run([Ack(deployment="d", time=d.time + 400.0, decision_id=d.decision_id, status=status,
                   observed=dict(d.targets)), _clock(T0 + 5 * INTERVAL)])
    assert _state(fleet).startup_samples == []


def test_with_inventory_its_ready_events_time_the_startup_and_the_ack_does_not(make_fleet):
    fleet = make_fleet(throughput_sizing="startup_quantile", startup_seconds=30)
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(40, T0 + 1, T0 + 181)])
    (d,) = decisions(out)
    assert _state(fleet).inventory_seen
    fleet.run([
        _inventory("p1", "starting", T0 + 181, d.decision_id),
        _inventory("p1", "ready", d.time + 450.0, d.decision_id),
        _applied(d, d.time + 450.0, dict(d.targets)),
        _clock(T0 + 5 * INTERVAL),
    ])
    assert _state(fleet).startup_samples == [450.0]  # one scale-up, one sample


def test_an_ack_of_a_decision_that_added_no_engine_times_nothing(make_fleet):
    from fleetplan.models.startup import ack_startup_sample

    fleet, d = _scale_up_without_inventory(make_fleet)
    state = _state(fleet)
    assert [row[0] for row in state.scale_up_times] == [d.decision_id]
    # a decision that only scaled down is not remembered as a scale-up: no start to time from
    down = {"prefill": 1, "decode": 1}
    ack_startup_sample(state, Ack(deployment="d", time=d.time + 200.0, decision_id=d.decision_id + 7,
                                  status="applied", observed=down), down)
    assert state.startup_samples == []
    # an ack stamped before its decision (clocks apart) is no startup either
    ack_startup_sample(state, _applied(d, d.time - 1.0, dict(d.targets)), dict(d.targets))
    assert state.startup_samples == []


def test_a_decision_made_again_after_the_ack_timeout_times_no_second_startup(make_fleet):
    """Engines slower than ``ack_timeout_seconds``: the planner gives up on decision A and makes
    it again as B (the same targets, from the baseline A never moved). A's late ack times the
    startup; B, which the connector acks once A's engines serve, started none, and its ack timed
    the rest of A's startup after B (here 40 s of 400) as a startup of its own."""
    fleet = make_fleet(throughput_sizing="startup_quantile", startup_seconds=30, ack_timeout_seconds=300)
    evs = [fpm("p0", "prefill", T0 + 0.5), fpm("d0", "decode", T0 + 0.5), *requests(40, T0 + 1, T0 + 560)]
    evs += [fpm(w, role, T0 + 5 * k + 0.5) for k in range(1, 112) for w, role in (("p0", "prefill"), ("d0", "decode"))]
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    first, again = decisions(out)
    assert again.targets == first.targets and again.previous == first.previous  # made again
    fleet.run([_applied(first, first.time + 400.0, dict(first.targets)),
               _applied(again, first.time + 401.0, dict(again.targets)), _clock(T0 + 5 * INTERVAL)])
    state = _state(fleet)
    assert state.late_events == 0 and state.desired == dict(again.targets)
    assert state.startup_samples == [400.0]


def test_the_inventory_flag_round_trips_and_an_older_state_restores_without_it(make_fleet):
    fleet, _ = _scale_up_without_inventory(make_fleet)
    state = _state(fleet)
    state.inventory_seen = True
    data = orjson.loads(orjson.dumps(state.to_data()))
    assert DeploymentState.from_data(data).inventory_seen is True
    del data["inventory_seen"]
    assert DeploymentState.from_data(data).inventory_seen is False


# --- quantile sizing --------------------------------------------------------------


def _bursty(start_window: int, windows: int, low: float, high: float):
    """Alternate low and high windows: a point forecast lags every burst."""
    evs = []
    for w in range(windows):
        rate = high if w % 2 else low
        t0 = T0 + INTERVAL * (start_window + w)
        evs += requests(rate, t0 + 1, t0 + INTERVAL, tag=f"w{w}_")
    return evs


def _targets_over_time(fleet, events):
    """Run, acking every decision at once, and return the prefill targets decided."""
    out = fleet.run(events)
    prefill = []
    while True:
        ds = decisions(out)
        if not ds:
            return prefill
        prefill += [d.targets["prefill"] for d in ds]
        out = fleet.run([ack(ds[-1].decision_id, ds[-1].time + 0.5)])


def test_quantile_sizing_reports_both_rates_and_sizes_above_the_point(make_fleet):
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *_bursty(0, 24, 10, 40)]
    point = make_fleet(load_predictor="arima", max_throughput_scaling_replicas=20)
    upper = make_fleet(load_predictor="arima", max_throughput_scaling_replicas=20,
                       throughput_sizing="startup_quantile")
    out_point, out_upper = point.run(list(evs)), upper.run(list(evs))
    ticks_p = [o for o in out_point if o.predicted is not None]
    ticks_u = [o for o in out_upper if o.predicted is not None]
    assert len(ticks_p) == len(ticks_u) > 10
    for tp, tu in zip(ticks_p, ticks_u, strict=True):
        # the point forecast is the same; the sized rate is an upper quantile above it
        assert tu.predicted.rps == tp.predicted.rps
        assert tp.predicted.sized_rps is None and tp.predicted.horizon_windows is None
        assert tu.predicted.horizon_windows == 2
        assert tu.predicted.sized_rps >= tu.predicted.rps
    # after the calibration has seen a few bursts, it sizes for the burst (40 rps)
    late = ticks_u[-6:]
    assert all(t.predicted.sized_rps >= 39 for t in late)


def test_quantile_sizing_never_asks_for_less_than_the_point_forecast(make_fleet):
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *_bursty(0, 16, 5, 30)]
    kw = {"max_throughput_scaling_replicas": 20, "load_predictor": "kalman"}
    point = _targets_over_time(make_fleet(**kw), list(evs))
    upper = _targets_over_time(make_fleet(throughput_sizing="startup_quantile", **kw), list(evs))
    assert max(upper) >= max(point)
    assert sum(upper) / len(upper) > sum(point) / len(point)


def _steady_ticks(fleet, rate: float, windows: int):
    """Run ``rate`` steady for ``windows`` windows, acking each decision as it comes."""
    ticks, pending = [], [ready("p0", "prefill"), ready("d0", "decode")]
    for w in range(windows + 1):
        t0 = T0 + INTERVAL * w
        out = fleet.run([*pending, *requests(rate, t0 + 1, t0 + INTERVAL + 1, tag=f"w{w}_")])
        ticks += [o for o in out if getattr(o, "predicted", None) is not None]
        pending = [ack(d.decision_id, d.time + 0.5) for d in decisions(out)]
    return ticks


def _share_of_m_errors(m: int) -> float:
    """``uncalibrated_headroom: coverage`` at 0.8 -> 0.9 for the P90 after m origins (m < 9)."""
    coverage = m / (m + 1)
    return 0.8 + 0.1 * max(0.0, (coverage - 0.5) / (0.9 - 0.5))


# the P90 over a 2-window horizon, tick by tick (180 .. 3060 s): no origin spans the horizon at the
# first two ticks, then one more each tick, conformal from the 9th origin on (the 11th tick)
SHARES = {
    "full": [0.8] * 10 + [0.9] * 7,
    "coverage": [0.8, *[_share_of_m_errors(m) for m in range(0, 9)], *[0.9] * 7],
}


@pytest.mark.parametrize("headroom", ["full", "coverage"])
def test_headroom_moves_to_calibrated_utilization_as_the_quantile_calibrates(make_fleet, headroom):
    # 26 rps of 3000/150 over 15.44 rps per prefill engine: 3 engines at 0.8, 2 at 0.9
    kw = {"throughput_sizing": "startup_quantile", "target_utilization": 0.8,
          "max_throughput_scaling_replicas": 20}
    fleet = make_fleet(calibrated_utilization=0.9, uncalibrated_headroom=headroom, **kw)
    ticks = _steady_ticks(fleet, 26, 16)
    shares = [t.estimates["prefill"].utilization for t in ticks]
    assert len(ticks) == 17  # ticks at 180 .. 3060 s
    assert shares == pytest.approx(SHARES[headroom], abs=1e-12), shares
    # the decision says which it was: the quantile conformal from the same tick on
    assert [t.predicted.quantile_calibrated for t in ticks] == [False] * 10 + [True] * (len(ticks) - 10)
    assert [t.estimates["prefill"].rate_replicas for t in ticks[9:11]] == [3 if headroom == "full" else 2, 2]
    assert _state(fleet).forecaster.calibrated(0.9, 2)
    for t in ticks:  # the count is the sized rate at the share the tick reports
        cap = t.estimates["prefill"].engine_capacity_rps
        share = t.estimates["prefill"].utilization
        assert t.estimates["prefill"].rate_replicas == math.ceil(t.predicted.sized_rps / (cap * share))
    # None keeps the configured headroom throughout, as before the field existed
    held = _steady_ticks(make_fleet(calibrated_utilization=None, uncalibrated_headroom=headroom, **kw), 26, 16)
    assert {t.estimates["prefill"].utilization for t in held} == {0.8}
    assert {t.estimates["prefill"].rate_replicas for t in held[2:]} == {3}


def test_the_docs_table_of_the_share_by_errors_seen_is_the_planners():
    """docs/sizing.md tabulates the share after m errors in the pool; it said 0.886 at m = 6,
    where the planner (and the formula above the table) gives 0.889."""
    from pathlib import Path

    from fleetplan.models.config import config_from_dict
    from fleetplan.models.planner import _sizing_utilization

    text = (Path(__file__).parents[2] / "docs" / "sizing.md").read_text()
    header, _, shares = text[text.index("| errors in the pool (m) |"):].splitlines()[:3]
    cells = [[c.strip() for c in row.strip("|").split("|")[1:]] for row in (header, shares)]
    cfg = config_from_dict({})
    for m_text, share in zip(*cells, strict=True):
        m = int(m_text.split()[0].split("–")[-1])  # "0–1": 1, "9 and on": 9
        coverage = 0.9 if m >= 9 else m / (m + 1)
        assert f"{_sizing_utilization(cfg, coverage):.3f}".rstrip("0").rstrip(".") == share, m_text


def test_headroom_by_coverage_never_asks_for_more_engines_than_the_full_headroom(make_fleet):
    """The same traffic and forecasts: the share only rises, so the counts only fall, and they do
    before the quantile is conformal: 2 prefill engines from the 3rd origin (a share of 0.86), where
    the full headroom keeps 3 until the 9th."""
    kw = {"throughput_sizing": "startup_quantile", "target_utilization": 0.8, "calibrated_utilization": 0.9,
          "max_throughput_scaling_replicas": 20}
    full, coverage = (_steady_ticks(make_fleet(uncalibrated_headroom=h, **kw), 26, 16) for h in ("full", "coverage"))
    assert [t.predicted.sized_rps for t in full] == [t.predicted.sized_rps for t in coverage]
    counts = [[t.estimates["prefill"].rate_replicas for t in run] for run in (full, coverage)]
    assert all(c <= f for f, c in zip(*counts, strict=True))
    assert counts == [[3] * 10 + [2] * 7, [3] * 4 + [2] * 13]


@pytest.mark.parametrize(("config", "coverage", "share"), [
    ({}, 0.0, 0.8),                    # no error seen: the point forecast's headroom
    ({}, 1 / 2, 0.8),                  # one error covers what the point forecast covers
    ({}, 3 / 4, 0.8 + 0.1 * 0.625),    # three: 5/8 of the way to the P90's
    ({}, 0.9, 0.9),                    # conformal
    ({"uncalibrated_headroom": "full"}, 8 / 9, 0.8),
    ({"calibrated_utilization": None}, 0.9, 0.8),
    # a calibrated share below target_utilization is not approached before it applies
    ({"target_utilization": 0.95}, 8 / 9, 0.95),
    ({"target_utilization": 0.95}, 0.9, 0.9),
    # a median sizing quantile: conformal after one error, target_utilization before
    ({"sizing_quantile": 0.5}, 0.0, 0.8),
    ({"sizing_quantile": 0.5}, 0.5, 0.9),
])
def test_the_uncalibrated_share_follows_the_quantiles_coverage(config, coverage, share):
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.planner import _sizing_utilization

    assert _sizing_utilization(config_from_dict(config), coverage) == pytest.approx(share, abs=1e-12)


def test_the_worker_exports_the_sized_quantile_and_whether_it_was_conformal(make_fleet):
    """Prometheus sees the P90 beside the point, its horizon, the headroom and the startup it plans with."""
    from fleetplan.streams.metrics import WorkerMetrics

    fleet = make_fleet(throughput_sizing="startup_quantile", target_utilization=0.8, calibrated_utilization=0.9,
                       max_throughput_scaling_replicas=20)
    ticks = _steady_ticks(fleet, 26, 12)
    metrics = WorkerMetrics()

    def value(name, **labels):
        return metrics.registry.get_sample_value(name, {"deployment": "d", **labels})

    for tick, calibrated in ((ticks[0], 0.0), (ticks[-1], 1.0)):
        metrics.observe_tick(tick, _state(fleet))
        assert value("fleetplan_sizing_quantile_calibrated") == calibrated
        assert value("fleetplan_predicted_load", quantity="sized_rps") == tick.predicted.sized_rps
        assert value("fleetplan_predicted_load", quantity="rps") == tick.predicted.rps
        assert value("fleetplan_sizing_horizon_windows") == tick.predicted.horizon_windows == 2
        assert value("fleetplan_sizing_utilization", role="prefill") == tick.estimates["prefill"].utilization
    assert value("fleetplan_sizing_utilization", role="prefill") == 0.9
    # the live calibration: the last tick's count of its conformal quantiles that were exceeded
    exceeded, scored = ticks[-1].predicted.quantile_exceeded
    assert scored > 0 and (exceeded, scored) == _state(fleet).forecaster.exceedances(0.9, 2)
    assert (value("fleetplan_sizing_quantile_exceeded", count="exceeded"),
            value("fleetplan_sizing_quantile_exceeded", count="scored")) == (exceeded, scored)
    assert ticks[0].predicted.quantile_exceeded == (0, 0)  # nothing conformal has closed yet
    # no worker was started by a decision here, so the configured startup is what it plans with
    assert value("fleetplan_startup_seconds") == _state(fleet).config.startup_seconds


def test_a_deployment_moved_to_point_sizing_exports_no_quantile(make_fleet):
    """After a set_config to point sizing the ticks size for the point: the P90, its horizon and
    its calibration of the last quantile tick stayed exported, as if the fleet were still sized so."""
    from fleetplan.streams.metrics import WorkerMetrics

    fleet = make_fleet(throughput_sizing="startup_quantile", max_throughput_scaling_replicas=20)
    metrics = WorkerMetrics()
    for tick in _steady_ticks(fleet, 26, 3):
        metrics.observe_tick(tick, _state(fleet))
    assert metrics.registry.get_sample_value("fleetplan_predicted_load", {"deployment": "d", "quantity": "sized_rps"})
    state = _state(fleet)
    state.config = state.config.with_changes({"throughput_sizing": "point"})
    t0 = T0 + INTERVAL * 4
    ticks = [o for o in fleet.run(requests(26, t0 + 1, t0 + INTERVAL + 1, tag="p_"))
             if getattr(o, "predicted", None) is not None]
    assert ticks and ticks[-1].predicted.sized_rps is None
    metrics.observe_tick(ticks[-1], state)
    exported = {s.name for m in metrics.registry.collect() for s in m.samples
                if s.labels.get("quantity") in ("sized_rps", "window_sized_rps") or s.name in (
                    "fleetplan_sizing_horizon_windows", "fleetplan_sizing_quantile_calibrated",
                    "fleetplan_sizing_quantile_exceeded")}
    assert exported == set()
    assert metrics.registry.get_sample_value(
        "fleetplan_predicted_load", {"deployment": "d", "quantity": "rps"}) == ticks[-1].predicted.rps


def test_a_load_only_deployment_exports_the_startup_it_waits_for(make_fleet):
    """Its scale-downs wait one startup, so Prometheus sees it there too (only throughput
    ticks set it until 2026-12-05): here one timed by the ack of a scale-up."""
    from fleetplan.streams.metrics import WorkerMetrics

    fleet, d = _scale_up_without_inventory(make_fleet)
    fleet.run([_applied(d, d.time + 400.0, dict(d.targets)), _clock(T0 + 5 * INTERVAL)])
    state = _state(fleet)
    state.config = state.config.with_changes({"enable_throughput_scaling": False, "enable_load_scaling": True})
    ticks = [r for r in fleet.run([_clock(T0 + 6 * INTERVAL + 10)]) if hasattr(r, "predicted")]
    tick = ticks[-1]
    assert tick.predicted is None and tick.throughput_reason == "disabled"  # a load tick, no forecast
    metrics = WorkerMetrics()
    metrics.observe_tick(tick, state)
    assert metrics.registry.get_sample_value("fleetplan_startup_seconds", {"deployment": "d"}) == 400.0


def test_point_sizing_keeps_target_utilization(make_fleet):
    """Without a quantile nothing is calibrated: the reference's sizing is untouched."""
    ticks = _steady_ticks(make_fleet(target_utilization=0.8, calibrated_utilization=0.9), 26, 12)
    assert {t.estimates[r].utilization for t in ticks for r in ("prefill", "decode")} == {0.8}
    assert {t.predicted.quantile_calibrated for t in ticks} == {None}  # no quantile to calibrate


@given(st.integers(1, 100_000), st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]))
def test_concurrency_share_puts_the_quantile_of_sequences_at_the_batch(batch, q):
    from statistics import NormalDist

    from fleetplan.models.throughput import concurrency_share

    share = concurrency_share(batch, q)
    m, z = share * batch, NormalDist().inv_cdf(q)
    assert 0.0 < share <= 1.0
    assert m + z * math.sqrt(m) == pytest.approx(batch, rel=1e-9) or share == 1.0
    assert concurrency_share(batch + 1, q) >= share - 1e-12  # a larger batch spreads relatively less


def test_decode_takes_the_calibrated_share_only_where_its_batch_leaves_room():
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.throughput import concurrency_share, rate_share

    cfg = config_from_dict({})  # target 0.8, calibrated 0.9, P90
    assert rate_share(cfg, "prefill", 0.9, 4) == 0.9  # the queueing floor models prefill's waits
    assert rate_share(cfg, "decode", 0.8, 4) == 0.8  # not calibrated: as configured
    assert rate_share(cfg, "decode", 0.9, 4) == 0.8  # 4 sequences: the P90 needs far more room
    assert concurrency_share(4, 0.9) < 0.6
    assert rate_share(cfg, "decode", 0.9, 100) == pytest.approx(concurrency_share(100, 0.9))
    assert 0.87 < rate_share(cfg, "decode", 0.9, 100) < 0.9
    assert rate_share(cfg, "decode", 0.9, 256) == 0.9


@pytest.mark.parametrize("value", [0, -0.1, 1.5, float("nan")])
def test_calibrated_utilization_is_checked_at_start(value):
    from fleetplan.models.config import config_from_dict

    with pytest.raises(ValueError, match="calibrated_utilization"):
        config_from_dict({"calibrated_utilization": value})


def test_sizing_state_round_trips_exactly(make_fleet):
    from fleetplan.models.planner import Planner

    fleet = make_fleet(throughput_sizing="startup_quantile", capacity_mix="buckets",
                       load_predictor="ensemble")
    fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *_bursty(0, 6, 5, 20),
               _inventory("p5", "starting", T0 + 3), _inventory("p5", "ready", T0 + 70),
               _clock(T0 + 6 * INTERVAL + 0.5)])
    state = _state(fleet)
    data = state.to_data()
    again = DeploymentState.from_data(orjson.loads(orjson.dumps(data)))
    assert again.to_data() == data
    planner: Planner = fleet.planner
    later = requests(20, T0 + 6 * INTERVAL + 1, T0 + 7 * INTERVAL + 1, tag="late")
    for ev in later:
        planner.apply(state, ev)
        planner.apply(again, ev)
    now = T0 + 7 * INTERVAL
    assert planner.tick(state, now).to_dict() == planner.tick(again, now).to_dict()


# --- the ISL/OSL mix ---------------------------------------------------------------


def test_buckets_are_log_spaced_and_bounded():
    assert [bucket_of(x, 256) for x in (0, 255, 256, 1023, 1024, 4096, 10**9)] == [0, 0, 1, 1, 2, 3, 6]


def test_mix_keeps_exact_sums_and_shares():
    mix = LengthMix()
    for isl, osl in [(100, 10), (120, 30), (20_000, 500)]:
        mix.add(isl, osl)
    assert mix.count == 3
    assert mix.means() == (20_220 / 3, 540 / 3)
    shares = [g[0] for g in mix.groups()]
    assert sum(shares) == pytest.approx(1.0)
    assert LengthMix.from_data(orjson.loads(orjson.dumps(mix.to_data()))).groups() == mix.groups()


def test_a_uniform_mix_has_factor_one_and_harmonic_mean_otherwise():
    def linear(isl, osl):  # capacity inversely proportional to size: time sharing is exact
        return 1000.0 / isl

    uniform = LengthMix()
    for _ in range(5):
        uniform.add(1000, 100)
    assert mix_factor(uniform, linear) == pytest.approx(1.0)
    both = LengthMix()
    both.add(100, 100)
    both.add(10_000, 100)
    # seconds per request: (0.1 + 10) / 2 / 1000... i.e. the same as the mean request
    assert mix_capacity(both, linear) == pytest.approx(1000.0 / 5050)
    assert mix_factor(both, linear) == pytest.approx(1.0)


def _capacity_at(fleet, role):
    model = _state(fleet).perf[role]

    def capacity_at(isl, osl):
        return model.capacity_rps(isl=round(isl), osl=round(osl), ttft_ms=500.0, itl_ms=50.0).rps

    return capacity_at


def test_long_requests_cost_decode_far_more_than_the_mean_request(make_fleet):
    """KV residency is ISL x OSL: the mean request hides the long ones."""
    fleet = make_fleet()
    fleet.run([ready("p0", "prefill"), ready("d0", "decode")])
    mix = LengthMix()
    for _ in range(9):
        mix.add(500, 100)
    mix.add(30_000, 1000)
    assert mix_factor(mix, _capacity_at(fleet, "decode")) < 0.3
    # prefill time is close to linear in tokens: the mean is nearly right there
    assert mix_factor(mix, _capacity_at(fleet, "prefill")) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize(("profile", "decode", "prefill"), [
    ("h200-llama3.1-8b", 0.24, 0.994), ("h100-llama3.3-70b", 0.22, 0.948)])
def test_the_docs_mix_factors_on_the_bundled_profiles(profile, decode, prefill):
    """docs/sizing.md's figures for 90 % of 500/100 and 10 % of 30k/1000 requests, default perf model."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.fleet import Fleet
    from fleetplan.models.planner import Planner
    from fleetplan.sim.profiles import load_profile

    fleet = Fleet(Planner(config_from_dict({"max_gpu_budget": 64}), profile=load_profile(profile)))
    fleet.run([ready("p0", "prefill"), ready("d0", "decode")])
    mix = LengthMix()
    for _ in range(9):
        mix.add(500, 100)
    mix.add(30_000, 1000)
    assert mix_factor(mix, _capacity_at(fleet, "decode")) == pytest.approx(decode, abs=0.005)
    assert mix_factor(mix, _capacity_at(fleet, "prefill")) == pytest.approx(prefill, abs=0.001)


def test_planner_applies_the_mix_factor(make_fleet):
    # 90% short, 10% long: the mean request (ISL 3450, OSL 190) hides the long ones
    short = requests(18, T0 + 1, T0 + 181, isl=500, osl=100, tag="s")
    long = requests(2, T0 + 1, T0 + 181, isl=30_000, osl=1000, tag="l")
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *short, *long]
    kw = {"max_throughput_scaling_replicas": 20}
    mean = make_fleet(**kw).run(list(evs))
    mixed = make_fleet(capacity_mix="buckets", **kw).run(list(evs))
    at = T0 + 180
    cap_mean = [o for o in mean if o.time == at][0].estimates["decode"].engine_capacity_rps
    cap_mix = [o for o in mixed if o.time == at][0].estimates["decode"].engine_capacity_rps
    assert cap_mix < 0.3 * cap_mean
    # A 30.5k-token stream: 30 fit in the 945k-token cache, at ~34 ms ITL, for ~34 s each:
    # 2 long rps keep ~67 streams alive, 2.25 engines of them. The mean request fits in one.
    assert decisions(mean)[0].targets == {"prefill": 2, "decode": 1}
    assert decisions(mixed)[0].targets == {"prefill": 2, "decode": 3}


# --- the busiest minute -------------------------------------------------------------


def test_peak_count_scales_the_busiest_sub_window_to_a_window():
    from fleetplan.models.state import TrafficWindow

    w = TrafficWindow(burst_arrivals={"10": 30, "11": 90, "12": 60})
    assert w.peak_count(180, 60, by_arrival=True) == 270.0
    assert w.peak_count(180, 60, by_arrival=False) is None  # nothing finished
    assert w.peak_count(180, 0, by_arrival=True) is None  # bursts off


def _minute_bursts(windows: int):
    """Each 3-minute window: 10 rps for two minutes and 40 rps for one."""
    evs = []
    for w in range(windows):
        for m, rate in enumerate((10, 40, 10)):
            t0 = T0 + INTERVAL * w + 60 * m
            evs += requests(rate, t0 + 0.5, t0 + 60, tag=f"w{w}m{m}_")
    return evs


def test_quantile_sizes_for_the_busiest_minute_not_the_window_mean(make_fleet):
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *_minute_bursts(16)]
    kw = {"throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20}
    by_minute = [o for o in make_fleet(**kw).run(list(evs)) if o.predicted is not None]
    by_window = [o for o in make_fleet(burst_window_seconds=0, **kw).run(list(evs)) if o.predicted is not None]
    # the window mean is 20 rps; its busiest minute runs at 40
    assert all(abs(t.predicted.rps - 20) < 1 for t in by_minute[2:])
    assert all(t.predicted.sized_rps >= 39 for t in by_minute[-5:])
    assert all(t.predicted.sized_rps < 25 for t in by_window[-5:])


def _minute_burst_run(make_fleet, **config):
    """fleetplan's sizing on ``_minute_bursts``: the tick reports, and the fleet."""
    fleet = make_fleet(sizing="fleetplan", max_throughput_scaling_replicas=20, **config)
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *_minute_bursts(16)]
    return [o for o in fleet.run(evs) if o.predicted is not None], fleet


def test_the_queueing_floor_takes_the_busiest_minute_and_the_rate_count_the_window(make_fleet):
    """``burst_sizing: queueing``: prefill's rate count sizes the window's P90 (20 rps), its
    queueing floor the busiest minute's (40 rps); ``both`` sizes the rate count for the minute too.
    The forecasts, the floor and decode are the same either way, and the count only falls."""
    (split, fleet), (both, _) = (_minute_burst_run(make_fleet, burst_sizing=b) for b in ("queueing", "both"))
    assert len(split) == len(both) == 15  # ticks at 180 .. 2700 s
    for s, b in zip(split, both, strict=True):
        assert s.predicted.sized_rps == b.predicted.sized_rps and b.predicted.window_sized_rps is None
        assert s.predicted.window_sized_rps <= s.predicted.sized_rps
        pre_s, pre_b = s.estimates["prefill"], b.estimates["prefill"]
        assert pre_s.queueing_replicas == pre_b.queueing_replicas
        assert s.estimates["decode"] == b.estimates["decode"]
        per_engine = pre_s.engine_capacity_rps * pre_s.utilization
        assert pre_s.rate_replicas == max(1, math.ceil(s.predicted.window_sized_rps / per_engine))
        assert pre_b.rate_replicas == max(1, math.ceil(b.predicted.sized_rps / per_engine))
    assert all(t.predicted.window_sized_rps < 20.5 and t.predicted.sized_rps >= 39 for t in split)
    # 20 rps needs 2 engines of 15.4 at 80-90 %; the busiest minute's 40 needs 4, then 3 at 84 %;
    # the floor asks for 4 on the minute either way, so here both run 4
    assert [t.estimates["prefill"].rate_replicas for t in split] == [2] * 15
    assert [t.estimates["prefill"].rate_replicas for t in both] == [4] * 3 + [3] * 12
    assert {t.estimates["prefill"].queueing_replicas for t in split + both} == {4}
    # Prometheus sees the window's quantile beside the burst's
    from fleetplan.streams.metrics import WorkerMetrics

    metrics = WorkerMetrics()
    metrics.observe_tick(split[-1], _state(fleet))
    for name in ("sized_rps", "window_sized_rps"):
        sample = metrics.registry.get_sample_value("fleetplan_predicted_load", {"deployment": "d", "quantity": name})
        assert sample == getattr(split[-1].predicted, name)


@pytest.mark.parametrize("config", [
    {"prefill_sizing": "rate"},       # no floor to take the burst: the rate count keeps it
    {"burst_window_seconds": 0},      # no burst: the one quantile is the window's
    {"burst_window_seconds": 180},    # a burst window as long as the window is the window
    {"throughput_sizing": "point"},   # no quantile at all
    {"ttft_ms": 40.0},                # a floor with no answer: every prompt's own pass takes longer than the TTFT
])
def test_without_a_floor_and_a_burst_quantile_the_rate_count_keeps_the_sized_rate(make_fleet, config):
    ticks = _minute_burst_run(make_fleet, **config)[0]
    assert len(ticks) == 15  # ticks at 180 .. 2700 s
    for t in ticks:
        assert t.predicted.window_sized_rps is None
        prefill = t.estimates["prefill"]
        sized = t.predicted.sized_rps or t.predicted.rps
        per_engine = prefill.engine_capacity_rps * prefill.utilization
        assert prefill.rate_replicas == max(1, math.ceil(sized / per_engine))
    if config in ({"prefill_sizing": "rate"}, {"ttft_ms": 40.0}):  # the busiest minute's P90, as a floor would take
        assert all(t.predicted.sized_rps >= 39 for t in ticks)
    if config == {"ttft_ms": 40.0}:
        # no floor took the minute's 40 rps, so the rate count does: 4 engines of 16.3 rps, then 3
        # at 84 %, as with burst_sizing: both; sized for the window's 20 rps it asked for 2, which
        # the busiest minute runs past their rate
        assert all(t.estimates["prefill"].queueing_replicas is None for t in ticks)
        assert [t.estimates["prefill"].rate_replicas for t in ticks] == [4] * 3 + [3] * 12


def _answer_run(make_fleet, rates, answers, **config):
    """fleetplan's sizing over ten windows of three minutes at ``rates`` rps, split among
    ``answers``, ``(share, osl)`` each."""
    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    for w in range(10):
        for m, rate in enumerate(rates):
            t0 = T0 + INTERVAL * w + 60 * m
            for share, osl in answers:
                evs += requests(rate * share, t0 + 0.5, t0 + 60, osl=osl, tag=f"w{w}m{m}o{osl}_")
    fleet = make_fleet(sizing="fleetplan", max_throughput_scaling_replicas=20, **config)
    return [o for o in fleet.run(evs) if o.predicted is not None]


def _long_answer_run(make_fleet, **config):
    """``_minute_bursts``' 10, 40 and 10 rps with 1,500-token answers (4.3 rps a decode engine)."""
    return _answer_run(make_fleet, (10, 40, 10), ((1.0, 1500),), **config)


def test_decode_demand_window_sizes_decode_for_the_windows_quantile_and_nothing_else(make_fleet):
    """``decode_demand: window``: decode's rate and slot counts size for the window's own P90
    (20 rps), as a planner with no burst window sizes them, where ``burst`` sizes them for the
    busiest minute's (40 rps): 5 engines instead of 10. Prefill and what is reported are the same.
    What it gives up is that minute: 40 rps on 5 engines of 4.3 is twice their rate for 60 s,
    which the slot count's model of waiting sizes for (docs/sizing.md)."""
    burst, window, no_burst = (_long_answer_run(make_fleet, **c) for c in (
        {"decode_demand": "burst"}, {"decode_demand": "window"}, {"burst_window_seconds": 0}))
    assert len(burst) == len(window) == len(no_burst) == 9  # ticks at 180 .. 1620 s
    for b, w, n in zip(burst, window, no_burst, strict=True):
        assert w.predicted == b.predicted and w.estimates["prefill"] == b.estimates["prefill"]
        assert w.estimates["decode"] == n.estimates["decode"]
        assert w.predicted.window_sized_rps == n.predicted.sized_rps < 20.5 and b.predicted.sized_rps >= 39
    assert [d.targets["decode"] for d in decisions(burst)] == [10]
    assert [d.targets["decode"] for d in decisions(window)] == [5]
    assert {t.estimates["decode"].queueing_replicas for t in burst} == {10}
    assert {t.estimates["decode"].queueing_replicas for t in window} == {5}


def test_decode_demand_window_on_the_token_basis_sizes_decode_for_its_answers_window_and_reports_the_burst(
        make_fleet):
    """With ``quantile_basis: tokens`` decode sizes for the window's P90 of its answer tokens, and
    the decision still reports the burst: answers twice as long every other window make decode's
    burst the largest series, and ``sized_rps`` (which the forecast check scores against the
    busiest burst) and ``quantile_exceeded`` (that series' record) stay the burst's, as with
    ``burst``. Sized down to the window's, ``sized_rps`` fell to half the burst's P90 it is
    scored as, and ``quantile_exceeded`` was no longer its series' record."""
    kw = {"throughput_sizing": "startup_quantile", "quantile_basis": "tokens"}
    runs = {}
    for demand in ("burst", "window"):
        fleet = make_fleet(sizing="fleetplan", max_throughput_scaling_replicas=20, decode_demand=demand, **kw)
        ticks, pending = [], [ready("p0", "prefill"), ready("d0", "decode")]
        for w in range(12):
            for m, rate in enumerate((10, 40, 10)):
                t0 = T0 + INTERVAL * w + 60 * m
                out = fleet.run([*pending, *requests(rate, t0 + 0.5, t0 + 60, osl=1500 if w % 2 else 750,
                                                     tag=f"w{w}m{m}_")])
                ticks += [o for o in out if getattr(o, "predicted", None) is not None]
                pending = [ack(d.decision_id, d.time + 0.5) for d in decisions(out)]
        runs[demand] = (ticks, _state(fleet).forecaster)
    (burst, _), (window, forecaster) = runs["burst"], runs["window"]
    assert len(burst) == len(window) == 11
    for b, w in zip(burst, window, strict=True):
        assert w.predicted == b.predicted and w.estimates["prefill"] == b.estimates["prefill"]
    last = window[-1]
    assert last.predicted.sized_rps * INTERVAL == pytest.approx(
        forecaster.quantile(0.9, last.predicted.horizon_windows, of="peak:answer"))
    decode = last.estimates["decode"]
    sized = forecaster.quantile(0.9, last.predicted.horizon_windows, of="window:answer") / INTERVAL
    assert decode.rate_replicas == max(1, math.ceil(sized / (decode.engine_capacity_rps * decode.utilization)))
    assert decode.rate_replicas < burst[-1].estimates["decode"].rate_replicas


def _mixed_answer_run(make_fleet, rates, **config):
    """One answer in six is 3 tokens, with almost no ITL to spare for a slot wait, the rest 1,500
    (decode at its batch limit, 5.17 rps an engine)."""
    return _answer_run(make_fleet, rates, ((5 / 6, 1500), (1 / 6, 3)), **config)


@pytest.mark.parametrize(("rates", "engines"), [
    ((18, 20, 18), {"burst": 5, "weighted": 4, "window": 4}),  # a minute 11 % over the rest
    ((18, 21, 18), {"burst": 5, "weighted": 5, "window": 4}),  # past four engines' 20.7 rps
])
def test_decode_demand_weighted_holds_the_windows_requests_to_the_share_not_its_busiest_minutes(
        make_fleet, rates, engines):
    """``decode_demand: weighted``: the slot-wait count holds the share of the window's requests
    that wait past their budgets to 1 %, the busiest minute (a third of them) at the burst's P90 and
    the rest at what the window's P90 leaves them. A minute 11 % over the others asks ``burst`` for
    a fifth engine its own requests need and the window's do not; a minute past four engines' rate
    keeps it, since every request in it would wait. Prefill, decode's rate count and what is
    reported are ``burst``'s."""
    runs = {demand: _mixed_answer_run(make_fleet, rates, decode_demand=demand) for demand in engines}
    for demand, ticks in runs.items():
        assert [d.targets["decode"] for d in decisions(ticks)] == [engines[demand]]
        assert ticks[-1].estimates["decode"].queueing_replicas == engines[demand]
    for b, w in zip(runs["burst"], runs["weighted"], strict=True):
        assert w.predicted == b.predicted and w.estimates["prefill"] == b.estimates["prefill"]
        assert w.estimates["decode"].rate_replicas == b.estimates["decode"].rate_replicas


def test_decode_demand_weighted_leaves_decode_to_its_burst_where_the_itl_sets_the_batch(make_fleet):
    """At 20 ms the ITL target sets decode's batch: a request over it slows every stream at once, no
    slot wait absorbs a burst, and the rate count sizes for the burst as with ``burst`` (``window``
    sizes it for the window)."""
    runs = {d: _mixed_answer_run(make_fleet, (18, 20, 18), decode_demand=d, itl=20.0)
            for d in ("burst", "weighted", "window")}
    assert all(t.estimates["decode"].queueing_replicas is None for t in runs["burst"])
    assert runs["weighted"] == runs["burst"]
    assert runs["window"][-1].estimates["decode"].rate_replicas < runs["burst"][-1].estimates["decode"].rate_replicas


def test_decode_demand_weighted_sizes_a_spike_that_holds_most_of_the_window_for_itself(make_fleet):
    """Minutes of 10, 40 and 10 rps: the busiest holds two thirds of the window's requests, so the
    window's share of misses is the burst's, and decode gets ``burst``'s 10 engines, not 5."""
    burst, weighted = (_long_answer_run(make_fleet, decode_demand=d) for d in ("burst", "weighted"))
    assert [t.estimates["decode"] for t in weighted] == [t.estimates["decode"] for t in burst]
    assert [d.targets["decode"] for d in decisions(weighted)] == [10]


@pytest.mark.parametrize("config", [{"throughput_sizing": "point"}, {"burst_window_seconds": 0}])
def test_decode_demand_changes_nothing_where_there_is_no_burst_quantile(make_fleet, config):
    """Sized for the point forecast, or with no burst window, the one count is the window's."""
    plain = _long_answer_run(make_fleet, decode_demand="burst", **config)
    assert _long_answer_run(make_fleet, decode_demand="window", **config) == plain
    assert _long_answer_run(make_fleet, decode_demand="weighted", **config) == plain


def test_state_written_before_the_newer_fields_still_restores(make_fleet):
    """A worker upgraded in place reads the changelog its predecessor wrote: fields added
    since (arrival burstiness, first traffic time) take their starting values."""
    fleet = make_fleet(sizing="fleetplan")
    fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *_bursty(0, 2, 5, 20), _clock(T0 + 2 * INTERVAL + 0.5)])
    data = orjson.loads(orjson.dumps(_state(fleet).to_data()))
    for key in ("arrival_dispersion", "dispersion_curve", "first_traffic"):
        del data[key]
    del data["window"]["second_arrivals"]
    old = DeploymentState.from_data(data)
    assert (old.arrival_dispersion, old.dispersion_curve, old.first_traffic, old.window.second_arrivals) == (
        1.0, [], None, {})


def test_each_loops_reason_gauge_holds_what_its_last_run_said(make_fleet):
    """The throughput loop runs one tick in 36 (180 s against the load loop's 5 s): set at every
    tick, its reason read ``not_due`` on all the others, and the dashboard's timeline of it
    showed the loop's real outcome for one scrape in twelve."""
    from fleetplan.streams.metrics import WorkerMetrics

    fleet = make_fleet(sizing="fleetplan", enable_load_scaling=True)
    reports = [o for o in fleet.run([ready("p0", "prefill"), ready("d0", "decode"),
                                     *requests(20, T0 + 1, T0 + 200)]) if hasattr(o, "throughput_reason")]
    sized = next(r for r in reports if r.throughput_reason != "not_due")
    later = [r for r in reports if r.time > sized.time]
    assert later and all(r.throughput_reason == "not_due" for r in later)
    metrics = WorkerMetrics()
    for report in [sized, *later]:
        metrics.observe_tick(report, _state(fleet))
    state = {labels["fleetplan_throughput_reason"]: value
             for labels, value in ((s.labels, s.value) for m in metrics.registry.collect()
                                   for s in m.samples if s.name == "fleetplan_throughput_reason")}
    assert state[sized.throughput_reason] == 1.0 and state["not_due"] == 0.0


def test_a_deployment_whose_throughput_loop_was_turned_off_exports_none_of_its_series(make_fleet):
    """A set_config of ``enable_throughput_scaling: false`` drops the loop's floor from the state (it
    must not hold the fleet), and its ticks size nothing: the floor, the sized counts and the forecast
    of its last run stayed exported for good, a throughput floor drawn that no longer held the fleet."""
    from fleetplan.streams.metrics import WorkerMetrics

    fleet = make_fleet(enable_load_scaling=True, max_throughput_scaling_replicas=20)
    metrics = WorkerMetrics()
    for tick in _steady_ticks(fleet, 26, 3):
        metrics.observe_tick(tick, _state(fleet))
    throughput_series = ("fleetplan_throughput_lower_bound", "fleetplan_sizing_replicas", "fleetplan_predicted_load",
                         "fleetplan_sizing_utilization")

    def exported() -> set[str]:
        return {s.name for m in metrics.registry.collect() for s in m.samples if s.name in throughput_series}

    assert exported() == set(throughput_series)
    t = T0 + 5 * INTERVAL
    off = ControlEvent(deployment="d", time=t + 1, body=SetConfig(changes={"enable_throughput_scaling": False}))
    ticks = [r for r in fleet.run([off, _clock(t + INTERVAL + 10)]) if hasattr(r, "predicted")]
    state = _state(fleet)
    assert ticks[-1].throughput_reason == "disabled" and ticks[-1].lower_bound == {}
    metrics.observe_tick(ticks[-1], state)
    assert exported() == set()
    assert metrics.registry.get_sample_value("fleetplan_throughput_reason", {
        "deployment": "d", "fleetplan_throughput_reason": "disabled"}) == 1.0


# --- what the quantile is of: requests or each role's tokens ------------------------------


def _prompt_swings(fleet, windows: int):
    """20 rps of steady answers, prompts 2000 and 3000 tokens in turn: the count never moves."""
    ticks, pending = [], [ready("p0", "prefill"), ready("d0", "decode")]
    for w in range(windows + 1):
        t0 = T0 + INTERVAL * w
        isl = 3000 if w % 2 else 2000
        out = fleet.run([*pending, *requests(20, t0 + 1, t0 + INTERVAL + 1, isl=isl, tag=f"w{w}_")])
        ticks += [o for o in out if getattr(o, "predicted", None) is not None]
        pending = [ack(d.decision_id, d.time + 0.5) for d in decisions(out)]
    return ticks


def test_the_token_basis_sizes_prefill_for_the_prompts_and_decode_for_the_answers(make_fleet):
    """A count of requests is not the work: with the count steady and prompts half as long
    again every other window, the requests' P90 is the count and prefill is sized for the mean
    prompt the forecast gives; the prompt tokens' P90 sizes prefill for the long windows too.
    The answers never moved, so decode is sized for the count either way."""
    kw = {"throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20, "sizing": "fleetplan"}
    by_count = _prompt_swings(make_fleet(quantile_basis="requests", **kw), 12)
    by_tokens = _prompt_swings(make_fleet(quantile_basis="tokens", **kw), 12)
    assert len(by_count) == len(by_tokens) == 13
    late = list(zip(by_count[4:], by_tokens[4:], strict=True))
    for c, t in late:
        assert t.predicted.rps == c.predicted.rps and t.predicted.isl == c.predicted.isl
        assert c.predicted.sized_rps == pytest.approx(20.0, rel=0.05)  # the count does not move
        # sized_rps reports the most any role sized for: prefill's, the prompts' P90
        assert t.predicted.sized_rps > 1.15 * c.predicted.sized_rps
        assert t.estimates["prefill"].rate_replicas >= c.estimates["prefill"].rate_replicas
        assert t.estimates["decode"].rate_replicas == c.estimates["decode"].rate_replicas
    assert sum(t.estimates["prefill"].rate_replicas for _, t in late) > sum(
        c.estimates["prefill"].rate_replicas for c, _ in late)


def test_the_floor_token_basis_holds_the_queueing_floor_to_the_prompts_and_the_rate_count_to_the_count(make_fleet):
    """With ``floor_tokens`` prefill's queueing floor, which carries no headroom, sizes for the
    larger of the count's burst P90 and the prompt tokens'; its rate count, whose utilisation is the
    headroom, stays on the count's window P90, and decode on the count. Prompts half as long again
    every other window, the count steady: the floor sizes above the count, the rate count does not."""
    kw = {"throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20, "sizing": "fleetplan"}
    by_count = _prompt_swings(make_fleet(quantile_basis="requests", **kw), 12)
    floor_fleet = make_fleet(quantile_basis="floor_tokens", **kw)
    by_floor = _prompt_swings(floor_fleet, 12)
    assert len(by_count) == len(by_floor) == 13
    late = list(zip(by_count[4:], by_floor[4:], strict=True))
    for c, f in late:
        assert f.predicted.rps == c.predicted.rps and f.predicted.isl == c.predicted.isl
        assert f.predicted.window_sized_rps == c.predicted.window_sized_rps is not None
        assert f.estimates["prefill"].rate_replicas == c.estimates["prefill"].rate_replicas
        assert f.estimates["decode"] == c.estimates["decode"]
        # sized_rps reports what the floor sized for: the prompts' P90, over the count's
        assert f.predicted.sized_rps > 1.15 * c.predicted.sized_rps
        assert f.estimates["prefill"].queueing_replicas >= c.estimates["prefill"].queueing_replicas
    assert sum(f.estimates["prefill"].queueing_replicas for _, f in late) > sum(
        c.estimates["prefill"].queueing_replicas for c, _ in late)
    asked = {of for _, _, of in _state(floor_fleet).forecaster.last_asked}
    assert asked == {"peak", "peak:prompt", "window"}


@pytest.mark.parametrize("change", [{"burst_sizing": "both"}, {"prefill_sizing": "rate"}, {"burst_window_seconds": 0}])
def test_the_floor_token_basis_is_the_request_basis_where_no_floor_takes_the_burst(make_fleet, change):
    """Where prefill's queueing floor does not take the burst apart from the rate count (no floor,
    no burst sub-window, or the rate count sized for the burst as well), the prompts would reach the
    rate count and its headroom twice: ``floor_tokens`` then sizes as ``requests`` does, to the bit."""
    kw = {"throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20, "sizing": "fleetplan",
          **change}
    by_count = _prompt_swings(make_fleet(quantile_basis="requests", **kw), 8)
    by_floor = _prompt_swings(make_fleet(quantile_basis="floor_tokens", **kw), 8)
    assert by_floor == by_count and len(by_count) == 9


def test_the_request_basis_asks_the_counts_series_alone(make_fleet):
    """The request basis (the default until 2026-12-06) asks the count's quantiles alone (the
    burst's and the window's) and sizes every role for them, as before the field."""
    kw = {"throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20, "sizing": "fleetplan"}
    fleet = make_fleet(quantile_basis="requests", **kw)
    ticks = _prompt_swings(fleet, 6)
    assert fleet.planner.config.quantile_basis == "requests"
    asked = {of for _, _, of in _state(fleet).forecaster.last_asked}
    assert asked == {"peak", "window"}
    assert all(t.predicted.sized_rps is not None for t in ticks)


def test_the_token_basis_reports_how_the_series_it_sized_for_fared(make_fleet):
    """sized_rps is the largest role's tokens; quantile_exceeded is that series' record, not
    prefill's: answers twice as long every other window make decode's the series sized for,
    and answers that then climb past anything seen exceed it while the prompts never move."""
    kw = {"throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20, "sizing": "fleetplan",
          "quantile_basis": "tokens"}
    fleet = make_fleet(**kw)
    ticks, pending = [], [ready("p0", "prefill"), ready("d0", "decode")]
    for w in range(18):
        t0 = T0 + INTERVAL * w
        osl = (300 if w % 2 else 150) if w < 13 else int(300 * 1.4 ** (w - 12))
        out = fleet.run([*pending, *requests(20, t0 + 1, t0 + INTERVAL + 1, osl=osl, tag=f"w{w}_")])
        ticks += [o for o in out if getattr(o, "predicted", None) is not None]
        pending = [ack(d.decision_id, d.time + 0.5) for d in decisions(out)]
    forecaster = _state(fleet).forecaster
    last = ticks[-1].predicted
    answer = forecaster.exceedances(0.9, 2, of="peak:answer")
    assert last.sized_rps * INTERVAL == pytest.approx(forecaster.quantile(0.9, 2, of="peak:answer"))
    assert answer[0] > 0 and last.quantile_exceeded == answer
    assert forecaster.exceedances(0.9, 2, of="peak:prompt")[0] == 0


@pytest.mark.parametrize("swing", ["isl", "osl"])
def test_the_token_basis_sizes_an_aggregated_engine_for_the_larger_of_its_works(make_fleet, swing):
    """An aggregated engine does both kinds of work, so it is sized for the larger of the prompt
    and answer series: with the count steady and either the prompts or the answers half as long
    again (twice, for answers) every other window, it is sized above the count, for that series."""
    kw = {"mode": "agg", "throughput_sizing": "startup_quantile", "max_throughput_scaling_replicas": 20,
          "sizing": "fleetplan"}
    runs = {}
    for basis in ("requests", "tokens"):
        fleet = make_fleet(quantile_basis=basis, **kw)
        ticks, pending = [], [ready("a0", "agg")]
        for w in range(13):
            t0 = T0 + INTERVAL * w
            lengths = {"isl": 3000 if w % 2 else 2000} if swing == "isl" else {"osl": 300 if w % 2 else 150}
            out = fleet.run([*pending, *requests(20, t0 + 1, t0 + INTERVAL + 1, tag=f"w{w}_", **lengths)])
            ticks += [o for o in out if getattr(o, "predicted", None) is not None]
            pending = [ack(d.decision_id, d.time + 0.5) for d in decisions(out)]
        runs[basis] = (fleet, ticks)
    (_, by_count), (fleet, by_tokens) = runs["requests"], runs["tokens"]
    forecaster = _state(fleet).forecaster
    series = "peak:prompt" if swing == "isl" else "peak:answer"
    last = by_tokens[-1].predicted
    assert last.sized_rps * INTERVAL == pytest.approx(forecaster.quantile(0.9, last.horizon_windows, of=series))
    for c, t in list(zip(by_count, by_tokens, strict=True))[4:]:
        assert c.predicted.sized_rps == pytest.approx(20.0, rel=0.05)  # the count does not move
        assert t.predicted.sized_rps > 1.15 * c.predicted.sized_rps
        assert t.estimates["agg"].rate_replicas >= c.estimates["agg"].rate_replicas
