"""A simulated engine reproduces its profile (the calibration claim, as tests)."""

from __future__ import annotations

import math

import pytest

from fleetplan.sim.engines import SimRequest
from fleetplan.sim.timing import engine_timing
from tests.sim.sim_helpers import run_all


def test_pass_times_hit_every_measured_point(h200, timing):
    for isl, ttft in zip(h200.prefill_isl.tolist(), h200.prefill_ttft_ms.tolist(), strict=True):
        assert timing.prefill_s(isl) * 1000 == pytest.approx(ttft, rel=1e-9)
    max_kv = h200.max_kv_tokens
    for u, ctx, itl in zip(h200.x_kv_usage.tolist(), h200.y_context_length.tolist(), h200.z_itl_ms.tolist(), strict=True):
        kv = u * max_kv
        seqs = kv / ctx
        # the interpolant is exact where a batch of whole sequences sits on a measured point
        if seqs >= 1 and abs(seqs - round(seqs)) < 1e-9:
            assert timing.decode_s(round(seqs), kv) * 1000 == pytest.approx(itl, rel=1e-9)


def test_decode_time_grows_with_batch_and_context(timing):
    assert timing.decode_s(1, 1000) < timing.decode_s(64, 64 * 1000) < timing.decode_s(128, 128 * 1000)
    assert timing.decode_s(64, 64 * 500) <= timing.decode_s(64, 64 * 8000)


@pytest.mark.parametrize("isl", [100, 1117, 3151, 6202, 8192])
def test_lone_prompt_ttft_is_the_profile_ttft(make_engine, h200, timing, isl):
    engine, clock, rec = make_engine("prefill")
    engine.enqueue(SimRequest(0, 0.0, isl, 10))
    run_all(clock)
    (_, done), = rec.prompts
    assert done == pytest.approx(timing.prefill_s(isl))
    points = dict(zip(h200.prefill_isl.tolist(), h200.prefill_ttft_ms.tolist(), strict=True))
    if isl in points:
        assert done * 1000 == pytest.approx(points[isl], rel=1e-9)


@pytest.mark.parametrize("isl", [8236, 10270, 12304, 16372])
def test_long_prompts_are_chunked_and_stay_within_10_percent(make_engine, h200, isl):
    engine, clock, rec = make_engine("prefill")
    engine.enqueue(SimRequest(0, 0.0, isl, 10))
    run_all(clock)
    assert engine.iterations == math.ceil(isl / 8192)
    measured = dict(zip(h200.prefill_isl.tolist(), h200.prefill_ttft_ms.tolist(), strict=True))[isl]
    assert rec.prompts[0][1] * 1000 == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("batch,ctx", [(1, 350), (16, 2997), (64, 2997), (128, 5644), (40, 10938)])
def test_decode_itl_matches_the_pass_time_of_its_batch(make_engine, timing, batch, ctx):
    engine, clock, rec = make_engine("decode")
    osl = 101
    for i in range(batch):
        req = SimRequest(i, 0.0, ctx - 1, osl)
        req.first_token = 0.0
        engine.enqueue(req)
    run_all(clock)
    assert len(rec.finished) == batch
    end = max(t for _, t in rec.finished)
    itl = end / (osl - 1)
    # the batch's KV grows by one token per sequence per step; ITL is taken at the midpoint
    mid = timing.decode_s(batch, batch * (ctx + osl / 2))
    assert itl == pytest.approx(mid, rel=0.02)
    assert engine.iterations == osl - 1


def test_fit_timing_uses_the_planners_linear_model(h200):
    fit = engine_timing(h200, "fit")
    assert fit.prefill_s(4000) > fit.prefill_s(1000) > 0
    assert fit.decode_s(64, 64 * 2000) > fit.decode_s(1, 2000) > 0


def test_unknown_timing_mode_is_refused(h200):
    with pytest.raises(ValueError, match="unknown engine timing"):
        engine_timing(h200, "magic")


