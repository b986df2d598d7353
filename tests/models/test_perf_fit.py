"""Non-negative linear fits: hand-computed solutions, the free intercept, the floor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.perf import MIN_WALL_TIME_S, LinearFit, fit_nonnegative


def test_exact_line_is_recovered():
    fit = fit_nonnegative(np.array([[0.0], [1.0], [2.0]]), np.array([1.0, 3.0, 5.0]))
    assert fit.intercept == pytest.approx(1.0)
    assert fit.coef == pytest.approx((2.0,))


def test_negative_slope_is_clipped_to_zero_and_intercept_is_the_mean():
    fit = fit_nonnegative(np.array([[0.0], [1.0], [2.0]]), np.array([3.0, 2.0, 1.0]))
    assert fit.coef == (0.0,)
    assert fit.intercept == pytest.approx(2.0)


def test_2d_negative_coefficient_clipped_other_refitted():
    # y = 1 + 2a - 0.5b on a balanced design: with b's slope held at 0 the
    # best fit is slope 2 on a and intercept mean(y) - 2·mean(a) = 0.75.
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = 1 + 2 * x[:, 0] - 0.5 * x[:, 1]
    fit = fit_nonnegative(x, y)
    assert fit.coef == pytest.approx((2.0, 0.0))
    assert fit.intercept == pytest.approx(0.75)


def test_free_intercept_may_be_negative_like_dynamo():
    # Convex data (quadratic): the best line has a negative intercept, as the
    # H200 prefill profile does (OLS: 2.21e-5·tokens - 1.6 ms).
    x = np.arange(1.0, 6.0).reshape(-1, 1)
    y = x[:, 0] ** 2
    fit = fit_nonnegative(x, y)
    ols = np.polyfit(x[:, 0], y, 1)
    assert fit.coef[0] == pytest.approx(ols[0])
    assert fit.intercept == pytest.approx(ols[1])
    assert fit.intercept < 0


def test_nonnegative_intercept_option_pins_intercept():
    x = np.arange(1.0, 6.0).reshape(-1, 1)
    y = x[:, 0] ** 2
    fit = fit_nonnegative(x, y, nonnegative_intercept=True)
    assert fit.intercept == 0.0
    assert fit.coef[0] == pytest.approx(float((x[:, 0] @ y) / (x[:, 0] @ x[:, 0])))


def test_constant_feature_gets_zero_slope():
    fit = fit_nonnegative(np.array([[5.0], [5.0], [5.0]]), np.array([1.0, 2.0, 3.0]))
    assert fit.coef == (0.0,)
    assert fit.intercept == pytest.approx(2.0)


def test_prediction_floor_is_fastest_sample():
    fit = fit_nonnegative(np.array([[100.0], [200.0], [300.0]]), np.array([0.010, 0.020, 0.030]))
    assert fit.floor == 0.010
    assert fit.predict(0.0) == 0.010
    assert fit.predict(50.0) == 0.010
    assert fit.predict(200.0) == pytest.approx(0.020)


def test_prediction_never_below_1e6():
    fit = LinearFit(-1.0, (1.0,))
    assert fit.predict(0.0) == MIN_WALL_TIME_S
    tiny = fit_nonnegative(np.array([[1.0], [2.0], [3.0]]), np.array([1e-9, 2e-9, 3e-9]))
    assert tiny.floor == MIN_WALL_TIME_S
    assert tiny.predict(0.0) == MIN_WALL_TIME_S


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1e-4, 1.0),
        ),
        min_size=2,
        max_size=40,
    ),
    st.booleans(),
)
def test_fit_is_nonnegative_and_predictions_bounded(rows, pinned):
    x = np.array([[a, b] for a, b, _ in rows])
    y = np.array([w for _, _, w in rows])
    fit = fit_nonnegative(x, y, nonnegative_intercept=pinned)
    assert all(c >= 0.0 for c in fit.coef)
    if pinned:
        assert fit.intercept >= 0.0
    predictions = fit.predict_many(x[:, 0], x[:, 1])
    assert (predictions >= fit.floor).all()
    assert fit.floor >= MIN_WALL_TIME_S
    # scalar and vector paths agree bit for bit
    for (a, b), p in zip(x.tolist(), predictions.tolist(), strict=True):
        assert fit.predict(a, b) == p


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e5), st.floats(1e-4, 1.0)), min_size=3, max_size=30))
def test_constrained_fit_is_no_worse_than_any_nonnegative_slope(rows):
    x = np.array([[a] for a, _ in rows])
    y = np.array([w for _, w in rows])
    fit = fit_nonnegative(x, y)

    def sse(slope: float, intercept: float) -> float:
        return float(((intercept + slope * x[:, 0] - y) ** 2).sum())

    best = sse(fit.coef[0], fit.intercept)
    for slope in (0.0, fit.coef[0] * 0.9, fit.coef[0] * 1.1 + 1e-9):
        intercept = float(y.mean() - slope * x[:, 0].mean())
        assert best <= sse(slope, intercept) * (1 + 1e-9) + 1e-15
