"""Per-engine TTFT/ITL estimates against hand-computed values (Dynamo's ``core/perf_model/`` semantics).

Each model is trained on exact samples of a known line, with a sample at the
origin so the fastest pass equals the intercept and the floor never binds;
its averages are then pinned with 64 heartbeats (heartbeats move only the
averages, and 64 fill the window).
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetplan.models.perf import AggPerfModel, DecodePerfModel, EngineLimits, PrefillPerfModel
from fleetplan.schemas import ForwardPassMetrics


def fpm(role, wall=0.0, queued=None, **scheduled) -> ForwardPassMetrics:
    return ForwardPassMetrics(
        deployment="d", time=1.0, role=role, worker_id="w0", wall_time=wall,
        scheduled=scheduled, queued=queued or {},
    )


@pytest.fixture
def prefill() -> PrefillPerfModel:
    # t = 0.01 + 1e-5·tokens; avg_isl 2000
    model = PrefillPerfModel(EngineLimits(max_num_batched_tokens=8192))
    for x in range(0, 9000, 1000):
        model.observe(fpm("prefill", 0.01 + 1e-5 * x, num_prefill_requests=1, sum_prefill_tokens=x))
    for _ in range(64):
        model.observe(fpm("prefill", num_prefill_requests=1, sum_prefill_tokens=2000))
    return model


@pytest.fixture
def decode() -> DecodePerfModel:
    # t = 0.005 + 1e-4·requests + 1e-8·kv; avg_decode_len 500, avg_num_decode 10
    model = DecodePerfModel()
    for n in (0, 50, 100, 200):
        for kv in (0, 100_000, 400_000):
            model.observe(fpm("decode", 0.005 + 1e-4 * n + 1e-8 * kv,
                              num_decode_requests=n, sum_decode_kv_tokens=kv))
    for _ in range(64):
        model.observe(fpm("decode", num_decode_requests=10, sum_decode_kv_tokens=5000))
    return model


@pytest.fixture
def agg() -> AggPerfModel:
    # t = 0.01 + 1e-5·prefill + 1e-8·kv; avg_isl 1000, avg_decode_len 500, avg_prefill 1000
    model = AggPerfModel(EngineLimits(max_num_batched_tokens=8192))
    for p in (0, 2000, 8000):
        for kv in (0, 100_000, 400_000):
            model.observe(fpm("agg", 0.01 + 1e-5 * p + 1e-8 * kv, num_prefill_requests=int(p > 0),
                              sum_prefill_tokens=p, num_decode_requests=1, sum_decode_kv_tokens=kv))
    for _ in range(64):
        model.observe(fpm("agg", num_prefill_requests=1, sum_prefill_tokens=1000,
                          num_decode_requests=10, sum_decode_kv_tokens=5000))
    return model


def test_prefill_ttft_chunks_queue_plus_average_prompt(prefill):
    # 20000 queued + 2000 = 22000 tokens: 2 chunks of 8192 and a tail of 5616
    # 2·(0.01 + 0.08192) + (0.01 + 0.05616) = 0.25 s
    engine = fpm("prefill", queued={"sum_prefill_tokens": 20000})
    assert prefill.estimate_ttft_ms(engine) == pytest.approx(250.0)


def test_prefill_ttft_kv_hit_discount_and_clamp(prefill):
    engine = fpm("prefill", queued={"sum_prefill_tokens": 20000})
    # the raw queue halved, the prompt's own 2000 fresh tokens kept:
    # 12000 = 8192 + 3808 -> 0.09192 + 0.04808
    assert prefill.estimate_ttft_ms(engine, kv_hit_rate=0.5) == pytest.approx(140.0)
    # 0.99 is clamped to 0.95: 20000·0.05 + 2000 = 3000 tokens -> 0.04 s
    assert prefill.estimate_ttft_ms(engine, kv_hit_rate=0.99) == pytest.approx(40.0)
    assert prefill.estimate_ttft_ms(engine, kv_hit_rate=-1.0) == pytest.approx(250.0)
    assert prefill.estimate_ttft_ms(engine, kv_hit_rate=float("nan")) == pytest.approx(250.0)


def test_prefill_ttft_does_not_discount_the_prompts_own_fresh_tokens_twice(prefill):
    """``avg_isl`` is learned from scheduled passes' fresh tokens (cache hits already
    out); with the hit rate applied to it again, an idle engine at a 0.5 hit rate
    estimated a 2,000-token prompt as 1,000: 20 ms where its pass takes 30."""
    idle = fpm("prefill")
    assert prefill.estimate_ttft_ms(idle, kv_hit_rate=0.5) == pytest.approx(30.0)
    assert prefill.estimate_ttft_ms(idle, kv_hit_rate=0.5) == prefill.estimate_ttft_ms(idle)


def test_prefill_ttft_queue_scale(prefill):
    engine = fpm("prefill", queued={"sum_prefill_tokens": 20000})
    # own time: the average prompt alone, 2000 tokens
    assert prefill.estimate_ttft_ms(engine, queue_scale=0.0) == pytest.approx(30.0)
    # consolidation 2→... ×1.5: 30000 + 2000 = 3·8192 + 7424 -> 3·0.09192 + 0.08424
    assert prefill.estimate_ttft_ms(engine, queue_scale=1.5) == pytest.approx(360.0)


def test_prefill_ttft_many_matches_scalar_bit_for_bit(prefill):
    queues = np.array([0, 1, 8191, 8192, 20000, 123457], dtype=np.float64)
    for kv, scale in ((None, 1.0), (0.3, 1.0), (0.5, 4 / 3), (0.99, 0.0)):
        many = prefill.estimate_ttft_ms_many(queues, kv, scale)
        scalar = [
            prefill.estimate_ttft_ms(fpm("prefill", queued={"sum_prefill_tokens": int(q)}), kv, scale)
            for q in queues
        ]
        assert many.tolist() == scalar


def test_decode_itl_adds_one_average_request(decode):
    engine = fpm("decode", num_decode_requests=30, sum_decode_kv_tokens=100_000,
                 queued={"sum_decode_kv_tokens": 20_000})
    # t(10 + 1, 120000 + 500) = 0.005 + 0.0011 + 0.001205
    assert decode.estimate_itl_ms(engine) == pytest.approx(7.305)
    assert decode.estimate_itl_ms(engine, accept_length=2.0) == pytest.approx(7.305 / 2)
    assert decode.estimate_itl_ms(engine, accept_length=0.5) == pytest.approx(7.305)
    # consolidation ×2 scales the KV load only: t(11, 240000 + 500)
    assert decode.estimate_itl_ms(engine, load_scale=2.0) == pytest.approx(8.505)


def test_decode_itl_many_matches_scalar(decode):
    loads = [(0, 0), (100_000, 20_000), (333_333, 1)]
    many = decode.estimate_itl_ms_many(np.array([s + q for s, q in loads], dtype=float), 1.7, 1.25)
    scalar = [
        decode.estimate_itl_ms(
            fpm("decode", sum_decode_kv_tokens=s, queued={"sum_decode_kv_tokens": q}), 1.7, 1.25
        )
        for s, q in loads
    ]
    assert many.tolist() == scalar


def test_agg_ttft_piggybacks_current_decode_kv(agg):
    engine = fpm("agg", sum_decode_kv_tokens=100_000, queued={"sum_prefill_tokens": 10_000})
    # 11000 tokens = 8192 + 2808, each chunk with 100000 decode KV (+0.001 s)
    assert agg.estimate_ttft_ms(engine) == pytest.approx(132.0)
    # own time at a doubled decode KV: 1000 tokens -> 0.01 + 0.01 + 0.002
    assert agg.estimate_ttft_ms(engine, queue_scale=0.0, decode_scale=2.0) == pytest.approx(22.0)
    many = agg.estimate_ttft_ms_many(np.array([10_000.0]), np.array([100_000.0]))
    assert many.tolist() == [agg.estimate_ttft_ms(engine)]


def test_agg_ttft_discounts_only_the_raw_queue_by_the_hit_rate(agg):
    """As prefill's: the queue's raw 10,000 halved, the prompt's own 1,000 fresh tokens kept."""
    engine = fpm("agg", sum_decode_kv_tokens=100_000, queued={"sum_prefill_tokens": 10_000})
    # 6000 tokens in one chunk with 100000 decode KV: 0.01 + 0.06 + 0.001
    assert agg.estimate_ttft_ms(engine, kv_hit_rate=0.5) == pytest.approx(71.0)
    many = agg.estimate_ttft_ms_many(np.array([10_000.0]), np.array([100_000.0]), 0.5)
    assert many.tolist() == [agg.estimate_ttft_ms(engine, kv_hit_rate=0.5)]