def test_between_context_levels_decode_is_linear_in_the_batch():
    """A pass costs a + b·sequences + c·KV tokens: at a fixed KV usage that is linear
    in 1/context, so an engine whose measured rows follow such a plane is reproduced
    exactly between rows, however far apart the measured context levels are."""
    from fleetplan.models.perf import ProfileData

    max_kv = 100_000
    usages = [0.05, 0.2, 0.4, 0.6, 0.8]
    levels = [350.0, 3000.0, 12000.0]

    def plane_ms(seqs, kv):
        return 4.0 + 0.02 * seqs + 0.03e-3 * kv

    rows = [(u, c, plane_ms(u * max_kv / c, u * max_kv)) for c in levels for u in usages]
    profile = ProfileData(
        prefill_isl=[100.0, 8000.0], prefill_ttft_ms=[20.0, 300.0],
        x_kv_usage=[r[0] for r in rows], y_context_length=[r[1] for r in rows],
        z_itl_ms=[r[2] for r in rows], max_kv_tokens=max_kv,
    )
    timing = engine_timing(profile)
    for ctx in (500.0, 1260.0, 2000.0, 7000.0):
        for usage in (0.2, 0.4, 0.6):  # on measured usages: exact in usage too
            kv = usage * max_kv
            assert timing.decode_s(kv / ctx, kv) * 1000 == pytest.approx(plane_ms(kv / ctx, kv), rel=1e-12)


def test_below_the_shortest_measured_context_a_batch_still_pays_per_sequence(h200, timing):
    """256 sequences of 100 tokens hold the KV (25,600 tokens, usage 2.7 %) that 73 sequences
    hold at the shortest measured context, 350. Clamped to that level's curve at the same
    usage, the pass cost what the 73 sequences cost (8.4 ms), less than half of 256 sequences
    at 350 (18.7 ms), though the profile's levels say a sequence, not a KV token, is most of
    a pass here. The cost model the interpolation rests on (``a + b·sequences + c·kv``,
    docs/calibration.md) is linear in 1/context at a fixed usage below the first level too."""
    max_kv = h200.max_kv_tokens
    levels = h200.decode_levels()
    (c0, (u0, itl0)), (c1, (u1, itl1)) = list(levels.items())[:2]
    assert (c0, c1) == (350.0, 2997.0)
    kv = 256 * 100
    usage = kv / max_kv
    # by hand: each level's curve at this usage (linear between its two nearest rows) ...
    t0 = itl0[0] + (itl0[1] - itl0[0]) * (usage - u0[0]) / (u0[1] - u0[0])
    t1 = itl1[0] + (itl1[1] - itl1[0]) * (usage - u1[0]) / (u1[1] - u1[0])
    # ... and the line through them in 1/context, carried on to 1/100
    by_hand = t0 + (t0 - t1) * (1 / 100 - 1 / c0) / (1 / c0 - 1 / c1)
    assert by_hand == pytest.approx(17.33, abs=0.01)
    assert timing.decode_s(256, kv) * 1000 == pytest.approx(by_hand, rel=1e-9)
    # more sequences holding the same KV cost more; the same sequences with more context too
    assert timing.decode_s(73, kv) < timing.decode_s(256, kv) <= timing.decode_s(256, 256 * c0)


def test_below_the_shortest_context_the_pass_stays_between_its_bounds(timing):
    """Where the two levels' difference is noise (near zero usage), the line carried far
    below the first level must not fall under what fewer sequences cost at the same usage."""
    for seqs, ctx in [(1, 2), (1, 100), (8, 20), (64, 50), (256, 300)]:
        kv = seqs * ctx
        same_usage = timing.decode_s(max(1, round(kv / 350)), kv)  # fewer sequences, the same KV, at 350
        same_batch = timing.decode_s(seqs, seqs * 350)  # the same sequences at 350
        assert same_usage - 1e-12 <= timing.decode_s(seqs, kv) <= same_batch + 1e-12
    assert timing.decode_s(4, 0) == timing.decode_s(1, 1)  # no KV reported: the cheapest pass


