"""Load predictors: rules shared by every kind, each model, exact state round trips."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.predictors import (
    KalmanPredictor,
    Predictor,
    PredictorUnavailable,
    make_predictor,
    predictor_from_state,
    predictor_kinds,
)

# Kinds that run without optional extras; ARIMA gets small windows so the
# property tests stay fast (selection cost grows with the window).
SMALL_ARIMA = {"arima_max_history": 12, "arima_reselect_every": 4}
CORE_KINDS = [
    ("constant", {}),
    ("kalman", {}),
    ("kalman", {"log1p": True}),
    ("arima", SMALL_ARIMA),
    ("arima", {**SMALL_ARIMA, "log1p": True}),
    ("arima_frozen", SMALL_ARIMA),
]
CHEAP_KINDS = [k for k in CORE_KINDS if not k[0].startswith("arima")]


def bits(x: float) -> str:
    """Exact identity of a float (distinguishes -0.0, every last bit)."""
    return float(x).hex()


def fed(kind: str, values, **params) -> Predictor:
    predictor = make_predictor(kind, **params)
    for v in values:
        predictor.add_data_point(v)
    return predictor


def json_round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state, allow_nan=False))


# --- registry ----------------------------------------------------------------


def test_unknown_kind_names_the_valid_kinds():
    with pytest.raises(ValueError) as err:
        make_predictor("oracle")
    for kind in ("constant", "arima", "arima_frozen", "kalman", "prophet"):
        assert kind in str(err.value)
    assert set(predictor_kinds()) == {
        "constant",
        "arima",
        "arima_frozen",
        "kalman",
        "prophet",
        "ensemble",
    }


def test_unknown_parameter_is_rejected():
    with pytest.raises(ValueError, match="kalman_qq"):
        make_predictor("kalman", kalman_qq=1.0)


def test_every_kind_accepts_every_parameter():
    # A planner config carries all predictor params whatever the kind.
    params = {"log1p": True, "prophet_window_size": 20, "kalman_r": 5.0, "arima_min_points": 3}
    for kind in ("constant", "arima", "kalman"):
        assert make_predictor(kind, **params).params.kalman_r == 5.0


@pytest.mark.parametrize(
    "params",
    [{"kalman_r": 0.0}, {"kalman_min_points": 0}, {"prophet_window_size": 1}, {"log1p": 1}],
)
def test_bad_parameter_values_are_rejected(params):
    with pytest.raises(ValueError):
        make_predictor("kalman", **params)


def test_state_of_another_kind_is_refused():
    state = fed("constant", [1.0]).to_state()
    with pytest.raises(ValueError, match="constant"):
        KalmanPredictor.from_state(state)
    with pytest.raises(ValueError, match="valid kinds"):
        predictor_from_state({**state, "kind": "oracle"})


# --- rules shared by every kind ----------------------------------------------


@pytest.mark.parametrize("kind,params", CORE_KINDS)
def test_no_data_forecasts_zero(kind, params):
    assert make_predictor(kind, **params).predict_next() == 0.0


@pytest.mark.parametrize("kind,params", CORE_KINDS)
def test_leading_zeros_are_an_idle_start(kind, params):
    p = fed(kind, [0.0, 0.0, float("nan"), -3.0], **params)
    assert p.num_points == 0 and p.is_skipping_idle
    assert p.predict_next() == 0.0
    p.add_data_point(7.0)
    assert p.num_points == 1 and not p.is_skipping_idle
    assert p.predict_next() == 7.0


@pytest.mark.parametrize("kind,params", CORE_KINDS)
def test_nan_and_inf_count_as_zero_after_traffic(kind, params):
    p = fed(kind, [4.0, float("nan")], **params)
    assert p.num_points == 2
    assert p.predict_next() == 0.0  # warming up: the last value, which was NaN -> 0
    p.add_data_point(float("inf"))
    assert p.num_points == 3 and p.predict_next() == 0.0


@pytest.mark.parametrize("kind,params", CORE_KINDS)
def test_reset_idle_skip_drops_zeros_until_traffic(kind, params):
    p = fed(kind, [3.0, 0.0, 5.0], **params)
    p.reset_idle_skip()
    p.add_data_point(0.0)
    p.add_data_point(0.0)
    assert p.num_points == 3
    p.add_data_point(2.0)
    p.add_data_point(0.0)  # traffic seen again: zeros count
    assert p.num_points == 5


@pytest.mark.parametrize(
    "kind,min_points",
    [("kalman", 5), ("arima", 5), ("arima_frozen", 5), ("constant", 1)],
)
def test_warm_up_forecasts_the_last_value(kind, min_points):
    values = [10.0, 30.0, 20.0, 50.0, 40.0, 60.0]
    p = make_predictor(kind)
    for i, v in enumerate(values[: min_points - 1 or 1]):
        p.add_data_point(v)
        assert p.predict_next() == v, f"point {i}"


# --- never negative ----------------------------------------------------------

nasty = st.one_of(
    st.floats(min_value=-1e9, max_value=1e9, allow_nan=False),
    st.sampled_from([0.0, float("nan"), float("inf"), float("-inf")]),
)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(nasty, max_size=40))
@pytest.mark.parametrize("kind,params", CHEAP_KINDS)
def test_forecast_is_never_negative_and_finite(kind, params, values):
    p = make_predictor(kind, **params)
    for v in values:
        p.add_data_point(v)
        forecast = p.predict_next()
        assert math.isfinite(forecast) and forecast >= 0.0
        assert bits(forecast) != bits(-0.0)


def test_kalman_falling_series_is_clamped_at_zero():
    # The reference's bug #14493: a steady fall extrapolates below zero.
    p = fed("kalman", [100.0, 80.0, 60.0, 40.0, 20.0, 5.0])
    model = p.to_state()["model"]
    assert model["x"][0] + model["x"][1] < 0.0  # the raw filter says negative
    assert p.predict_next() == 0.0


@pytest.mark.parametrize("kind", ["arima", "arima_frozen"])
def test_arima_falling_series_is_never_negative(kind):
    p = fed(kind, [100.0, 90.0, 75.0, 60.0, 40.0, 25.0, 12.0, 4.0, 1.0], **SMALL_ARIMA)
    assert p.predict_next() >= 0.0


# --- Kalman ------------------------------------------------------------------


def test_kalman_second_step_by_hand():
    # First point sets level 10, trend 0, P = 1000·I. Second point y = 20:
    #   predicted P_ll = 1000 + 1000 + q_level(1) = 2001, P_lt = 1000, S = 2001 + r(10)
    #   level = 10 + (2001/2011)·10, trend = (1000/2011)·10
    p = fed("kalman", [10.0, 20.0], kalman_min_points=2)
    expected = 10.0 + 2001.0 / 2011.0 * 10.0 + 1000.0 / 2011.0 * 10.0
    assert p.predict_next() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["kalman_q_level", "kalman_q_trend", "kalman_r"])
def test_kalman_variances_past_the_bound_are_refused_by_name(name):
    """Until 2026-12-05 kalman_r=1e306 passed (> 0) and made the filter's state NaN, which JSON
    writes as null and no state restored."""
    with pytest.raises(ValueError, match=f"^{name} must be at most 1e\\+30, got 1e\\+306$"):
        make_predictor("kalman", **{name: 1e306})
    from fleetplan.models.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=f"^config: {name}: must be at most 1e\\+30, got 1e\\+306$"):
        config_from_dict({"load_predictor": "kalman", name: 1e306})
    at_bound = fed("kalman", [100.0, 120.0, 130.0, 90.0, 110.0, 105.0, 101.0] * 20, **{name: 1e30})
    state = json.loads(json.dumps(at_bound.to_state(), allow_nan=False))
    assert math.isfinite(at_bound.predict_next())
    assert predictor_from_state(state).predict_next() == at_bound.predict_next()


def test_kalman_update_does_not_overflow_on_a_large_covariance():
    """P·R overflowed to inf (and the state to NaN) before it was divided by S: the update takes
    R / S first."""
    p = fed("kalman", [100.0, 120.0], kalman_r=1e30)
    state = p.to_state()
    state["model"]["P"] = [[1e300, 0.0], [0.0, 1.0]]
    p = predictor_from_state(state)
    p.add_data_point(110.0)
    model = p.to_state()["model"]
    assert all(math.isfinite(v) for v in [*model["x"], *model["P"][0], *model["P"][1]])
    assert model["P"][0][0] == pytest.approx(1e30)  # P_ll·R / (P_ll + R): the smaller of the two


def test_kalman_starts_again_from_a_count_that_overflows_its_trend():
    p = fed("kalman", [1e308, 1.7e308, 1.7e308, 1.7e308, 1.7e308, 1.7e308])
    state = json.loads(json.dumps(p.to_state(), allow_nan=False))
    assert state["model"]["x"] == [1.7e308, 0.0]
    assert predictor_from_state(state).predict_next() == p.predict_next() == 1.7e308


def test_log1p_forecasts_past_floats_limit_are_finite():
    """A rising trend in log space past log1p(float max) made expm1 raise OverflowError."""
    p = fed("kalman", [1e300, 1e305, 1.7e308, 1.7e308, 1.7e308, 1.7e308], log1p=True)
    assert p.predict_next() == math.expm1(709.0)


def test_a_kalman_state_that_is_not_finite_is_refused_by_name():
    state = fed("kalman", [100.0, 120.0]).to_state()
    for model in ({"x": [None, None], "P": state["model"]["P"]}, {"x": state["model"]["x"], "P": [[1.0, None], [None, 1.0]]}):
        with pytest.raises(ValueError, match="^kalman state: x and P must be finite numbers"):
            predictor_from_state({**state, "model": model})


def test_kalman_tracks_a_constant_and_a_ramp():
    assert fed("kalman", [42.0] * 20).predict_next() == pytest.approx(42.0)
    ramp = [10.0 + 5.0 * i for i in range(40)]
    assert fed("kalman", ramp).predict_next() == pytest.approx(ramp[-1] + 5.0, rel=1e-3)


def test_kalman_log1p_forecasts_in_original_units():
    p = fed("kalman", [1000.0] * 10, log1p=True)
    assert p.predict_next() == pytest.approx(1000.0)


# --- ARIMA -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["arima", "arima_frozen"])
def test_arima_all_equal_history_returns_that_value(kind):
    assert fed(kind, [7.5] * 9).predict_next() == 7.5


# Regime change: 24 windows of noise around 50, then a steep random walk
# (fixed numbers drawn once from numpy's default_rng(7)).
NOISE_THEN_RAMP = [
    50.004, 50.896, 49.178, 47.328, 48.636, 47.025, 50.18, 54.021, 48.523, 48.139,
    51.47, 51.071, 50.316, 47.209, 49.912, 52.086, 45.967, 48.627, 44.296, 46.131,
    44.475, 49.295, 46.198, 50.814, 54.47, 57.909, 54.359, 56.743, 60.598, 64.938,
    64.347, 66.914, 67.978, 69.552, 76.734, 78.312, 82.214, 88.867, 91.117, 94.782,
    99.113, 103.304, 103.629, 107.858, 115.934, 115.293, 121.871, 126.229,
]  # fmt: skip


def test_arima_reselects_its_order_when_the_regime_changes():
    adaptive = make_predictor("arima", arima_max_history=24)
    frozen = make_predictor("arima_frozen", arima_max_history=24)
    orders = {}
    for n, v in enumerate(NOISE_THEN_RAMP, start=1):
        adaptive.add_data_point(v)
        frozen.add_data_point(v)
        if n in (16, 48):
            adaptive.predict_next()
            frozen.predict_next()
            orders[n] = (adaptive.order, frozen.order)
    # selections fall on the grid 5, 17, 29, 41, ...: n=16 uses 5, n=48 uses 41
    assert adaptive.selected_at == 41
    (early, frozen_early), (late, frozen_late) = orders[16], orders[48]
    assert early != late
    assert late[1] == 1  # the ramp is non-stationary: differenced
    assert frozen_early == frozen_late  # the reference's order never moves
    # the new order follows the ramp; the frozen one lags far behind it
    assert adaptive.predict_next() > 110.0 > 100.0 > frozen.predict_next()


def test_arima_order_is_a_function_of_the_series_not_of_call_times():
    # One predictor forecasts at every point, another only at the end: the
    # selections land on the same grid, so the final forecasts agree bitwise.
    every = make_predictor("arima", **SMALL_ARIMA)
    once = make_predictor("arima", **SMALL_ARIMA)
    for v in NOISE_THEN_RAMP[:30]:
        every.add_data_point(v)
        once.add_data_point(v)
        every.predict_next()
    assert bits(every.predict_next()) == bits(once.predict_next())
    assert every.order == once.order


def test_arima_keeps_a_bounded_history():
    p = fed("arima", [float(i % 7 + 1) for i in range(100)], **SMALL_ARIMA)
    history = p.to_state()["model"]["history"]
    assert len(history) == 12 + 4 - 1


# --- exact state round trips -------------------------------------------------

series = st.lists(
    st.one_of(
        st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
        st.sampled_from([0.0, float("nan"), float("inf")]),
    ),
    max_size=14,
)


def check_round_trip(kind: str, params: dict, first: list[float], more: list[float]) -> None:
    p = fed(kind, first, **params)
    before = predictor_from_state(json_round_trip(p.to_state()))
    assert before.to_state() == p.to_state()
    assert bits(before.predict_next()) == bits(p.predict_next())
    after = predictor_from_state(json_round_trip(p.to_state()))  # with cached fits
    for v in more:
        for q in (p, before, after):
            q.add_data_point(v)
    expected = bits(p.predict_next())
    assert p.predict_next() >= 0.0
    assert bits(before.predict_next()) == expected
    assert bits(after.predict_next()) == expected
    assert before.to_state() == after.to_state() == p.to_state()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=series, more=series)
@pytest.mark.parametrize("kind,params", CHEAP_KINDS)
def test_round_trip_is_exact(kind, params, first, more):
    check_round_trip(kind, params, first, more)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=series, more=series)
@pytest.mark.parametrize("kind,params", [k for k in CORE_KINDS if k[0].startswith("arima")])
def test_arima_round_trip_is_exact(kind, params, first, more):
    check_round_trip(kind, params, first, more)


@pytest.mark.parametrize("kind,params", CORE_KINDS)
def test_round_trip_on_a_real_shaped_series(kind, params):
    check_round_trip(kind, params, NOISE_THEN_RAMP[:20], NOISE_THEN_RAMP[20:30])


@pytest.mark.parametrize("kind,params", CORE_KINDS)
def test_same_inputs_same_bits(kind, params):
    a = fed(kind, NOISE_THEN_RAMP[:20], **params)
    b = fed(kind, NOISE_THEN_RAMP[:20], **params)
    assert bits(a.predict_next()) == bits(b.predict_next())


# --- Prophet (optional extra) ------------------------------------------------


def test_prophet_missing_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prophet", None)  # import prophet -> ImportError
    with pytest.raises(PredictorUnavailable, match=r"fleetplan\[prophet\]"):
        make_predictor("prophet")
    assert issubclass(PredictorUnavailable, RuntimeError)


def test_prophet_state_without_the_extra_fails_clearly(monkeypatch):
    state = {
        "kind": "prophet",
        "params": {},
        "skipping_idle": False,
        "count": 1,
        "last": 1.0,
        "model": {"window": [1.0]},
    }
    monkeypatch.setitem(sys.modules, "prophet", None)
    with pytest.raises(PredictorUnavailable):
        predictor_from_state(state)


def needs_prophet() -> None:
    """Skip where the optional extra is not installed (a bare ``pytest`` in a venv without it);
    where it is (``make test`` installs it), a prophet that cannot be imported fails the test.
    ``importorskip`` skipped on any ModuleNotFoundError, so a prophet installed without one of
    its dependencies went green in CI with its tests skipped."""
    try:
        importlib.metadata.distribution("prophet")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the optional prophet extra is not installed (pip install -e '.[prophet]')")
    import prophet  # noqa: F401  (installed: an import error is a failure)


def test_prophet_forecasts_and_round_trips():
    needs_prophet()
    values = [float(100 + (i % 6) * 10) for i in range(12)]
    p = fed("prophet", values, prophet_window_size=8)
    assert p.to_state()["model"]["window"] == values[-8:]
    forecast = p.predict_next()
    assert math.isfinite(forecast) and forecast >= 0.0
    q = predictor_from_state(json_round_trip(p.to_state()))
    assert bits(q.predict_next()) == bits(forecast)
    assert fed("prophet", values[:4]).predict_next() == values[3]  # warm-up: last value


def test_prophet_fits_quietly():
    """cmdstanpy prints two INFO lines per fit to stderr when no logging is set
    up, as in the CLI; pytest's own log capture would hide that, so a clean
    interpreter runs the fit."""
    needs_prophet()
    code = (
        "from fleetplan.models.predictors import make_predictor\n"
        "p = make_predictor('prophet', prophet_window_size=8)\n"
        "for i in range(12): p.add_data_point(100.0 + (i % 6) * 10)\n"
        "print(p.predict_next())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert float(run.stdout) >= 0.0
    assert "cmdstanpy" not in run.stderr


def test_arima_fits_on_one_blas_thread():
    """The fits run on one BLAS thread whatever the process allows, and the
    process's own setting comes back after. A clean interpreter, because
    `make test` starts pytest with OPENBLAS_NUM_THREADS=1; the process first
    allows two threads, so the check means something on a one-core machine."""
    code = (
        "import json, threadpoolctl\n"
        "import statsmodels.tsa.arima.model as m\n"
        "from fleetplan.models.predictors import make_predictor\n"
        "threadpoolctl.threadpool_limits(2, user_api='blas')\n"
        "def threads(): return sorted({i['num_threads'] for i in threadpoolctl.threadpool_info()"
        " if i['user_api'] == 'blas'})\n"
        "seen, fit = [], m.ARIMA.fit\n"
        "def spy(self, *a, **k):\n"
        "    seen.append(threads())\n"
        "    return fit(self, *a, **k)\n"
        "m.ARIMA.fit = spy\n"
        "p = make_predictor('arima', arima_max_history=12, arima_reselect_every=4)\n"
        "for i in range(14): p.add_data_point(100.0 + (i % 5) * 7)\n"
        "p.predict_next()\n"
        "print(json.dumps({'during': seen, 'after': threads()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True, env=env)
    seen = json.loads(run.stdout)
    assert seen["during"] and all(t == [1] for t in seen["during"])
    assert seen["after"] == [2]


def test_frozen_arima_waits_for_a_window_that_is_not_flat():
    p = fed("arima_frozen", [5.0] * 6, **SMALL_ARIMA)
    assert p.predict_next() == 5.0 and p.order is None
    for v in (6.0, 4.0, 7.0, 5.5, 6.5):
        p.add_data_point(v)
    p.predict_next()
    chosen = p.order
    assert chosen is not None
    for v in NOISE_THEN_RAMP:
        p.add_data_point(v)
    p.predict_next()
    assert p.order == chosen


# The first five 180-s windows of Azure conv x34 with its shape kept (bench/sizing.py
# --rate-scale-shift 30): requests per window, climbing with noise.
CONV_SHIFT30_START = [27960.0, 31937.0, 28674.0, 30706.0, 32479.0]


def test_frozen_arima_differences_only_where_auto_arima_does():
    # auto_arima picks d by pmdarima's KPSS test, whose short lag rule is trunc(4 * (n/100)^0.25)
    # (1 lag on 5 points): these five windows are level-stationary, so Dynamo's ARIMA picks
    # (0,0,0) with a mean, in log1p after the raw (0,d,0), and forecasts about their mean
    # (pmdarima 2.1.1: 30,299). statsmodels' automatic lag count (4 lags on 5 points) called
    # them a unit root and froze a random walk, the constant predictor under another name
    p = fed("arima_frozen", CONV_SHIFT30_START)
    forecast = p.predict_next()
    assert p.order == (0, 0, 0)
    assert forecast == pytest.approx(30_299.0, rel=1e-3)


def test_a_new_kind_can_be_registered_from_its_own_module():
    from fleetplan.models import predictors

    class Doubling(predictors.ConstantPredictor):
        kind = "test_doubling"

        def _forecast(self) -> float:
            return 2.0 * super()._forecast()

    try:
        assert predictors.register_predictor(Doubling) is Doubling
        assert predictors.register_predictor(Doubling) is Doubling  # idempotent
        p = fed("test_doubling", [3.0])
        assert predictor_from_state(p.to_state()).predict_next() == 6.0

        class Impostor(predictors.ConstantPredictor):
            kind = "test_doubling"

        with pytest.raises(ValueError, match="already registered"):
            predictors.register_predictor(Impostor)
    finally:
        predictors._KINDS.pop("test_doubling", None)


def test_arima_after_a_short_warm_up_follows_the_recent_level():
    # Request counts per 3-minute window, Azure conv trace (first 30 min).
    # An order chosen on the first five windows and held for twelve would
    # forecast their mean (~885); re-selection and refitting follow the rise.
    counts = [785.0, 933.0, 851.0, 901.0, 954.0, 867.0, 1045.0, 1147.0, 1216.0, 1409.0]
    assert fed("arima", counts).predict_next() > 1200.0
