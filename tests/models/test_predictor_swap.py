"""A set_config that changes the load predictor rebuilds the forecaster from the windows the core kept."""

from __future__ import annotations

from fleetplan.models.state import DeploymentState
from fleetplan.schemas import ClockEvent, ControlEvent
from fleetplan.schemas.events import SetConfig
from tests.models.factories import T0, ready, requests

RATES = (20, 26, 18, 31, 24, 35, 22, 29, 40, 27)  # requests a second in each 180-s window


def _traffic():
    out = [ready("p0", "prefill"), ready("d0", "decode")]
    for i, rate in enumerate(RATES):
        start = T0 + 1 + 180 * i
        out += requests(rate, start, start + 179, isl=2000 + 100 * i, osl=150 + 5 * i, tag=f"w{i}-")
    return out


def _set(t: float, **changes) -> ControlEvent:
    return ControlEvent(deployment="d", time=t, body=SetConfig(changes=changes))


def _timed(*events):
    return sorted(events, key=lambda e: e.time)


def _forecasts(out) -> list[float]:
    return [o.predicted.num_req for o in out if getattr(o, "predicted", None) is not None]


def test_a_swap_gives_the_forecaster_the_new_predictor_would_have_had(make_fleet):
    swapped = make_fleet(load_predictor="ensemble")
    out = swapped.run(_timed(*_traffic(), _set(T0 + 1000, load_predictor="kalman")))
    native = make_fleet(load_predictor="kalman")
    reference = native.run(_traffic())
    state = swapped.state("d")
    assert state.config.load_predictor == "kalman" and state.config_version == 1
    assert state.forecaster.to_state() == native.state("d").forecaster.to_state()
    # from the first tick after the swap (T0 + 1080, the sixth), the forecasts are kalman's
    assert _forecasts(out)[6:] == _forecasts(reference)[6:]
    assert _forecasts(out)[:6] != _forecasts(reference)[:6]


QUIET = (1, 2, 5, 2, 1, 3, 3, 5, 3, 1, 2, 3, 2, 1, 3, 1, 1, 5, 5, 3, 1, 2, 1, 1, 3, 5, 1, 5, 3, 1)
"""A low, jumpy rate (requests a second per window): the sizing quantile misses often enough to move its levels."""


def _quiet():
    out = [ready("p0", "prefill"), ready("d0", "decode")]
    for i, rate in enumerate(QUIET):
        start = T0 + 1 + 180 * i
        out += requests(rate, start, start + 179, isl=2000, osl=150, tag=f"q{i}-")
    return out


def test_a_swap_replays_the_quantiles_asked_so_the_adaptive_levels_match(make_fleet):
    """The sizing quantile's adaptive levels move on the quantiles the loop asked for, not only on
    the windows: the swap replays those too (until 2026-12-05 it started them again at q, and the
    swapped P90 was 2113 where the native one was 1269)."""
    swap = _set(T0 + 180 * 25 + 10, load_predictor="kalman")
    swapped = make_fleet(sizing="fleetplan", load_predictor="ensemble")
    swapped.run(_timed(*_quiet(), swap))
    native = make_fleet(sizing="fleetplan", load_predictor="kalman")
    native.run(_quiet())
    moved, reference = swapped.state("d").forecaster, native.state("d").forecaster
    assert reference.to_state()["levels"] and any(v != 0.9 for v in reference.to_state()["levels"].values())
    assert moved.to_state() == reference.to_state()
    # the same at the tick the swap lands at, which first replays the requests made since the
    # last window (the old forecaster's ``asked``), then observes the next window
    at_swap, before = make_fleet(sizing="fleetplan", load_predictor="ensemble"), make_fleet(
        sizing="fleetplan", load_predictor="kalman")
    tick = ClockEvent(deployment="d", time=T0 + 180 * 26 + 5)
    at_swap.run(_timed(*[e for e in _quiet() if e.time < swap.time], swap, tick))
    before.run(_timed(*[e for e in _quiet() if e.time < swap.time], tick))
    assert at_swap.state("d").config.load_predictor == "kalman"
    assert at_swap.state("d").forecaster.to_state() == before.state("d").forecaster.to_state()


