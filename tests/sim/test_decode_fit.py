"""bench/decode_fit.py compares the decode fit's capacity with the simulated engine's own.

docs/forecasting.md rests a verdict on that comparison, so the adapter is
checked where the answer is known: an engine timed by the planner's own
seeded fit (``--engine-timing fit``) has exactly the fit's capacity.
"""

from __future__ import annotations

import pytest

from bench.decode_fit import EngineTimes, engine_capacity
from fleetplan.models.perf import seeded_perf_model
from fleetplan.sim.timing import engine_timing


@pytest.mark.parametrize("isl,osl", [(1200, 230), (300, 40), (4000, 900)])
def test_an_engine_timed_by_the_fit_has_the_fits_capacity(h200, isl, osl):
    model = seeded_perf_model(h200, "decode")
    times = EngineTimes(engine_timing(h200, "fit"))
    own = engine_capacity(model, times, isl, osl, 50.0)
    fitted = model.capacity_rps(isl, osl, itl_ms=50.0)
    assert (own.batch, own.at_limit) == (fitted.batch, fitted.at_limit)
    assert own.rps == pytest.approx(fitted.rps, rel=1e-12)


def test_the_interpolated_engine_is_another_engine(h200):
    model = seeded_perf_model(h200, "decode")
    own = engine_capacity(model, EngineTimes(engine_timing(h200, "interp")), 1200, 230, 50.0)
    fitted = model.capacity_rps(1200, 230, itl_ms=50.0)
    assert own.rps > 0 and own.rps != fitted.rps
