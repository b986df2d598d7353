"""The daily profile and the ensemble predictor: learning, idle rules, never negative, exact state."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.ensemble import MEMBERS, EnsemblePredictor
from fleetplan.models.predictors import PredictorParams
from fleetplan.models.seasonal import DAY_S, DailyProfile

TEN_MIN = 600.0
PER_DAY = int(DAY_S / TEN_MIN)  # 144 windows


def bits(x: float) -> str:
    return float(x).hex()


def json_round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state, allow_nan=False))


def ensemble(values=(), interval_s: float = TEN_MIN) -> EnsemblePredictor:
    p = EnsemblePredictor(PredictorParams(prophet_interval_s=interval_s))
    for v in values:
        p.add_data_point(v)
    return p


def daily_series(days: int, noise: float, seed: int = 7, amplitude: float = 0.6) -> list[float]:
    """Requests per 10 minutes: a daily cycle in log space with lognormal noise."""
    rng = random.Random(seed)
    return [
        math.exp(8.0 + amplitude * math.sin(2 * math.pi * t / PER_DAY) + rng.gauss(0.0, noise))
        for t in range(days * PER_DAY)
    ]


def mean_log_error(kind_values, actual) -> float:
    return sum(
        abs(math.log1p(f) - math.log1p(a)) for f, a in zip(kind_values, actual, strict=True)
    ) / len(actual)


def one_step(predictor, values, warm: int) -> tuple[list[float], list[float]]:
    for v in values[:warm]:
        predictor.add_data_point(v)
    forecasts = []
    for v in values[warm:]:
        forecasts.append(predictor.predict_next())
        predictor.add_data_point(v)
    return forecasts, values[warm:]


def constant_errors(values, warm: int) -> float:
    return mean_log_error(values[warm - 1 : -1], values[warm:])


# --- DailyProfile ------------------------------------------------------------


def test_profile_learns_a_daily_sinusoid():
    profile = DailyProfile(TEN_MIN)
    series = daily_series(days=3, noise=0.02)
    for t, y in enumerate(series):
        profile.update(t, math.log(y))
    assert profile.covers_a_day()
    for t in range(0, PER_DAY, 12):
        assert profile.shape(t) == pytest.approx(
            0.6 * math.sin(2 * math.pi * t / PER_DAY), abs=0.05
        )


def test_profile_survives_an_outage():
    profile = DailyProfile(TEN_MIN)
    series = [math.log(y) for y in daily_series(days=3, noise=0.02)]
    series[200:230] = [0.0] * 30  # five hours of zero windows
    for t, z in enumerate(series):
        profile.update(t, z)
    errors = [
        abs(profile.shape(t) - 0.6 * math.sin(2 * math.pi * t / PER_DAY)) for t in range(PER_DAY)
    ]
    assert max(errors) < 0.2


def test_profile_needs_windows_shorter_than_a_quarter_day():
    assert DailyProfile(TEN_MIN).usable
    assert not DailyProfile(12 * 3600.0).usable
    with pytest.raises(ValueError, match="interval_s must be a positive finite number"):
        DailyProfile(0.0)


@pytest.mark.parametrize("interval_s", [6 * 3600.0, 4.8 * 3600.0, 4 * 3600.0])
def test_a_day_of_few_windows_fits_only_the_harmonics_it_resolves(interval_s):
    """With 4, 5 or 6 windows a day the phases seen are that few, and 3 harmonics are 7
    coefficients: the unseen directions' covariance grew by 1/forget each window, the fit
    diverged within a year (6-hour windows: 1e19 after 1,000) and later raised in fsum."""
    profile = DailyProfile(interval_s)
    per_day = DAY_S / interval_s
    rng = random.Random(1)
    for t in range(3000):  # two to three years
        profile.update(t, 5.0 + 0.5 * math.cos(2 * math.pi * t / per_day) + rng.gauss(0.0, 0.05))
    for t in range(round(per_day)):
        assert profile.shape(t) == pytest.approx(0.5 * math.cos(2 * math.pi * t / per_day), abs=0.1)
    p = ensemble(interval_s=interval_s)
    for t in range(3000):
        p.note_window_start(t * interval_s)
        p.add_data_point(math.exp(5.0 + 0.5 * math.cos(2 * math.pi * t / per_day) + rng.gauss(0.0, 0.05)))
    assert EnsemblePredictor.from_state(json_round_trip(p.to_state())).to_state() == p.to_state()
    # a state stored with the 7 coefficients (diverging) starts the fit again
    stored = {**profile.to_state(), "harmonics": 3, "theta": [1e300] * 7, "cov": [[1e300] * 7] * 7}
    assert DailyProfile.from_state(stored).to_state() == DailyProfile(interval_s).to_state()


def test_a_deployment_busy_part_of_the_day_keeps_its_fit_bounded():
    """The ensemble fits the profile on busy windows only. At 2-hour windows (12 phases, all 3
    harmonics) a deployment busy 08:00-16:00 shows the fit 4 phases of the 7 coefficients' space:
    the directions they do not excite were only forgotten, their covariance grew by 1/forget a
    busy window, and the coefficients reached 5e4 after 300 days, 1e107 after 700, later raising
    in fsum. They stay where the busy phases put them, and the busy windows are still forecast."""
    interval_s = 7200.0
    per_day = round(DAY_S / interval_s)
    rng = random.Random(1)
    p = ensemble(interval_s=interval_s)
    errors = []
    for day in range(400):
        for k in range(per_day):
            p.note_window_start((day * per_day + k) * interval_s)
            z = 7.0 + 0.3 * math.cos(2 * math.pi * k / per_day) + rng.gauss(0.0, 0.05)
            busy = 4 <= k < 8
            if busy and k > 4 and day >= 300:
                errors.append(abs(math.log1p(p.predict_next()) - z))
            p.add_data_point(math.exp(z) if busy else 0.0)
    assert max(abs(c) for c in p._profile.to_state()["theta"]) < 100.0
    assert sum(errors) / len(errors) < 0.1
    assert EnsemblePredictor.from_state(json_round_trip(p.to_state())).to_state() == p.to_state()


def test_profile_state_round_trips_and_continues_bit_for_bit():
    a = DailyProfile(TEN_MIN)
    series = [math.log(y) for y in daily_series(days=2, noise=0.1)]
    for t, z in enumerate(series[:200]):
        a.update(t, z)
    b = DailyProfile.from_state(json_round_trip(a.to_state()))
    assert b.to_state() == a.to_state()
    for t, z in enumerate(series[200:], start=200):
        a.update(t, z)
        b.update(t, z)
        assert bits(a.shape(t + 1)) == bits(b.shape(t + 1))


@pytest.mark.parametrize("windows", [0, 1, 37, -5, PER_DAY + 10, 10_000_003])
def test_profile_shift_moves_the_cycle_and_keeps_learning(windows):
    a = DailyProfile(TEN_MIN)
    series = [math.log(y) for y in daily_series(days=2, noise=0.1)]
    for t, z in enumerate(series[:200]):
        a.update(t, z)
    b = DailyProfile.from_state(a.to_state())
    b.shift(windows)
    for t in range(0, PER_DAY, 7):
        assert b.shape(t + windows) == pytest.approx(a.shape(t), abs=1e-9)
    for t, z in enumerate(series[200:], start=200):  # the same fit, on the moved clock
        a.update(t, z)
        b.update(t + windows, z)
    assert b.shape(250 + windows) == pytest.approx(a.shape(250), abs=1e-9)
    cov = b.to_state()["cov"]
    assert all(cov[i][j] == cov[j][i] for i in range(len(cov)) for j in range(len(cov)))


# --- ensemble: learning ------------------------------------------------------


def test_ensemble_beats_the_last_value_on_a_daily_cycle():
    series = daily_series(days=5, noise=0.05)
    warm = 3 * PER_DAY
    forecasts, actual = one_step(ensemble(), series, warm)
    assert mean_log_error(forecasts, actual) < 0.9 * constant_errors(series, warm)


def test_member_weights_of_an_ensemble_fed_nothing():
    """Before any busy window the median member has no windows (its median raised IndexError)."""
    weights = ensemble([0.0, 0.0]).member_weights()
    assert math.fsum(weights.values()) == pytest.approx(1.0)
    assert weights["daily_last"] == weights["daily_smooth"] == 0.0


def test_daily_members_start_after_a_day_and_earn_weight():
    p = ensemble(daily_series(days=1, noise=0.05)[: PER_DAY - 1])
    assert p.member_weights()["daily_last"] == 0.0  # not a day of data yet
    for y in daily_series(days=4, noise=0.05)[PER_DAY - 1 :]:
        p.add_data_point(y)
    weights = p.member_weights()
    assert math.fsum(weights.values()) == pytest.approx(1.0)
    assert max(weights, key=weights.get) in ("daily_last", "daily_smooth")


def test_ensemble_smooths_a_noisy_level():
    rng = random.Random(3)
    series = [math.exp(6.0 + rng.gauss(0.0, 0.3)) for _ in range(300)]
    forecasts, actual = one_step(ensemble(interval_s=60.0), series, 50)
    assert mean_log_error(forecasts, actual) < 0.85 * constant_errors(series, 50)


def test_ensemble_follows_steps_almost_like_the_last_value():
    # A step-like series (a 6-hour mean ISL) is what the last value is best at.
    series = [float(v) for v in [800] * 36 + [1400] * 36 + [600] * 36 + [1000] * 36]
    forecasts, actual = one_step(ensemble(), series, 36)
    assert mean_log_error(forecasts, actual) < 1.6 * constant_errors(series, 36)


def test_ensemble_follows_a_ramp():
    series = [100.0 * 1.05**i for i in range(60)]
    forecasts, actual = one_step(ensemble(interval_s=60.0), series, 20)
    assert mean_log_error(forecasts, actual) < constant_errors(series, 20)


def timed_one_step(predictor, values, starts, warm: int) -> tuple[list[float], list[float]]:
    """``one_step`` with each window's start time given first."""
    forecasts = []
    for i, (v, start) in enumerate(zip(values, starts, strict=True)):
        predictor.note_window_start(start)
        if i >= warm:
            forecasts.append(predictor.predict_next())
        predictor.add_data_point(v)
    return forecasts, values[warm:]


