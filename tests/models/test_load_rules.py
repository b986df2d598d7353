"""The load loop's rules against hand calculations (Dynamo 1.6.1, dynamo-planner-notes.md §2d).

Each perf model here is fitted on exact linear samples, so every estimate
is arithmetic that can be done by hand; the combination rules of agg
engines are checked with a stand-in model whose estimates are given.
"""

from __future__ import annotations

import numpy as np

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.load import (
    EngineLoads,
    agg_signal,
    decode_signal,
    prefill_signal,
    threshold_signal,
)
from fleetplan.models.perf import AggPerfModel, DecodePerfModel, EngineLimits, PrefillPerfModel
from fleetplan.schemas import ForwardPassMetrics
from tests.models.factories import T0, fpm


def _observed(model, role: str, rows):
    """``model`` after one FPM per ``(prefill requests, prefill tokens, decode requests, decode KV, wall)``."""
    for i, (pn, pt, dn, dk, wall) in enumerate(rows):
        model.observe(ForwardPassMetrics(
            deployment="d", time=T0 + i, role=role, worker_id="w", counter_id=i, wall_time=wall,
            scheduled={"num_prefill_requests": pn, "sum_prefill_tokens": pt,
                       "num_decode_requests": dn, "sum_decode_kv_tokens": dk},
        ))
    return model


def _prefill_model():
    """Pass time 10 ms + 0.01 ms a token; every prompt 1,000 tokens: one alone takes 20 ms."""
    rows = [(k, 1000 * k, 0, 0, 0.010 + 1e-5 * 1000 * k) for k in range(1, 9)]
    return _observed(PrefillPerfModel(EngineLimits(max_num_batched_tokens=8192)), "prefill", rows)


def _queues(*tokens: float) -> EngineLoads:
    q = np.array(tokens, dtype=np.float64)
    return EngineLoads(q, np.zeros_like(q), np.zeros_like(q))


def test_the_prefill_release_margin_is_on_the_time_the_queue_adds():
    # Dynamo: budget = (ttft - t_own)·s, pass if post - t_own < budget. Two engines with 3,500
    # queued tokens each: t_own = 20 ms, one engine fewer carries 7,000: post = 90 ms, so the
    # queue adds 70 ms against a budget of (100 - 20)·0.8 = 64 ms. Refused (ttft·s = 80 would pass).
    cfg = config_from_dict({**REFERENCE_SIZING, "ttft": 100.0})
    model = _prefill_model()
    assert abs(float(model.estimate_ttft_ms_many(np.array([0.0]), 0.0)[0]) - 20.0) < 1e-6
    refused = prefill_signal(cfg, model, _queues(3500.0, 3500.0), 0.0)
    assert (refused.step, refused.reason) == (0, "scale_down_refused_consolidation")
    # at 3,000 tokens each the queue adds 60 ms, under 64: released
    assert prefill_signal(cfg, model, _queues(3000.0, 3000.0), 0.0).step == -1


def test_an_engine_too_slow_alone_gets_one_more_engine_not_the_whole_step():
    # 20 ms for a prompt alone against a 15 ms target: no count of engines brings it within,
    # so the loop adds one (Dynamo's step), not load_max_scale_up_step
    cfg = config_from_dict({"ttft": 15.0, "load_max_scale_up_step": 8})
    sig = prefill_signal(cfg, _prefill_model(), _queues(0.0, 0.0), 0.0)
    assert (sig.step, sig.reason) == (1, "scale_up")


def _decode_model(max_kv: int):
    """Pass time 5 ms + 1e-9 s per KV token: ITL barely moves with the load."""
    rows = [(0, 0, n, kv, 0.005 + 1e-9 * kv) for n in (1, 4, 16) for kv in (1000, 20_000, 60_000)]
    return _observed(DecodePerfModel(EngineLimits(max_kv_tokens=max_kv)), "decode", rows)


def test_a_decode_release_needs_the_survivors_kv_to_fit_the_cache():
    # Dynamo: release only if (sched + queued kv)·N/(N-1) < max_kv_tokens. Two engines at 60,000
    # KV tokens each: one engine would hold 120,000 > 100,000, whatever the ITL says
    cfg = config_from_dict(dict(REFERENCE_SIZING))
    kv = np.array([60_000.0, 60_000.0])
    full = decode_signal(cfg, _decode_model(100_000), EngineLoads(np.zeros(2), kv, np.zeros(2)), 1.0)
    assert (full.step, full.reason) == (0, "scale_down_refused_consolidation")
    assert decode_signal(cfg, _decode_model(130_000), EngineLoads(np.zeros(2), kv, np.zeros(2)), 1.0).step == -1


def test_an_agg_release_counts_queued_prompts_as_kv():
    # Agg: queued prefill counts as KV for the decode check (the prompts become KV once prefilled):
    # 20,000 KV + 40,000 queued per engine, two engines: 120,000 for one, over a 100,000 cache
    rows = [(1, pt, n, kv, 0.005 + 1e-9 * kv + 1e-7 * pt)
            for pt in (100, 2000, 8000) for n, kv in ((1, 1000), (4, 20_000), (16, 60_000))]
    model = _observed(AggPerfModel(EngineLimits(max_kv_tokens=100_000)), "agg", rows)
    loads = EngineLoads(np.full(2, 40_000.0), np.full(2, 20_000.0), np.zeros(2))
    sig = decode_signal(config_from_dict(dict(REFERENCE_SIZING)), model, loads, 1.0)
    assert (sig.step, sig.reason) == (0, "scale_down_refused_consolidation")


