"""Every state object round-trips exactly, and the restored state decides the same."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.fleet import Fleet
from tests.models.test_sequencer import SCENARIO


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=1, max_value=len(SCENARIO) - 1), st.sampled_from(["constant", "kalman", "arima", "ensemble"]),
       st.sampled_from(["reference", "fleetplan"]), st.booleans())
def test_snapshot_mid_stream_then_continue(make_fleet, cut, predictor, sizing, throughput):
    extra = {"load_scale_down_stabilization_seconds": None, "load_max_scale_up_step": 8} if sizing == "fleetplan" else {}
    # without the throughput loop, fleetplan's load loop keeps the measured traffic's floor
    extra["enable_throughput_scaling"] = throughput
    straight = make_fleet(enable_load_scaling=True, load_predictor=predictor, sizing=sizing, **extra)
    expected = [o.to_dict() for o in straight.run(SCENARIO)]

    first = make_fleet(enable_load_scaling=True, load_predictor=predictor, sizing=sizing, **extra)
    got = [o.to_dict() for o in (x for e in SCENARIO[:cut] for x in first.feed(e))]
    blob = orjson.dumps(first.to_data())  # what a changelog table stores
    restored = Fleet(first.planner)
    restored.load_data(orjson.loads(blob))
    assert orjson.dumps(restored.to_data()) == blob
    got += [o.to_dict() for o in (x for e in SCENARIO[cut:] for x in restored.feed(e))]
    got += [o.to_dict() for o in restored.finish()]
    assert got == expected
