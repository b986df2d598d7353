"""Observing FPMs: readiness, heartbeats, moving averages, lazy refit, batching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.perf import (
    AggPerfModel,
    DecodePerfModel,
    FpmColumns,
    MovingAverage,
    PrefillPerfModel,
    perf_model_for,
)
from fleetplan.schemas import ForwardPassMetrics


def fpm(role="prefill", wall=0.02, **scheduled) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        deployment="d", time=1.0, role=role, worker_id="w0", wall_time=wall, scheduled=scheduled
    )


def test_ready_after_load_min_observations():
    model = PrefillPerfModel()
    for i in range(4):
        model.observe(fpm(wall=0.01 * (i + 1), num_prefill_requests=1, sum_prefill_tokens=1000 * (i + 1)))
    assert not model.ready
    assert model.fit() is None
    assert model.estimate_ttft_ms(fpm()) is None
    assert model.capacity_rps(3000) is None
    model.observe(fpm(wall=0.05, num_prefill_requests=1, sum_prefill_tokens=5000))
    assert model.ready
    assert model.fit() is not None


def test_heartbeats_move_averages_only():
    model = PrefillPerfModel()
    model.observe(fpm(wall=0.0, num_prefill_requests=2, sum_prefill_tokens=3000))
    assert model.num_samples == 0
    assert model.avg_isl == 1500.0


def test_wrong_role_is_refused():
    with pytest.raises(ValueError, match="decode model got an FPM of role prefill"):
        DecodePerfModel().observe(fpm())


def test_moving_average_skips_leading_zeros_and_keeps_a_window():
    avg = MovingAverage(64)
    for v in (0.0, 0.0, 4.0, 0.0):
        avg.add(v)
    assert avg.value == 2.0
    avg = MovingAverage(64)
    avg.extend(float(v) for v in range(1, 101))
    assert avg.value == sum(range(37, 101)) / 64
    assert MovingAverage(64).value == 0.0


def test_decode_averages():
    model = DecodePerfModel()
    model.observe(fpm("decode", wall=0.0))  # idle before any traffic: skipped
    model.observe(fpm("decode", wall=0.01, num_decode_requests=4, sum_decode_kv_tokens=4000))
    model.observe(fpm("decode", wall=0.0))  # idle after traffic: counts as zero requests
    assert model.avg_decode_len == 1000.0
    assert model.avg_num_decode == 2.0
    assert model.max_observed_kv == 4000.0


def test_agg_averages_learn_the_prefill_mix():
    model = AggPerfModel()
    model.observe(fpm("agg", wall=0.03, num_prefill_requests=1, sum_prefill_tokens=2000,
                      num_decode_requests=10, sum_decode_kv_tokens=20000))
    model.observe(fpm("agg", wall=0.02, num_decode_requests=10, sum_decode_kv_tokens=20010))
    assert model.avg_isl == 2000.0
    assert model.avg_prefill_tokens == 1000.0
    assert model.avg_decode_len == pytest.approx(2000.5)


def test_fit_is_cached_until_samples_change():
    model = PrefillPerfModel()
    for i in range(6):
        model.observe(fpm(wall=0.01 * (i + 1), num_prefill_requests=1, sum_prefill_tokens=1000 * i))
    first = model.fit()
    assert model.fit() is first
    model.observe(fpm(wall=0.0, num_prefill_requests=1, sum_prefill_tokens=10))  # heartbeat
    assert model.fit() is first
    model.observe(fpm(wall=0.2, num_prefill_requests=1, sum_prefill_tokens=9000))
    assert model.fit() is not first


counts = st.integers(0, 300)
tokens = st.integers(0, 900_000)


@st.composite
def fpm_lists(draw, role):
    n = draw(st.integers(0, 90))
    rows = []
    for _ in range(n):
        wall = draw(st.sampled_from([0.0]) | st.floats(1e-4, 0.5))
        rows.append(
            fpm(
                role,
                wall=wall,
                num_prefill_requests=draw(counts),
                sum_prefill_tokens=draw(st.integers(0, 16_384)),
                num_decode_requests=draw(counts),
                sum_decode_kv_tokens=draw(tokens),
            )
        )
    return rows


@pytest.mark.parametrize("role", ["prefill", "decode", "agg"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_observe_batch_equals_observe_one_by_one(role, data):
    fpms = data.draw(fpm_lists(role))
    cuts = data.draw(st.lists(st.integers(0, len(fpms)), max_size=5))
    one_by_one = perf_model_for(role)
    for f in fpms:
        one_by_one.observe(f)
    batched = perf_model_for(role)
    edges = sorted({0, len(fpms), *cuts})
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        batched.observe_batch(FpmColumns.from_fpms(fpms[a:b]))
    assert batched.to_state() == one_by_one.to_state()
    assert batched.fit() == one_by_one.fit()


def test_fpm_columns_validate():
    with pytest.raises(ValueError, match="rows"):
        FpmColumns([0.1, 0.2], [1], [1], [1], [1])
    with pytest.raises(ValueError, match="non-negative"):
        FpmColumns([-0.1], [1], [1], [1], [1])
    assert len(FpmColumns.empty()) == 0
    assert len(FpmColumns.from_fpms([])) == 0