def test_a_decode_level_at_context_zero_is_refused_naming_the_field(h200):
    """``ProfileData`` takes a decode row at context 0 (its seed is one request, as Dynamo's),
    but the interp timing reads between levels in 1/context: building it raised a bare
    ZeroDivisionError, a traceback from ``fleetplan simulate`` that named no field."""
    from fleetplan.models.perf import ProfileData

    ctx = h200.y_context_length.copy()
    ctx[ctx == ctx.min()] = 0.0
    profile = ProfileData(h200.prefill_isl, h200.prefill_ttft_ms, h200.x_kv_usage, ctx, h200.z_itl_ms,
                          h200.max_kv_tokens)
    with pytest.raises(ValueError, match="y_context_length"):
        engine_timing(profile)
    assert engine_timing(profile, "fit").decode_s(8, 8000) > 0  # the fit has no such axis


def test_past_the_last_prefill_point_a_falling_segment_does_not_carry_on_below_it(h200):
    """Splitwise's H100 TP2 Llama2-70B rows fall from 2,394 ms at 16,384 tokens to 361 ms at
    32,768 (the suspect batch-64 row the data's README names); carrying that slope on gave a
    40,000-token pass -537 ms. Past the last point a pass now never takes less than it."""
    from fleetplan.models.perf import ProfileData

    profile = ProfileData([100.0, 16_384.0, 32_768.0], [20.0, 2394.4, 360.8], h200.x_kv_usage,
                          h200.y_context_length, h200.z_itl_ms, h200.max_kv_tokens)
    timing = engine_timing(profile)
    assert timing.prefill_s(32_768) * 1000 == pytest.approx(360.8)
    assert timing.prefill_s(40_000) * 1000 == pytest.approx(360.8)
    assert timing.prefill_s(24_576) * 1000 == pytest.approx((2394.4 + 360.8) / 2)  # measured points kept


@pytest.mark.parametrize(("name", "tp"), [("h200-llama3.1-8b", None), ("h100-llama3.3-70b", 4)])
def test_extended_decode_levels_keep_every_measured_pass_time(name, tp):
    """interp-extend changes nothing where a level was measured: on the level's own context, at every
    usage up to its last row, a pass takes what interp says."""
    from fleetplan.sim.profiles import load_profile

    profile = load_profile(name, tp=tp)
    interp, extend = engine_timing(profile), engine_timing(profile, "interp-extend")
    assert extend.mode == "interp-extend"
    checked = 0
    for ctx, (usage, _) in profile.decode_levels().items():
        for seqs in range(1, int(usage[-1] * profile.max_kv_tokens // ctx) + 1, 7):
            assert extend.decode_s(seqs, seqs * ctx) == interp.decode_s(seqs, seqs * ctx)
            checked += 1
    assert checked > 50


def test_past_a_levels_measured_usage_its_last_rise_carries_on():
    """The 70B TP4 profile's 350-token level stops at 58 % of the cache. interp holds its last time
    from there to a full cache; interp-extend carries its last segment on, as prefill's does."""
    from fleetplan.sim.profiles import load_profile

    profile = load_profile("h100-llama3.3-70b", tp=4)
    interp, extend = engine_timing(profile), engine_timing(profile, "interp-extend")
    ctx, (usage, itl) = min(profile.decode_levels().items())
    assert ctx == 350 and usage[-1] < 0.6 and itl[-1] > itl[-2]
    seqs = int(0.8 * profile.max_kv_tokens // ctx)
    past = seqs * ctx / profile.max_kv_tokens
    slope = (itl[-1] - itl[-2]) / (usage[-1] - usage[-2])
    assert interp.decode_s(seqs, seqs * ctx) * 1000 == pytest.approx(itl[-1])
    assert extend.decode_s(seqs, seqs * ctx) * 1000 == pytest.approx(itl[-1] + slope * (past - usage[-1]))
    assert extend.decode_s(seqs, seqs * ctx) > interp.decode_s(seqs, seqs * ctx)
