"""The quadratic prefill time model: closer to the profile, physical, exact state."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.perf import RegressionSettings, seeded_perf_model
from fleetplan.models.perf.fit import LinearFit, QuadraticFit, fit_quadratic
from fleetplan.models.perf.roles import perf_model_from_state
from fleetplan.models.perf_models import make_perf_models
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.runner import SimOptions, make_setup

TOKENS = (440, 1000, 2000, 4000, 8000)


@pytest.mark.parametrize("name", ["h100-llama3.3-70b", "h200-llama3.1-8b"])
def test_the_curve_follows_the_profile_where_the_line_cannot(name):
    profile = load_profile(name)
    cfg = config_from_dict({})
    truth = make_setup(cfg, profile, SimOptions()).timing.prefill_s  # interpolates the profile
    curve = seeded_perf_model(profile, "prefill", settings=RegressionSettings(prefill_quadratic=True)).fit()
    line = seeded_perf_model(profile, "prefill").fit()
    assert isinstance(curve, QuadraticFit) and type(line) is LinearFit
    curve_err = max(abs(curve.predict(t) / truth(t) - 1) for t in TOKENS)
    line_err = max(abs(line.predict(t) / truth(t) - 1) for t in TOKENS)
    assert curve_err < 0.15 < line_err


def test_the_curve_never_gets_faster_with_more_tokens():
    rng = np.random.default_rng(3)
    t = rng.uniform(100, 16_000, 200)
    y = 0.02 + 2e-5 * t + rng.normal(0, 0.01, 200)  # noisy, possibly concave-looking samples
    fit = fit_quadratic(t, y)
    assert min(fit.coef) >= 0.0
    grid = np.linspace(0, 20_000, 101)
    assert np.all(np.diff(fit.predict_many(grid)) >= 0)
    assert fit.predict(5000.0) == fit.predict_many(np.array([5000.0]))[0]


def test_quadratic_state_round_trips_exactly():
    cfg = config_from_dict({})
    model = make_perf_models(cfg, load_profile("h100-llama3.3-70b"))["prefill"]
    fit = model.fit()
    again = perf_model_from_state(orjson.loads(orjson.dumps(model.to_state())))
    assert again.fit() == fit and isinstance(again.fit(), QuadraticFit)
    assert again.to_state() == model.to_state()
    assert LinearFit.from_state(fit.to_state()) == fit


def test_the_config_chooses_and_dynamos_sizing_keeps_the_line():
    profile = load_profile("h100-llama3.3-70b")
    ours = make_perf_models(config_from_dict({}), profile)["prefill"].fit()
    dynamo = make_perf_models(config_from_dict(dict(REFERENCE_SIZING)), profile)["prefill"].fit()
    assert isinstance(ours, QuadraticFit) and type(dynamo) is LinearFit
