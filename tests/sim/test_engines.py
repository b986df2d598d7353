"""Engine behaviour: batching, chunking, KV admission, aggregation, prefix cache, FPM samples."""

from __future__ import annotations

import pytest

from fleetplan.models.perf import EngineLimits
from fleetplan.sim.engines import MAX_MACRO_ITERATIONS, SimRequest
from tests.sim.sim_helpers import run_all


def decode_req(i, isl=1000, osl=50, t=0.0):
    req = SimRequest(i, t, isl, osl)
    req.first_token = t
    return req


def test_prompts_share_a_pass_up_to_the_token_budget(make_engine, timing):
    engine, clock, rec = make_engine("prefill")
    for i in range(10):
        engine.enqueue(SimRequest(i, 0.0, 1000, 10))
    run_all(clock)
    # 8192-token budget: 8 full prompts + 192 tokens of the 9th, then the rest
    assert engine.iterations == 2
    first_pass = timing.prefill_s(8192)
    assert [t for _, t in rec.prompts[:8]] == [pytest.approx(first_pass)] * 8
    assert rec.prompts[-1][1] == pytest.approx(first_pass + timing.prefill_s(1808))


def test_max_num_seqs_caps_a_prefill_pass(make_engine, timing, limits):
    small = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=4, max_kv_tokens=limits.max_kv_tokens)
    engine, clock, rec = make_engine("prefill", limits_=small)
    for i in range(8):
        engine.enqueue(SimRequest(i, 0.0, 100, 10))
    run_all(clock)
    assert engine.iterations == 2
    assert rec.prompts[3][1] == pytest.approx(timing.prefill_s(400))


def test_a_late_request_joins_the_running_batch_at_the_next_step(make_engine, timing):
    engine, clock, rec = make_engine("decode")
    engine.enqueue(decode_req(0, osl=201))
    clock.at(0.1, engine.enqueue, decode_req(1, osl=11, t=0.1))
    run_all(clock)
    done = {r.index: t for r, t in rec.finished}
    # the newcomer needs 10 steps; it joined after the step in flight at 0.1 s
    step_one = timing.decode_s(1, 1001)
    joined_at = (int(0.1 / step_one) + 1) * step_one
    assert done[1] - joined_at == pytest.approx(10 * timing.decode_s(2, 2000), rel=0.05)
    assert engine.iterations == 200
    assert engine.running == 0 and engine.kv == 0 and engine.kv_reserved == 0


def test_macro_steps_never_exceed_their_cap(make_engine):
    engine, clock, rec = make_engine("decode")
    engine.enqueue(decode_req(0, osl=1000))
    boundaries = 0
    while clock.step():
        boundaries += 1
    assert engine.iterations == 999
    assert boundaries >= 999 // MAX_MACRO_ITERATIONS


def test_full_kv_cache_queues_requests_and_never_overflows(make_engine, limits):
    tiny = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=256, max_kv_tokens=5000)
    engine, clock, rec = make_engine("decode", limits_=tiny)
    peak = []
    for i in range(6):
        engine.enqueue(decode_req(i, isl=1900, osl=100))
    while clock.step():
        peak.append(engine.kv_reserved)
    assert len(rec.finished) == 6
    assert max(peak) <= 5000  # two 2000-token contexts at a time
    ends = sorted(t for _, t in rec.finished)
    assert ends[1] < ends[2] < ends[4]  # three waves


def test_decode_respects_max_num_seqs(make_engine, limits):
    two = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=2, max_kv_tokens=limits.max_kv_tokens)
    engine, clock, rec = make_engine("decode", limits_=two)
    seen = []
    for i in range(5):
        engine.enqueue(decode_req(i, osl=20))
    while clock.step():
        seen.append(engine.running)
    assert max(seen) == 2 and len(rec.finished) == 5


def test_aggregated_engine_piggybacks_prefill_on_decode(make_engine, timing):
    engine, clock, rec = make_engine("agg")
    engine.enqueue(SimRequest(0, 0.0, 2000, 300))
    clock.at(0.5, engine.enqueue, SimRequest(1, 0.5, 3000, 5))
    run_all(clock)
    done = {r.index: r for r, _ in rec.finished}
    first = done[0]
    assert first.first_token == pytest.approx(timing.prefill_s(2000))
    second = done[1]
    # its prompt rode in one mixed pass with request 0's decode step
    assert second.first_token - 0.5 < timing.prefill_s(3000) + 2 * timing.decode_s(1, 2400)
    assert second.first_token - 0.5 > timing.prefill_s(3000)
    assert engine.kv == 0 and engine.kv_reserved == 0


def test_one_token_answers_finish_at_their_first_token(make_engine):
    engine, clock, rec = make_engine("agg")
    engine.enqueue(SimRequest(0, 0.0, 500, 1))
    run_all(clock)
    (req, t), = rec.finished
    assert req.first_token == t