def test_window_starts_keep_the_daily_phase_across_a_gap():
    # five days of a daily cycle; the planner is down for six hours of day 3, so
    # those 36 windows are never fed: counted windows then lag the day by 6 hours
    series = daily_series(days=5, noise=0.02, amplitude=0.8)
    kept = [t for t in range(len(series)) if not 3 * PER_DAY <= t < 3 * PER_DAY + 36]
    values = [series[t] for t in kept]
    warm = kept.index(4 * PER_DAY)  # score day 4
    timed, actual = timed_one_step(ensemble(), values, [t * TEN_MIN for t in kept], warm)
    counted, _ = one_step(ensemble(), values, warm)
    whole, whole_actual = one_step(ensemble(), series, 4 * PER_DAY)
    # with the time of day the gap costs nothing against no gap at all; counted,
    # the cycle is out of phase and the ensemble falls back to its level members
    assert mean_log_error(timed, actual) < 1.01 * mean_log_error(whole, whole_actual)
    assert mean_log_error(counted, actual) > 1.3 * mean_log_error(timed, actual)


def test_a_warm_up_from_another_hour_is_in_phase_with_the_day():
    # the warm-up trace began at 13:00 (window 78); the live series at midnight
    series = daily_series(days=4, noise=0.05, amplitude=0.8)
    p = ensemble()
    for t in range(78, 3 * PER_DAY):
        p.note_window_start(t * TEN_MIN)
        p.add_data_point(series[t])
    reference = ensemble(series[: 3 * PER_DAY])  # the same cycle, fed from midnight
    weights = p.member_weights()
    assert weights["daily_last"] + weights["daily_smooth"] > 0.5
    p.note_window_start(3 * PER_DAY * TEN_MIN)
    assert p.predict_next() == pytest.approx(reference.predict_next(), rel=0.05)