class _AggStandIn:
    """An agg model whose TTFT is its queue (ms per token) and whose ITL is its KV (ms per token)."""

    role = "agg"
    limits = EngineLimits(max_kv_tokens=10**9)

    def estimate_ttft_ms_many(self, queued, decode_kv, kv_hit, queue_scale=1.0, decode_scale=1.0):
        return 10.0 + np.asarray(queued) * queue_scale

    def estimate_itl_ms_many(self, kv, accept, load_scale=1.0):
        return 1.0 + np.asarray(kv) * load_scale

    def estimate_itl_floor_ms(self, accept):
        return 1.0


def test_agg_goes_down_only_when_both_sides_agree():
    # ttft 500, itl 50, s = 0.8. Queues 0: TTFT 10 ms alone and after a release, so prefill says
    # down; KV 40 per engine: ITL 41 ms now, 81 after a release, over 0.8·50: decode refuses
    cfg = config_from_dict({**REFERENCE_SIZING, "ttft": 500.0, "itl": 50.0})
    loads = EngineLoads(np.zeros(2), np.full(2, 40.0), np.zeros(2))
    assert prefill_signal(cfg, _AggStandIn(), loads, 0.0).step == -1
    assert decode_signal(cfg, _AggStandIn(), loads, 1.0).step == 0
    sig = agg_signal(cfg, _AggStandIn(), loads, 0.0, 1.0)
    assert (sig.step, sig.reason) == (0, "scale_down_refused_consolidation")


def test_agg_goes_up_by_the_larger_side_when_only_one_says_up():
    # queues of 600 tokens: TTFT 610 ms > 500 on both engines; with k more engines each carries
    # 600·2/(2+k): 2 more give 310 ms, 1 more 410 ms: 1 is the fewest. ITL 1 ms: decode says no
    cfg = config_from_dict({"ttft": 500.0, "itl": 50.0, "load_max_scale_up_step": 8})
    loads = EngineLoads(np.full(2, 600.0), np.zeros(2), np.zeros(2))
    assert decode_signal(cfg, _AggStandIn(), loads, 1.0).step <= 0
    sig = agg_signal(cfg, _AggStandIn(), loads, 0.0, 1.0)
    assert (sig.step, sig.reason) == (1, "scale_up")


def _engines(role: str, *, queued_prefill=(), kv=()):
    n = max(len(queued_prefill), len(kv))
    q = list(queued_prefill) or [0] * n
    k = list(kv) or [0] * n
    return [fpm(f"w{i}", role, T0, queued_prefill=q[i], decode_kv=k[i]) for i in range(n)]


def test_latency_target_releases_prefill_only_when_every_queue_is_empty():
    # Dynamo's latency mode: prefill down if all queued/context == 0 (the threshold is 0, and no
    # ratio is below it)
    cfg = config_from_dict({"optimization_target": "latency", "context_length": 8192})
    idle = threshold_signal(cfg, "prefill", _engines("prefill", queued_prefill=[0, 0]), 8192, None)
    assert (idle.step, idle.reason) == (-1, "scale_down")
    queued = threshold_signal(cfg, "prefill", _engines("prefill", queued_prefill=[0, 10]), 8192, None)
    assert queued.step == 0


def test_threshold_release_refused_when_the_survivors_would_cross_the_up_threshold():
    # throughput mode, decode: down if all util < 0.6, but 1.6.1's guard refuses when
    # max(util)·N/(N-1) >= up (1.0, exclusive for decode): 0.55·2 = 1.1. At 0.45: 0.9, released
    cfg = config_from_dict({"optimization_target": "throughput", "context_length": 8192, "max_kv_tokens": 100_000})
    crowded = threshold_signal(cfg, "decode", _engines("decode", kv=[55_000, 55_000]), None, 100_000)
    assert (crowded.step, crowded.reason) == (0, "no_change")
    roomy = threshold_signal(cfg, "decode", _engines("decode", kv=[45_000, 45_000]), None, 100_000)
    assert roomy.step == -1


def _agg_model():
    """Agg pass time 10 ms + 0.01 ms a prompt token + 0.001 ms a decode KV token; prompts of 1,000."""
    rows = [(k, 1000 * k, 4, kv, 0.010 + 1e-5 * 1000 * k + 1e-6 * kv)
            for k in (1, 2, 4) for kv in (0, 20_000, 40_000)]
    return _observed(AggPerfModel(EngineLimits(max_num_batched_tokens=8192)), "agg", rows)


