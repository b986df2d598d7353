"""The H200 Llama-3.1-8B profile reproduces the reference figures (docs/perf-model.md, "Reference figures").

Reference, from running Dynamo's Python core on the shipped NPZ:
legacy regressions give prefill ``wt ≈ 2.21e-5·tokens − 0.0016 s``, prefill
capacity 15.4 rps/engine at ISL 3000 (TTFT 65 ms), decode 51.1 rps at ITL 50 ms
(ISL 3000 / OSL 150, ITL 40 ms), est TTFT behind a 20k-token queue 0.62 s;
AIC core's fallback regression gives prefill 16.9 rps (33.7 with kv_hit 0.5)
and decisions 2P/1D (1P/1D with kv_hit 0.5) at 20 rps.

Our fit keeps Dynamo's free intercept, so it is the legacy OLS exactly
(both slopes come out positive) and matches the legacy figures to the digit.
The AIC-core figures come from a different regression that is not public;
we match its decisions and its kv-hit ratio, not its absolute level.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from fleetplan.models.perf import RegressionSettings, seeded_perf_model
from fleetplan.schemas import ForwardPassMetrics
from fleetplan.sim.profiles import load_profile


@pytest.fixture(scope="module")
def profile():
    return load_profile("h200-llama3.1-8b")


def test_prefill_fit_is_dynamos_legacy_line(profile):
    fit = seeded_perf_model(profile, "prefill").fit()
    assert fit.coef[0] == pytest.approx(2.21e-5, abs=0.01e-5)
    assert fit.intercept == pytest.approx(-0.0016, abs=0.0001)


def test_prefill_capacity_at_isl_3000(profile):
    cap = seeded_perf_model(profile, "prefill").capacity_rps(3000, 150, ttft_ms=200.0)
    # 15.44 rps, TTFT 64.7 ms, batch 1 (batch 2 gives 15.26 rps)
    assert 15.4 <= cap.rps <= 16.9
    assert cap.rps == pytest.approx(15.44, abs=0.01)
    assert cap.ttft_ms == pytest.approx(65.0, abs=0.5)
    assert cap.batch == 1 and cap.meets_sla


def test_prefill_capacity_with_kv_hit_half(profile):
    model = seeded_perf_model(profile, "prefill")
    half = model.capacity_rps(3000, 150, ttft_ms=200.0, kv_hit_rate=0.5)
    full = model.capacity_rps(3000, 150, ttft_ms=200.0)
    # 31.67 rps against AIC core's 33.7: the 6% gap is the 9% gap of the
    # kv_hit=0 level (15.44 vs 16.9); the kv-hit gain matches (2.05× vs 1.99×).
    assert half.rps == pytest.approx(33.7, rel=0.07)
    assert half.rps / full.rps == pytest.approx(33.7 / 16.9, rel=0.04)


def test_decode_capacity_at_itl_50(profile):
    model = seeded_perf_model(profile, "decode")
    # The reference run had no max_num_seqs cap, so the KV cache binds:
    # 945029 // (3000 + 150//2) = 307 streams at ITL 40.0 ms -> 51.1 rps.
    model.limits = dataclasses.replace(model.limits, max_num_seqs=1024)
    cap = model.capacity_rps(3000, 150, itl_ms=50.0)
    assert cap.batch == 307
    assert cap.rps == pytest.approx(51.1, abs=0.05)
    assert cap.itl_ms == pytest.approx(40.0, abs=0.1)
    # vLLM's default max_num_seqs=256 caps it below: 49.6 rps at ITL 34.4 ms.
    model.limits = dataclasses.replace(model.limits, max_num_seqs=256)
    capped = model.capacity_rps(3000, 150, itl_ms=50.0)
    assert capped.batch == 256
    assert capped.rps == pytest.approx(49.6, abs=0.05)


def test_throughput_decisions_at_20_rps(profile):
    prefill = seeded_perf_model(profile, "prefill")
    decode = seeded_perf_model(profile, "decode")
    d_rps = decode.capacity_rps(3000, 150, itl_ms=50.0).rps
    assert math.ceil(20 / prefill.capacity_rps(3000, 150, ttft_ms=200.0).rps) == 2
    assert math.ceil(20 / d_rps) == 1
    assert math.ceil(20 / prefill.capacity_rps(3000, 150, ttft_ms=200.0, kv_hit_rate=0.5).rps) == 1


def test_estimated_ttft_behind_20k_queue(profile):
    model = seeded_perf_model(profile, "prefill")
    # avg_isl is the profile's mean ISL (8236) until traffic replaces it:
    # 28236 tokens = 3·8192 + 3660 -> 0.618 s
    assert model.avg_isl == 8236.0
    engine = ForwardPassMetrics(
        deployment="d", time=0.0, role="prefill", worker_id="p0", queued={"sum_prefill_tokens": 20_000}
    )
    assert model.estimate_ttft_ms(engine) / 1000 == pytest.approx(0.62, abs=0.005)


def test_agg_model_from_the_same_profile_is_sane(profile):
    cap = seeded_perf_model(profile, "agg").capacity_rps(3000, 150, ttft_ms=200.0, itl_ms=50.0)
    assert cap.meets_sla
    # an agg engine trades prefill and decode: below the decode-only engine's rate
    assert 1.0 < cap.rps < 51.1


def test_pinned_intercept_alternative_costs_two_percent(profile):
    settings = RegressionSettings(nonnegative_intercept=True)
    cap = seeded_perf_model(profile, "prefill", settings=settings).capacity_rps(3000, 150, 200.0)
    assert cap.rps == pytest.approx(15.17, abs=0.01)  # the line through the origin


def test_floor_keeps_small_prompts_sane_on_a_convex_profile():
    # H100 70B TP2: the free-intercept line crosses zero at 579 tokens. Without
    # the floor a 500-token effective prompt would "take 1 µs" (~1e6 rps).
    model = seeded_perf_model(load_profile("h100-llama3.3-70b"), "prefill")
    assert model.fit().intercept < 0
    assert model.fit().floor == pytest.approx(0.032460879)  # its fastest profiled pass
    cap = model.capacity_rps(1000, 150, ttft_ms=2000.0, kv_hit_rate=0.5)
    assert cap.rps < 100
