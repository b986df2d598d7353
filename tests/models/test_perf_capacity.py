"""Capacity search (Dynamo 1.6.1 ``engine_query`` semantics), by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.perf import (
    EngineLimits,
    LinearFit,
    agg_capacity,
    backlog_prefill_rps,
    batch_candidates,
    decode_capacity,
    effective_isl,
    prefill_capacity,
)
from fleetplan.models.perf.fit import QuadraticFit

PREFILL = LinearFit(0.01, (1e-5,), floor=0.01)  # t = 10 ms + 10 µs/token
DECODE = LinearFit(0.005, (1e-4, 1e-8), floor=0.005)  # 5 ms + 0.1 ms/request + 10 ns/KV token
MIXED = LinearFit(0.01, (1e-5, 1e-8), floor=0.01)


def test_batch_candidates():
    assert batch_candidates(0).tolist() == []
    assert batch_candidates(5).tolist() == [1, 2, 3, 4, 5]
    assert batch_candidates(128).tolist() == list(range(1, 129))
    spread = batch_candidates(307).tolist()
    assert len(spread) == 128 and spread[0] == 1 and spread[-1] == 307
    assert spread == sorted(set(spread))


def test_effective_isl():
    assert effective_isl(3000, None) == 3000
    assert effective_isl(3000, 0.5) == 1500
    assert effective_isl(3000, 0.99) == effective_isl(3000, 0.95) == math.ceil(3000 * (1 - 0.95))
    assert effective_isl(10, 0.95) == 1
    assert effective_isl(3000, -0.2) == 3000


def test_prefill_batch_search_and_sla():
    limits = EngineLimits(max_num_batched_tokens=8192)
    # eff 3000 -> max batch 8192 // 3000 = 2; bs1: 40 ms, 25 rps; bs2: 70 ms, 28.57 rps
    loose = prefill_capacity(PREFILL, limits, 3000, 100.0, None)
    assert (loose.batch, loose.meets_sla) == (2, True)
    assert loose.rps == pytest.approx(2 / 0.07)
    assert loose.ttft_ms == pytest.approx(70.0)
    assert loose.itl_ms is None
    tight = prefill_capacity(PREFILL, limits, 3000, 50.0, None)  # only bs1 eligible
    assert (tight.batch, tight.rps, tight.meets_sla) == (1, pytest.approx(25.0), True)
    hopeless = prefill_capacity(PREFILL, limits, 3000, 30.0, None)  # best ineligible, flagged
    assert (hopeless.batch, hopeless.rps, hopeless.meets_sla) == (2, pytest.approx(2 / 0.07), False)
    assert prefill_capacity(PREFILL, limits, 3000, None, None).batch == 2


def test_prefill_long_prompt_is_chunked():
    # 10000 > 8192: batch 1, t = t(8192) + t(1808) = 0.09192 + 0.02808
    cap = prefill_capacity(PREFILL, EngineLimits(max_num_batched_tokens=8192), 10_000, None, None)
    assert cap.batch == 1
    assert cap.ttft_ms == pytest.approx(120.0)
    assert cap.rps == pytest.approx(1 / 0.12)


def test_prefill_kv_hit_shrinks_work_and_allows_bigger_batches():
    # eff 1500 -> max batch 5; rps = bs/(0.01 + 0.015·bs) grows with bs
    cap = prefill_capacity(PREFILL, EngineLimits(), 3000, None, 0.5)
    assert cap.batch == 5
    assert cap.rps == pytest.approx(5 / 0.085)
    assert prefill_capacity(PREFILL, EngineLimits(max_num_seqs=3), 3000, None, 0.5).batch == 3
    assert prefill_capacity(PREFILL, EngineLimits(), 0, None, None) is None


def test_decode_little_law_itl_sla_and_kv_cap():
    limits = EngineLimits(max_kv_tokens=110_000)
    # ctx = 1000 + 200//2 = 1100; max batch = 110000 // 1100 = 100
    # itl(bs) = 0.005 + 1.11e-4·bs <= 10 ms -> bs <= 45
    cap = decode_capacity(DECODE, limits, 1000, 200, 10.0, None)
    assert (cap.batch, cap.meets_sla) == (45, True)
    assert cap.itl_ms == pytest.approx(9.995)
    assert cap.rps == pytest.approx(45 / (200 * 0.009995))
    assert cap.ttft_ms is None
    assert not cap.at_limit  # the ITL target set the batch, not the cache


def test_decode_accept_length_divides_itl():
    limits = EngineLimits(max_kv_tokens=110_000)
    # itl/2 <= 10 ms holds up to bs 135, capped by KV at 100: itl = 0.0161/2
    cap = decode_capacity(DECODE, limits, 1000, 200, 10.0, 2.0)
    assert cap.batch == 100 and cap.at_limit  # the cache set it, with ITL to spare
    assert cap.itl_ms == pytest.approx(8.05)
    assert cap.rps == pytest.approx(100 / (200 * 0.00805))


def test_decode_batch_limits():
    # no KV size known and none observed: max_num_seqs bounds the batch
    assert decode_capacity(DECODE, EngineLimits(max_num_seqs=64), 1000, 200, None, None).batch == 64
    # the largest KV load observed stands in for an unknown cache size
    assert decode_capacity(DECODE, EngineLimits(), 1000, 200, None, None, kv_fallback=11_000).batch == 10
    # a request that does not fit the cache has no capacity
    assert decode_capacity(DECODE, EngineLimits(max_kv_tokens=1000), 1000, 200, None, None) is None
    assert decode_capacity(DECODE, EngineLimits(), 1000, 0, None, None) is None


def test_agg_balanced_batches_and_both_slas():
    limits = EngineLimits(max_num_batched_tokens=2048, max_num_seqs=100, max_kv_tokens=1_000_000)
    # eff 1000, osl 100: admitted prefill per pass = 10·bs (balanced while 11·bs <= 2048)
    # itl(bs) = 0.01 + 1e-5·10bs + 1e-8·1050bs = 0.01 + 1.105e-4·bs <= 20 ms -> bs <= 90
    cap = agg_capacity(MIXED, limits, 1000, 100, 1000.0, 20.0, None, None)
    assert (cap.batch, cap.meets_sla) == (90, True)
    assert cap.itl_ms == pytest.approx(19.945)
    # ttft: one pass of 900 + 1000 tokens with 94500 KV riding along
    assert cap.ttft_ms == pytest.approx(10 + 19 + 0.945)
    assert cap.rps == pytest.approx(90 / (100 * 0.019945))
    # ttft(bs) = 0.02 + 1.105e-4·bs <= 25 ms -> bs <= 45
    tight = agg_capacity(MIXED, limits, 1000, 100, 25.0, 20.0, None, None)
    assert tight.batch == 45
    assert tight.rps == pytest.approx(45 / (100 * (0.01 + 1.105e-4 * 45)))


def test_agg_unbalanced_batches_are_skipped_and_none_balanced_serves_one_at_a_time():
    limits = EngineLimits(max_num_batched_tokens=2048, max_num_seqs=100, max_kv_tokens=10_000_000)
    # osl 1: admitted = 1000·bs must fit 2048 - bs -> only bs 1 and 2
    assert agg_capacity(MIXED, limits, 1000, 1, None, None, None, None).batch == 2
    # isl 4000 never fits: no balanced batch at all, so one request at a time (prefill-bound):
    # its prompt in two passes (2048 + 1952 tokens), its one token alone
    alone = agg_capacity(MIXED, limits, 4000, 1, None, None, None, None)
    ttft = MIXED.predict(2048, 4000) + MIXED.predict(1952, 4000)
    assert (alone.batch, alone.ttft_ms) == (1, pytest.approx(ttft * 1000))
    assert alone.rps == pytest.approx(1 / (ttft + MIXED.predict(0, 4000)))
    # a request larger than the cache still has no capacity
    assert agg_capacity(MIXED, EngineLimits(max_num_batched_tokens=2048, max_kv_tokens=1000),
                        4000, 1, None, None, None, None) is None


def test_agg_a_batch_whose_prefill_exactly_fills_the_token_budget_is_balanced():
    # Dynamo: balanced while ceil(bs·accept·eff_isl/osl) <= MBT - bs. eff 1023, osl 1: bs 2 admits
    # 2046 tokens, exactly the 2048 - 2 left, and serves 2 / t(2046, 2046) = 65.6 rps against bs 1's
    # 1 / t(1023, 1023) = 49.5
    limits = EngineLimits(max_num_batched_tokens=2048, max_num_seqs=100, max_kv_tokens=10_000_000)
    cap = agg_capacity(MIXED, limits, 1023, 1, None, None, None, None)
    assert cap.batch == 2
    assert cap.rps == pytest.approx(2 / MIXED.predict(2046, 2046))


def test_limits_default_to_dynamos_fallbacks():
    # a model card without them: 8192 batched tokens, 256 sequences, no known cache or context
    assert EngineLimits() == EngineLimits(max_num_batched_tokens=8192, max_num_seqs=256,
                                          max_kv_tokens=None, max_context_length=None)


def test_eligible_beats_ineligible_even_at_lower_rate():
    # decode itl SLA 6 ms: bs <= 9 eligible; bs 100 would be faster but misses it
    cap = decode_capacity(DECODE, EngineLimits(max_kv_tokens=110_000), 1000, 200, 6.0, None)
    assert cap.batch == 9 and cap.meets_sla


def _loop_reference(role, fit, limits, isl, osl, ttft_ms, itl_ms, kv_hit, accept):
    """Candidate-by-candidate restatement of the search, in plain Python."""
    acc = accept if accept and accept > 1 else 1.0
    kv = min(0.95, max(0.0, kv_hit or 0.0))
    eff = max(1, math.ceil(isl * (1.0 - kv)))
    ctx = max(1, isl + osl // 2)
    mbt = limits.max_num_batched_tokens

    def chunked(tokens, *rest):
        full = math.floor(tokens / mbt)
        tail = tokens - full * mbt
        return (full * fit.predict(mbt, *rest) if full else 0.0) + (fit.predict(tail, *rest) if tail > 0 else 0.0)

    if role == "prefill":
        top = 1 if eff > mbt else min(limits.max_num_seqs, mbt // eff)
    else:
        top = min(limits.max_num_seqs, limits.max_kv_tokens // ctx)
        if role == "agg":
            top = min(top, max(1, mbt - 1))
    best = None
    for bs in batch_candidates(top).tolist():
        if role == "prefill":
            ttft, itl = chunked(bs * eff), None
            rps = bs / ttft
        elif role == "decode":
            ttft, itl = None, fit.predict(bs, bs * ctx) / acc
            rps = bs / (osl * itl)
        else:
            admitted = math.ceil(bs * acc * eff / osl)
            if mbt - bs <= 0 or admitted > mbt - bs:
                continue
            ppp = min(mbt, admitted)
            itl = fit.predict(ppp, bs * ctx) / acc
            ttft = chunked(ppp + eff, bs * ctx)
            rps = bs / (osl * itl)
        ok = (ttft_ms is None or ttft is None or ttft <= ttft_ms / 1000) and (
            itl_ms is None or itl is None or itl <= itl_ms / 1000
        )
        if best is None or (ok and not best[1]) or (ok == best[1] and rps > best[0]):
            best = (rps, ok, bs)
    if role == "agg" and best is None and batch_candidates(top).size:
        # no balanced batch: one request at a time, its prompt chunked, its answer decoded alone
        ttft, itl = chunked(eff, ctx), fit.predict(0, ctx) / acc
        ok = (ttft_ms is None or ttft <= ttft_ms / 1000) and (itl_ms is None or itl <= itl_ms / 1000)
        best = (1.0 / (ttft + osl * itl), ok, 1)
    return best


@settings(max_examples=60, deadline=None)
@given(
    role=st.sampled_from(["prefill", "decode", "agg"]),
    intercept=st.floats(-0.01, 0.05),
    slopes=st.tuples(st.floats(0, 1e-4), st.floats(0, 1e-7)),
    isl=st.integers(1, 20_000),
    osl=st.integers(1, 2_000),
    mbt=st.sampled_from([512, 2048, 8192]),
    seqs=st.integers(1, 512),
    ttft_ms=st.none() | st.floats(1, 2000),
    itl_ms=st.none() | st.floats(1, 200),
    kv_hit=st.none() | st.floats(-0.5, 1.5),
    accept=st.none() | st.floats(0.5, 4),
)
def test_vectorised_search_matches_a_plain_loop(
    role, intercept, slopes, isl, osl, mbt, seqs, ttft_ms, itl_ms, kv_hit, accept
):
    fit = LinearFit(intercept, slopes[:1] if role == "prefill" else slopes, floor=1e-3)
    limits = EngineLimits(max_num_batched_tokens=mbt, max_num_seqs=seqs, max_kv_tokens=2_000_000)
    search = {"prefill": prefill_capacity, "decode": decode_capacity, "agg": agg_capacity}[role]
    args = {
        "prefill": (isl, ttft_ms, kv_hit),
        "decode": (isl, osl, itl_ms, accept),
        "agg": (isl, osl, ttft_ms, itl_ms, kv_hit, accept),
    }[role]
    got = search(fit, limits, *args)
    want = _loop_reference(role, fit, limits, isl, osl, ttft_ms, itl_ms, kv_hit, accept)
    if want is None:
        assert got is None
        return
    assert (got.batch, got.meets_sla) == (want[2], want[1])
    assert got.rps == pytest.approx(want[0], rel=1e-12)


# t = 20 ms + 10 µs/token + 1e-9 s/token²: tokens a second peak at 4,472 tokens (sqrt(0.02 / 1e-9)),
# below the 8,192-token pass a backlogged chunked-prefill engine packs
PEAKED = QuadraticFit(0.02, (1e-5, 1e-9), floor=0.02)


def test_a_backlogged_engine_is_rated_at_its_packed_pass_where_tokens_a_second_peak_below_it():
    """docs/sizing.md (prefill's rate under a backlog): the best batch's rate is one no engine with a
    queue runs at, since it packs every pass to max_num_batched_tokens."""
    limits = EngineLimits(max_num_batched_tokens=8192)
    best = prefill_capacity(PEAKED, limits, 1000, None, None)
    packed_s = 0.02 + 1e-5 * 8192 + 1e-9 * 8192**2
    assert backlog_prefill_rps(PEAKED, limits, 1000, None) == pytest.approx(8.192 / packed_s)
    assert (best.batch, best.rps) == (4, pytest.approx(4 / 0.076))  # 4,000 tokens, near the peak
    assert backlog_prefill_rps(PEAKED, limits, 1000, None) == pytest.approx(0.921 * best.rps, abs=0.01)
    # a line's tokens a second only rise with the pass: the packed pass (8,192 tokens, part of a
    # ninth prompt) serves a little more than the best whole batch (8), and the cap leaves that be
    assert backlog_prefill_rps(PREFILL, limits, 1000, None) == pytest.approx(8.192 / (0.01 + 0.08192))
    assert prefill_capacity(PREFILL, limits, 1000, None, None).rps == pytest.approx(8 / 0.09)


def test_the_packed_pass_counts_computed_tokens_and_at_most_max_num_seqs_prompts():
    half = backlog_prefill_rps(PEAKED, EngineLimits(max_num_batched_tokens=8192), 2000, 0.5)
    assert half == pytest.approx(backlog_prefill_rps(PEAKED, EngineLimits(max_num_batched_tokens=8192), 1000, None))
    few = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=2)  # 2 prompts of 1,000: a 2,000-token pass
    assert backlog_prefill_rps(PEAKED, few, 1000, None) == pytest.approx(2 / (0.02 + 0.02 + 4e-3))
    # a prompt longer than the budget: every pass is full, its tail shared with the next prompt
    long = backlog_prefill_rps(PEAKED, EngineLimits(max_num_batched_tokens=8192), 20_000, None)
    assert long == pytest.approx(8192 / (0.02 + 1e-5 * 8192 + 1e-9 * 8192**2) / 20_000)
    assert backlog_prefill_rps(PEAKED, EngineLimits(), 0, None) is None