def test_an_untimed_warm_up_is_taken_to_end_where_the_timed_windows_begin():
    # a warm-up trace (its clock starts at its first row) of 2.5 days, then live
    # windows with epoch start times: the cycle learned on the count carries on
    series = daily_series(days=4, noise=0.05, amplitude=0.8)
    warm = PER_DAY * 5 // 2
    epoch = 1_800_000_000.0 - 1_800_000_000.0 % TEN_MIN + 17 * TEN_MIN
    live = [epoch + i * TEN_MIN for i in range(len(series) - warm)]
    timed = ensemble(series[:warm])
    forecasts, actual = timed_one_step(timed, series[warm:], live, 0)
    counted, _ = one_step(ensemble(series[:warm]), series[warm:], 0)
    assert mean_log_error(forecasts, actual) == pytest.approx(mean_log_error(counted, actual), rel=1e-6)
    assert timed.to_state()["model"]["timed"] is True


def test_contiguous_windows_from_midnight_forecast_as_counted_ones():
    # the clock from the window starts equals the window count: the same bits
    series = daily_series(days=2, noise=0.1)
    timed, _ = timed_one_step(ensemble(), series, [t * TEN_MIN for t in range(len(series))], 10)
    counted, _ = one_step(ensemble(), series, 10)
    assert [bits(x) for x in timed] == [bits(x) for x in counted]


