"""Perf model state: plain JSON data, restored exactly, cache included."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.perf import (
    EngineLimits,
    RegressionSettings,
    perf_model_for,
    perf_model_from_state,
    seeded_perf_model,
)
from fleetplan.schemas import ForwardPassMetrics
from fleetplan.sim.profiles import load_profile


def fpm(role, wall, pn, pt, dn, dk, qp=0, qk=0) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        deployment="d", time=1.0, role=role, worker_id="w", wall_time=wall,
        scheduled={"num_prefill_requests": pn, "sum_prefill_tokens": pt,
                   "num_decode_requests": dn, "sum_decode_kv_tokens": dk},
        queued={"sum_prefill_tokens": qp, "sum_decode_kv_tokens": qk},
    )


rows = st.lists(
    st.tuples(
        st.sampled_from([0.0]) | st.floats(1e-4, 0.5),
        st.integers(0, 8), st.integers(0, 16_384), st.integers(0, 300), st.integers(0, 900_000),
    ),
    max_size=100,
)


def probes(model, role):
    engine = fpm(role, 0.0, 1, 100, 30, 90_000, qp=12_345, qk=4_321)
    out = [model.ready, model.num_samples]
    if role in ("prefill", "agg"):
        out += [model.estimate_ttft_ms(engine, 0.3), model.estimate_ttft_ms(engine, None, 1.5)]
    if role in ("decode", "agg"):
        out += [model.estimate_itl_ms(engine, 1.5), model.estimate_itl_ms(engine, None, 2.0)]
    out.append(model.capacity_rps(2000, 200, ttft_ms=300.0, itl_ms=30.0, kv_hit_rate=0.2))
    return out


@pytest.mark.parametrize("role", ["prefill", "decode", "agg"])
@settings(max_examples=30, deadline=None)
@given(before=rows, after=rows, fit_first=st.booleans())
def test_round_trip_is_exact(role, before, after, fit_first):
    model = perf_model_for(role, EngineLimits(max_kv_tokens=945_029), RegressionSettings())
    for r in before:
        model.observe(fpm(role, *r))
    if fit_first:
        model.fit()  # the state then carries the cached coefficients
    state = model.to_state()
    wire = json.loads(json.dumps(state, allow_nan=False))
    restored = perf_model_from_state(wire)
    assert restored.to_state() == state
    assert restored.fit() == model.fit()
    assert probes(restored, role) == probes(model, role)
    # a state without the cache refits to the same coefficients
    stripped = copy.deepcopy(wire)
    stripped["regression"]["fit"] = None
    assert perf_model_from_state(stripped).fit() == model.fit()
    # and both keep evolving identically
    for r in after:
        model.observe(fpm(role, *r))
        restored.observe(fpm(role, *r))
    assert restored.to_state() == model.to_state()
    assert probes(restored, role) == probes(model, role)


def test_seeded_models_round_trip():
    profile = load_profile("h200-llama3.1-8b")
    for role in ("prefill", "decode", "agg"):
        model = seeded_perf_model(profile, role)
        model.fit()
        restored = perf_model_from_state(json.loads(json.dumps(model.to_state())))
        assert restored.to_state() == model.to_state()
        assert restored.capacity_rps(3000, 150, 200.0, 50.0) == model.capacity_rps(3000, 150, 200.0, 50.0)


def test_state_of_another_role_is_refused():
    state = perf_model_for("decode").to_state()
    with pytest.raises(ValueError, match="decode"):
        type(perf_model_for("prefill")).from_state(state)
