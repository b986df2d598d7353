"""bench/decode_fit.py compares the decode fit's capacity with the simulated engine's own.

docs/forecasting.md rests a verdict on that comparison, so the adapter is
checked where the answer is known: an engine timed by the planner's own
seeded fit (``--engine-timing fit``) has exactly the fit's capacity. The
reach it prints beside the rate (how far the live engines' passes went)
must leave the profile's seed rows out, or it would report the profile's
fullest row as measured.
"""

from __future__ import annotations

import pytest

from bench.decode_fit import EngineTimes, LiveReach, engine_capacity
from fleetplan.models.perf import DecodePerfModel, FpmColumns, seeded_perf_model
from fleetplan.schemas import ForwardPassMetrics
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


def _decode_fpm(seqs: int, kv: int) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        deployment="d", time=1.0, role="decode", worker_id="w0", wall_time=0.02,
        scheduled={"num_decode_requests": seqs, "sum_decode_kv_tokens": kv},
    )


def test_the_live_reach_leaves_the_seed_rows_out(h200):
    reach = LiveReach()
    observers = {name: getattr(DecodePerfModel, name) for name in LiveReach.OBSERVERS}
    with reach.watching():
        model = seeded_perf_model(h200, "decode")
        assert model.max_observed_kv > 0 and (reach.seqs, reach.kv) == (0, 0.0)
        model.observe_batch(FpmColumns.from_fpms([_decode_fpm(40, 50_000), _decode_fpm(120, 30_000)]))
        assert (reach.seqs, reach.kv) == (120, 50_000.0)
        model.observe(_decode_fpm(130, 10_000))
        assert (reach.seqs, reach.kv) == (130, 50_000.0)
    assert {name: getattr(DecodePerfModel, name) for name in LiveReach.OBSERVERS} == observers
    model.observe(_decode_fpm(200, 90_000))  # after the block: not counted
    assert (reach.seqs, reach.kv) == (130, 50_000.0)