def test_agg_itl_uses_learned_prefill_mix(agg):
    engine = fpm("agg", sum_decode_kv_tokens=100_000,
                 queued={"sum_prefill_tokens": 10_000, "sum_decode_kv_tokens": 0})
    # t(avg_prefill 1000, 100000 + 500) = 0.01 + 0.01 + 0.001005
    assert agg.estimate_itl_ms(engine) == pytest.approx(21.005)
    assert agg.estimate_itl_ms(engine, include_queued_prefill=True) == pytest.approx(21.105)
    assert agg.estimate_itl_ms(engine, accept_length=3.0) == pytest.approx(21.005 / 3)
    many = agg.estimate_itl_ms_many(np.array([100_000.0]))
    assert many.tolist() == [agg.estimate_itl_ms(engine)]


def test_itl_floors_are_one_average_request_alone(decode, agg):
    # decode: t(1 request, avg_decode_len 500) = 0.005 + 1e-4 + 5e-6; agg: no prompt riding along,
    # t(0 prefill, 500) = 0.01 + 5e-6; both divided by the accept length
    assert decode.estimate_itl_floor_ms() == pytest.approx(5.105)
    assert agg.estimate_itl_floor_ms() == pytest.approx(10.005)
    assert agg.estimate_itl_floor_ms(2.0) == pytest.approx(10.005 / 2)


def test_estimates_none_until_ready():
    assert PrefillPerfModel().estimate_ttft_ms(fpm("prefill")) is None
    assert PrefillPerfModel().estimate_ttft_ms_many(np.zeros(3)) is None
    assert DecodePerfModel().estimate_itl_ms(fpm("decode")) is None
    assert AggPerfModel().estimate_itl_ms(fpm("agg")) is None
    assert AggPerfModel().estimate_ttft_ms(fpm("agg")) is None