def test_prefix_cache_skips_cached_leading_blocks(make_engine, timing):
    engine, clock, rec = make_engine("prefill", prefix_block_tokens=512)
    first = SimRequest(0, 0.0, 4096, 10, hash_ids=tuple(range(8)))
    engine.enqueue(first)
    run_all(clock)
    again = SimRequest(1, clock.now, 4096 + 512, 10, hash_ids=tuple(range(8)) + (99,))
    other = SimRequest(2, clock.now, 4096, 10, hash_ids=(99, 1, 2))
    assert engine.cached_prefix_tokens(again) == 4096
    assert engine.cached_prefix_tokens(other) == 0  # only a shared *prefix* counts
    start = clock.now
    engine.enqueue(again)
    run_all(clock)
    assert again.cached == 4096
    assert rec.prompts[-1][1] - start == pytest.approx(timing.prefill_s(512))


def test_fpm_sample_describes_the_pass_in_flight(make_engine, timing):
    engine, clock, rec = make_engine("decode")
    for i in range(4):
        engine.enqueue(decode_req(i, isl=999, osl=500))
    clock.at(1.0, lambda: None)
    while clock.peek() is not None and clock.peek() <= 1.0:
        clock.step()
    sample = engine.sample(1.0)
    n_pre, pre_tokens, _, n_dec, dec_kv = sample["sched"]
    assert (n_pre, pre_tokens, n_dec) == (0, 0, 4)
    steps = sample["counter"]
    assert dec_kv == 4 * (1000 + steps)
    assert sample["wall_time"] == pytest.approx(timing.decode_s(4, dec_kv), rel=0.05)
    run_all(clock)
    heartbeat = engine.sample(clock.now)
    assert heartbeat["wall_time"] == 0.0
    assert engine.sample(clock.now) is None  # one heartbeat per idle spell


def test_prefill_fpm_counts_unstarted_prompts_as_queued(make_engine):
    engine, clock, _ = make_engine("prefill")
    for i in range(20):
        engine.enqueue(SimRequest(i, 0.0, 1000, 10))
    clock.step()  # the first pass starts
    sample = engine.sample(0.0)
    assert sample["sched"][:2] == (9, 8192)
    assert sample["queued"][:2] == (11, 11_000)


def test_prefill_first_agg_pauses_decodes_for_a_prompt_pass(make_engine, timing):
    engine, clock, rec = make_engine("agg", prefill_first=True)
    engine.enqueue(SimRequest(0, 0.0, 1000, 100))
    clock.at(0.2, engine.enqueue, SimRequest(1, 0.2, 4000, 2))
    run_all(clock)
    done = {r.index: r for r, _ in rec.finished}
    # request 0 decoded 99 steps plus it waited for request 1's prompt pass
    steps = done[0].end - done[0].first_token
    assert steps > 99 * timing.decode_s(1, 1050) + timing.prefill_s(4000) * 0.95
    assert engine.counter == 99  # request 1 took its one decode step with request 0's


def test_a_full_prefix_cache_evicts_the_tail_blocks_of_a_prompt_first(make_engine):
    # Room for four 512-token blocks. Evicting a prompt's leading block first (as an LRU
    # filled in prompt order did) left its other blocks cached but unreachable: a prefix hit
    # needs the leading blocks. vLLM (and Dynamo's mocker) free a prompt's blocks tail first.
    engine, clock, _ = make_engine("prefill", limits_=EngineLimits(max_kv_tokens=2048), prefix_block_tokens=512)
    engine.enqueue(SimRequest(0, 0.0, 1536, 10, hash_ids=(1, 2, 3)))
    run_all(clock)
    engine.enqueue(SimRequest(1, clock.now, 1024, 10, hash_ids=(4, 5)))
    run_all(clock)
    again = SimRequest(2, clock.now, 2048, 10, hash_ids=(1, 2, 3, 6))
    assert engine.cached_prefix_tokens(again) == 1024  # blocks 1 and 2; block 3 made room


def test_a_queued_prompt_hits_the_blocks_cached_while_it_waited(make_engine, timing):
    # B arrives while A, which shares B's first 8 blocks, is in its pass. When B's turn comes
    # A's blocks are cached, and a real scheduler looks its prefix up then, not on arrival.
    engine, clock, rec = make_engine("prefill", prefix_block_tokens=512)
    first = SimRequest(0, 0.0, 4096, 10, hash_ids=tuple(range(8)))
    second = SimRequest(1, 0.01, 4608, 10, hash_ids=tuple(range(9)))
    engine.enqueue(first)
    clock.at(0.01, engine.enqueue, second)
    run_all(clock)
    assert second.cached == 4096
    assert second.prefill_end == pytest.approx(timing.prefill_s(4096) + timing.prefill_s(512))
    assert engine.prefill_backlog == 0 and engine.prefill_load() == 0


@pytest.mark.parametrize("role", ["agg", "decode"])
def test_a_sample_as_an_idle_engine_takes_work_reports_no_decode_kv(make_engine, role):
    # A sample at the instant a request reaches an idle engine (integer arrival times meet
    # the sampler's whole seconds) comes before the engine's first pass: nothing decodes.
    # It reported the KV the engine's last batch started with, which the load loop read as
    # decode load on an engine holding none.
    engine, clock, _ = make_engine(role)
    engine.enqueue(decode_req(0, isl=3000, osl=20))
    run_all(clock)
    assert engine.kv == 0
    engine.enqueue(decode_req(1, isl=3000, osl=20, t=clock.now))
    _, _, _, n_dec, dec_kv = engine.sample(clock.now)["sched"]
    assert (n_dec, dec_kv) == (0, 0)