def test_the_agg_prefill_release_takes_the_own_time_at_the_survivors_decode_kv():
    # Dynamo's agg check: t_own = TTFT with no queue at the survivor's decode KV (N/(N-1) of it),
    # pass if post - t_own < (ttft - t_own)·s. Two engines, 1,500 queued tokens and 20,000 decode KV
    # each; one engine fewer carries 3,000 and 40,000: post = 10 + 40 + 40 = 90 ms, t_own = 10 + 10
    # + 40 = 60 ms, the queue adds 30 ms against (100 - 60)·0.8 = 32: released. Timing t_own at
    # today's 20,000 KV (40 ms) charged the KV growth to the queue (50 ms against 48): refused
    cfg = config_from_dict({**REFERENCE_SIZING, "ttft": 100.0})
    model = _agg_model()
    loads = EngineLoads(np.full(2, 1500.0), np.full(2, 20_000.0), np.zeros(2))
    assert abs(float(model.estimate_ttft_ms_many(np.zeros(1), np.array([40_000.0]))[0]) - 60.0) < 1e-6
    sig = prefill_signal(cfg, model, loads, 0.0)
    assert (sig.step, sig.reason) == (-1, "scale_down")
    # 1,700 queued each: the queue adds 34 ms, over 32: refused
    crowded = EngineLoads(np.full(2, 1700.0), np.full(2, 20_000.0), np.zeros(2))
    assert prefill_signal(cfg, model, crowded, 0.0).reason == "scale_down_refused_consolidation"


def test_an_idle_agg_fleet_seeded_from_the_profile_is_not_scaled_up():
    # The H200 seed gives agg its prefill slope from the profile's prompt rows, but those
    # pure-prompt passes are no part of a live agg engine's prefill mix: counted in
    # avg_prefill_tokens (17 prompts and 41 zeros, 2,414 tokens) they made an idle engine's
    # ITL 58 ms against the 50 ms target, and the first load tick grew an idle fleet. Seeded
    # as Dynamo seeds agg (decode rows), the mix is empty until traffic: ITL = t(0, avg decode)
    from fleetplan.models.config import PlannerConfig
    from fleetplan.models.perf_models import make_perf_models
    from fleetplan.sim.profiles import load_profile

    cfg = config_from_dict({**REFERENCE_SIZING, "mode": "agg"})
    model = make_perf_models(PlannerConfig(mode="agg"), load_profile("h200-llama3.1-8b"))["agg"]
    assert model.avg_prefill_tokens == 0.0
    idle = EngineLoads(np.zeros(2), np.zeros(2), np.zeros(2))
    itl = float(model.estimate_itl_ms_many(np.zeros(1), 1.0)[0])
    assert abs(itl - model.estimate_itl_floor_ms(1.0)) < 1e-9 and itl < 10.0
    sig = agg_signal(cfg, model, idle, 0.0, 1.0)
    assert sig.step <= 0 and sig.reason != "scale_up"


def test_agg_threshold_modes_read_the_kv_with_queued_prompts_whatever_the_context_length():
    # Dynamo's easy modes judge agg engines by one figure, (sched + queued KV + queued prefill)
    # / max_kv_tokens. Two engines with 1,000 queued prompt tokens and 1,000 KV each, latency
    # mode: 2 % of a 100,000 cache, under 10 %: released. A prefill vote on queued / context
    # (1,000 / 8,192 = 0.12, over 0.1) scaled the same engines up once context_length was set
    cfg = config_from_dict({"optimization_target": "latency", "mode": "agg", "context_length": 8192,
                            "max_kv_tokens": 100_000})
    engines = _engines("agg", queued_prefill=[1000, 1000], kv=[1000, 1000])
    with_context = threshold_signal(cfg, "agg", engines, 8192, 100_000)
    assert (with_context.step, with_context.reason) == (-1, "scale_down")
    assert threshold_signal(cfg, "agg", engines, None, 100_000) == with_context


def test_a_decode_only_profile_gives_agg_engines_their_kv_cache_size():
    # check_kv_capacity takes a profile that measured the KV cache for a threshold target, but
    # agg's perf model is seeded only from a profile with both row kinds, so the profile's KV
    # size never reached its limits: every agg verdict was insufficient_data, however full
    from dataclasses import replace

    from fleetplan.models.fleet import Fleet
    from fleetplan.models.perf_models import make_perf_models
    from fleetplan.models.planner import Planner
    from fleetplan.sim.profiles import load_profile
    from tests.models.factories import T0, fpm, ready

    decode_only = replace(load_profile("h200-llama3.1-8b"), prefill_isl=[], prefill_ttft_ms=[])
    cfg = config_from_dict({"mode": "agg", "optimization_target": "latency", "max_gpu_budget": 64})
    assert make_perf_models(cfg, decode_only)["agg"].limits.max_kv_tokens == decode_only.max_kv_tokens
    fleet = Fleet(Planner(cfg, profile=decode_only))
    half_full = decode_only.max_kv_tokens // 2  # over latency's 40 % up threshold
    events = [ready("a0", "agg"), *(fpm("a0", "agg", T0 + t, counter=t, decode_reqs=64, decode_kv=half_full)
                                    for t in range(1, 12))]
    reports = [o for o in fleet.run(events) if getattr(o, "load_reasons", None)]
    assert reports and reports[0].load_reasons["agg"] == "scale_up" and reports[0].targets["agg"] == 2
