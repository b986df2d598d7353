"""A set_config that changes the load predictor rebuilds the forecaster from the windows the core kept."""

from __future__ import annotations

from fleetplan.models.state import DeploymentState
from fleetplan.schemas import ControlEvent
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