def test_a_timed_ensemble_round_trips_and_continues_bit_for_bit():
    series = daily_series(days=2, noise=0.1)
    starts = [86_400.0 * 30 + 7_200.0 + t * TEN_MIN for t in range(len(series))]
    a = ensemble()
    timed_one_step(a, series[:200], starts[:200], 200)
    b = EnsemblePredictor.from_state(json_round_trip(a.to_state()))
    fa, _ = timed_one_step(a, series[200:], starts[200:], 0)
    fb, _ = timed_one_step(b, series[200:], starts[200:], 0)
    assert [bits(x) for x in fa] == [bits(x) for x in fb]
    assert a.to_state() == b.to_state()


# --- ensemble: idle rules ------------------------------------------------------


def test_no_data_and_idle_start_forecast_zero():
    p = ensemble()
    assert p.predict_next() == 0.0
    for v in (0.0, float("nan"), -1.0):
        p.add_data_point(v)
    assert p.is_skipping_idle and p.predict_next() == 0.0
    p.add_data_point(50.0)
    assert p.predict_next() == pytest.approx(50.0)


def test_after_an_idle_window_with_no_history_expect_idle():
    assert ensemble([100.0, 120.0, 0.0]).predict_next() == 0.0


def test_idle_runs_that_continue_forecast_zero_and_busy_returns_to_the_level():
    p = ensemble([1000.0] * 20 + [0.0] * 6 + [1000.0] * 5 + [0.0])
    assert p.predict_next() == 0.0
    p.add_data_point(1000.0)
    assert p.predict_next() == pytest.approx(1000.0, rel=0.05)


def test_single_idle_windows_between_busy_ones_forecast_busy():
    p = ensemble([500.0, 0.0] * 10)
    assert p.predict_next() == pytest.approx(500.0, rel=0.05)


def test_idle_windows_do_not_drag_the_busy_level():
    p = ensemble([400.0] * 30 + [0.0] * 3 + [400.0])
    assert p.predict_next() == pytest.approx(400.0, rel=0.02)


# --- ensemble: never negative, exact state -------------------------------------

nasty = st.one_of(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
    st.sampled_from([0.0, float("nan"), float("inf"), float("-inf"), 1e-300, 5e307]),
)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(nasty, max_size=60), interval=st.sampled_from([60.0, 180.0, 600.0, 3600.0]))
def test_forecast_is_never_negative_and_finite(values, interval):
    p = ensemble(interval_s=interval)
    for v in values:
        p.add_data_point(v)
        forecast = p.predict_next()
        assert math.isfinite(forecast) and forecast >= 0.0
        assert bits(forecast) != bits(-0.0)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.one_of(st.just(0.0), st.floats(0.5, 1e6)), min_size=1, max_size=40),
    rest=st.lists(st.floats(0.0, 1e6), max_size=20),
)
def test_state_round_trips_exactly_and_continues_bit_for_bit(values, rest):
    a = ensemble(values, interval_s=60.0)
    state = json_round_trip(a.to_state())
    b = EnsemblePredictor.from_state(state)
    assert b.to_state() == a.to_state()
    assert bits(a.predict_next()) == bits(b.predict_next())
    for v in rest:
        a.add_data_point(v)
        b.add_data_point(v)
        assert bits(a.predict_next()) == bits(b.predict_next())


def test_state_round_trip_over_days_with_the_daily_members_on():
    series = daily_series(days=2, noise=0.1)
    a = ensemble(series[:200])
    b = EnsemblePredictor.from_state(json_round_trip(a.to_state()))
    for y in series[200:]:
        a.add_data_point(y)
        b.add_data_point(y)
    assert bits(a.predict_next()) == bits(b.predict_next())
    assert a.to_state() == b.to_state()


def test_state_with_other_members_is_refused():
    state = ensemble([10.0, 20.0]).to_state()
    state["model"]["errors"] = state["model"]["errors"][:-1]
    with pytest.raises(ValueError, match="members"):
        EnsemblePredictor.from_state(state)
    assert len(MEMBERS) == len(ensemble().to_state()["model"]["errors"])
