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


def test_every_field_survives_the_round_trip(make_fleet):
    """Each field set away from its default comes back as it was (a field that ``to_data`` left
    out or wrote wrong would come back as its default: equal ``to_data`` on both sides, as
    ``test_snapshot_mid_stream_then_continue`` checks, cannot tell)."""
    import dataclasses

    from fleetplan.models.state import DeploymentState, PendingDecision, TrafficWindow, Worker
    from tests.models.factories import T0, fpm

    state = make_fleet().state("d")
    latest = fpm("p0", "prefill", T0 + 1, queued_prefill=7)
    values = {
        "config_version": 3, "min_overrides": {"prefill": 2}, "advisory_override": True,
        "workers": {"p0": Worker("prefill", "ready", 2, T0, discovered=True), "d0": Worker("decode", "starting", 1, T0 + 2)},
        "latest_fpm": {"p0/0": latest}, "window": TrafficWindow(count=4, sum_isl=400.0, second_arrivals={"9": 2}),
        "window_start": T0, "seen_traffic": True, "seen_arrivals": True, "first_traffic": T0 + 0.5,
        "last_kv_hit_rate": 0.25, "last_accept_length": 1.5, "lower_bound": {"prefill": 2, "decode": 1},
        "down_since": {"prefill": T0 + 5}, "measured_floors": [{"prefill": 3, "decode": 1}], "next_decision_id": 7,
        "pending": PendingDecision(6, T0 + 10, {"prefill": 3, "decode": 1}),
        "timed_out": PendingDecision(5, T0 + 9, {"prefill": 4, "decode": 1}),
        "desired": {"prefill": 2, "decode": 1}, "advised": {"prefill": 5, "decode": 2},
        "mix_factor": {"prefill": 0.9}, "scale_up_times": [[5, T0 + 9]], "startup_samples": [90.0],
        "inventory_seen": True, "gone_workers": {"p9": T0 + 4.5}, "arrival_dispersion": 3.5, "dispersion_curve": [[1.0, 3.5], [2.0, 4.0]],
        "buffer": [latest], "max_time": T0 + 11, "next_tick": T0 + 15, "last_tick": T0 + 10, "late_events": 2,
        "traffic_history": [[T0, 180, 10.0, 300.0, 30.0, None, None, 12.0]], "rejected_controls": 4,
        "last_input": T0 + 7.5, "silent_ticks_skipped": 17,
    }
    for name, value in values.items():
        setattr(state, name, value)
    restored = DeploymentState.from_data(orjson.loads(orjson.dumps(state.to_data())))
    opaque = {"deployment", "config", "perf", "forecaster"}  # round-tripped by their own tests
    for f in dataclasses.fields(DeploymentState):
        if f.name in opaque:
            continue
        assert f.name in values, f"{f.name}: give it a value away from its default here"
        assert getattr(restored, f.name) == values[f.name], f.name