def test_a_stored_history_without_the_quantiles_asked_still_rebuilds(make_fleet):
    """States written before 2026-12-05 keep eight fields a window: read as nothing asked."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.predictor_swap import rebuild_forecaster

    fleet = make_fleet(sizing="fleetplan", load_predictor="ensemble")
    fleet.run(_quiet()[:2] + [e for e in _quiet()[2:] if e.time < T0 + 180 * 12])
    state = fleet.state("d")
    assert all(len(row) == 9 for row in state.traffic_history[1:])  # the first window has none
    old = state.to_data()
    old["traffic_history"] = [row[:8] for row in old["traffic_history"]]
    restored = DeploymentState.from_data(old)
    cfg = config_from_dict({"load_predictor": "kalman", "max_gpu_budget": 64})
    plain = rebuild_forecaster(cfg, restored.traffic_history)
    assert plain.windows_seen == len(restored.traffic_history)
    assert all(v == 0.9 for v in plain.to_state()["levels"].values())


def test_the_history_is_bounded_and_a_swap_sees_only_what_it_kept(make_fleet):
    swapped = make_fleet(load_predictor="ensemble", predictor_history_windows=3)
    swapped.run(_timed(*_traffic(), _set(T0 + 1000, load_predictor="constant")))
    state = swapped.state("d")
    assert len(state.traffic_history) == 3
    # the constant predictor repeats the last window it saw: the fifth window's count
    # (the sixth had not closed at the swap) stays until the windows after the swap
    counts = [w[2] for w in state.traffic_history]
    assert state.forecaster.forecast()[0] == counts[-1]
    fresh = make_fleet(load_predictor="ensemble", predictor_history_windows=0)
    fresh.run([*_traffic()[:2], _set(T0 + 1, load_predictor="kalman")])
    assert fresh.state("d").traffic_history == []


def test_only_predictor_fields_rebuild_the_forecaster(make_fleet):
    fleet = make_fleet(load_predictor="kalman")
    traffic = _traffic()
    fleet.run([e for e in traffic if e.time < T0 + 400])
    state = fleet.state("d")
    before = state.forecaster
    fleet.run(_timed(_set(T0 + 500, target_utilization=0.7), *[e for e in traffic if T0 + 400 <= e.time < T0 + 560]))
    assert state.forecaster is before and state.config.target_utilization == 0.7
    fleet.run(_timed(_set(T0 + 600, kalman_r=5.0), *[e for e in traffic if T0 + 560 <= e.time < T0 + 740]))
    assert state.forecaster is not before and state.config.kalman_r == 5.0
    assert state.forecaster.to_state()["forecaster"]["kind"] == "kalman"


def test_a_new_throughput_interval_rebuilds_the_forecaster_for_its_window_length(make_fleet):
    """The interval is a predictor parameter (the window length of the ensemble's daily cycle and
    of Prophet's timestamps): until 2026-12-05 a change kept the forecaster built for the old one."""
    from fleetplan.models.predictor_swap import build_forecaster, predictor_changed

    fleet = make_fleet(load_predictor="ensemble")
    traffic = _traffic()
    fleet.run([e for e in traffic if e.time < T0 + 400])
    state = fleet.state("d")
    before = state.forecaster
    assert predictor_changed(state.config, state.config.with_changes({"throughput_adjustment_interval_seconds": 60}))
    fleet.run(_timed(_set(T0 + 500, throughput_adjustment_interval_seconds=60),
                     *[e for e in traffic if T0 + 400 <= e.time < T0 + 600]))
    assert state.forecaster is not before and state.config.throughput_adjustment_interval_seconds == 60
    assert all(p.params.prophet_interval_s == 60.0 for p in state.forecaster.forecaster.predictors)
    assert state.forecaster.to_state()["forecaster"]["num_req"]["params"] == \
        build_forecaster(state.config).to_state()["forecaster"]["num_req"]["params"]


def test_an_invalid_change_is_counted_and_changes_nothing(make_fleet):
    fleet = make_fleet()
    out = fleet.run(_timed(*[e for e in _traffic() if e.time < T0 + 400], _set(T0 + 200, target_utilization=0.7),
                           _set(T0 + 200.5, target_utilization=2.0)))
    state = fleet.state("d")
    assert state.rejected_controls == 1
    assert state.config.target_utilization == 0.7 and state.config_version == 1
    reports = [o for o in out if hasattr(o, "rejected_controls")]
    assert reports[-1].rejected_controls == 1 and reports[-1].to_dict()["rejected_controls"] == 1


def test_the_history_round_trips_with_the_state(make_fleet):
    fleet = make_fleet(load_predictor="ensemble")
    fleet.run(_traffic())
    state = fleet.state("d")
    assert len(state.traffic_history) == len(RATES) - 1  # the last window has not closed
    again = DeploymentState.from_data(state.to_data())
    assert again.traffic_history == state.traffic_history
    assert again.to_data() == state.to_data()


def test_a_predictor_this_install_cannot_build_is_counted_and_changes_nothing(make_fleet, monkeypatch):
    """Prophet without its extra: the fold refuses the swap instead of stopping the worker."""
    import fleetplan.models.predictors as predictors
    import fleetplan.models.prophet_predictor as prophet_predictor
    from fleetplan.models.config_changes import change_problem

    def unavailable():
        raise predictors.PredictorUnavailable("the 'prophet' predictor needs the optional extra")

    monkeypatch.setattr(prophet_predictor, "_import_prophet", unavailable)
    fleet = make_fleet(load_predictor="kalman")
    fleet.run(_timed(*[e for e in _traffic() if e.time < T0 + 400], _set(T0 + 200, load_predictor="prophet")))
    state = fleet.state("d")
    assert state.rejected_controls == 1 and state.config.load_predictor == "kalman"
    assert state.forecaster.to_state()["forecaster"]["kind"] == "kalman"
    # intake names it, so the worker dead-letters it before it reaches the fold
    assert change_problem(state.config, {"load_predictor": "prophet"}) == (
        "set_config: load_predictor: the 'prophet' predictor needs the optional extra")


def test_a_rebuild_replays_a_warm_up_trace_as_warm_did():
    """A warm-up trace's windows (kept first, without start_s) are replayed as ``warm``
    replayed them, so live idle windows after them are skipped as an idle start again,
    as in the forecaster the deployment had (until 2026-12-05 a rebuild fed them)."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.forecast import TrafficObservation, bucket_traffic
    from fleetplan.models.predictor_swap import (
        build_forecaster,
        rebuild_forecaster,
        remember_window,
    )

    for kind in ("ensemble", "kalman", "constant"):
        cfg = config_from_dict({"load_predictor": kind})
        warm_up = bucket_traffic([(0.5 * i, 2000.0, 150.0) for i in range(3000)], 180.0)
        native, history = build_forecaster(cfg), []
        native.warm(warm_up)
        for obs in warm_up:
            remember_window(history, obs, None, cfg.predictor_history_windows)
        for i, n in enumerate((0, 0, 0, 400, 380, 0, 420, 500)):  # an idle live start, then traffic
            obs = TrafficObservation(duration_s=180.0, num_req=float(n), isl=2000.0 if n else 0.0,
                                     osl=150.0 if n else 0.0, start_s=T0 + 180.0 * i)
            native.observe(obs, peak=float(n))
            remember_window(history, obs, float(n), cfg.predictor_history_windows)
        assert rebuild_forecaster(cfg, history).to_state() == native.to_state(), kind


def test_a_new_throughput_interval_replays_the_kept_windows_as_counts_of_the_new_length(make_fleet):
    """The forecast is a count per window and the loop's demand that count over the interval, so
    the windows kept at 180 s are replayed as 60-s counts after a change to 60 s. Until
    2026-12-05 they were replayed as they were: 20 rps throughout read as 38.7 rps at the first
    tick after the change (kalman; the ensemble 31.5), as if the traffic had nearly doubled."""
    for kind in ("kalman", "ensemble"):
        fleet = make_fleet(load_predictor=kind)
        events = [ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 180 * 13)]
        out = fleet.run(_timed(*events, _set(T0 + 180 * 10 + 30, throughput_adjustment_interval_seconds=60)))
        after = [o.predicted for o in out if getattr(o, "predicted", None) is not None and o.time > T0 + 1830]
        assert after and all(abs(p.rps - 20.0) < 1.0 for p in after), (kind, [round(p.rps, 1) for p in after])


def test_a_history_shortened_with_the_swap_warms_the_new_predictor_on_what_it_keeps(make_fleet):
    """``predictor_history_windows: 0`` starts a swapped-in predictor empty; given with the swap (or
    before it, in the same window) the history was trimmed only when the next window closed, after
    the new predictor had been warmed on every window kept under the old bound."""
    tick = ClockEvent(deployment="d", time=T0 + 1085)  # the swap lands at 1080, which closes a window
    fleet = make_fleet(load_predictor="ensemble")
    fleet.run(_timed(*[e for e in _traffic() if e.time < T0 + 1080],
                     _set(T0 + 1000, load_predictor="kalman", predictor_history_windows=0), tick))
    state = fleet.state("d")
    assert state.config.predictor_history_windows == 0 and state.traffic_history == []
    assert state.forecaster.windows_seen == 1  # the window closed at 1080 alone, not the five before
    shorter = make_fleet(load_predictor="ensemble")
    shorter.run(_timed(*[e for e in _traffic() if e.time < T0 + 1080], _set(T0 + 990, predictor_history_windows=2),
                       _set(T0 + 1000, load_predictor="kalman"), tick))
    assert shorter.state("d").forecaster.windows_seen == 3  # the two kept, then 1080's
