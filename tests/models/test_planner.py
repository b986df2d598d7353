"""The planning core end to end: both loops, reconcile, guards, decisions."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import _hold_until_scored, _sizing_utilization
from fleetplan.models.throughput import floor_margin
from fleetplan.schemas import ControlEvent, SetAdvisory, SetMinEndpoints
from tests.models.factories import T0, ack, decisions, fpm, ready, requests


def test_throughput_loop_sizes_fleet_like_dynamo(make_fleet):
    # docs/perf-model.md, "Reference figures": 20 rps, ISL 3000 / OSL 150 on H200 8B -> 2 prefill, 1 decode.
    fleet = make_fleet()
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 185)])
    (first,) = [o for o in out if o.time == T0 + 180]
    assert first.throughput_reason == "scale"
    assert abs(first.predicted.rps - 20) < 0.2
    assert 15.0 < first.estimates["prefill"].engine_capacity_rps < 17.0
    assert 48.0 < first.estimates["decode"].engine_capacity_rps < 52.0
    (d,) = decisions(out)
    assert d.targets == {"prefill": 2, "decode": 1}
    assert d.previous == {"prefill": 1, "decode": 1}
    assert d.decision_id == 0 and d.throughput_reason == "scale"


def test_kv_hit_rate_halves_prefill(make_fleet):
    fleet = make_fleet()
    reqs = [r.model_copy(update={"kv_hit_rate": 0.5}) for r in requests(20, T0 + 1, T0 + 185)]
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *reqs])
    # 33.7 rps per prefill engine (reference): 20 rps fits in one.
    cap = [o for o in out if o.time == T0 + 180][0].estimates["prefill"].engine_capacity_rps
    assert 30 < cap < 36
    assert decisions(out) == []


def test_pending_guard_until_ack_then_next_decision(make_fleet):
    fleet = make_fleet()
    base = [ready("p0", "prefill"), ready("d0", "decode")]
    out = fleet.run([*base, *requests(20, T0 + 1, T0 + 365)])
    assert [d.decision_id for d in decisions(out)] == [0]
    reasons = [o.throughput_reason for o in out if o.time == T0 + 360]
    assert reasons == ["scaling_in_progress"]
    # now ack it and double the load: the next decision gets id 1
    fleet2 = make_fleet()
    evs = [*base, *requests(20, T0 + 1, T0 + 180), ack(0, T0 + 200),
           ready("p1", "prefill", T0 + 201), *requests(40, T0 + 180, T0 + 545, tag="s")]
    out2 = fleet2.run(evs)
    ds = decisions(out2)
    assert [d.decision_id for d in ds] == [0, 1]
    assert ds[1].previous == {"prefill": 2, "decode": 1}
    assert ds[1].targets["prefill"] == 3


def test_ack_timeout_releases_guard(make_fleet):
    fleet = make_fleet(ack_timeout_seconds=300)
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 545)])
    # decision 0 at 180 never acked; at 540 (>= 180 + 300) the planner proceeds and re-issues
    assert [d.decision_id for d in decisions(out)] == [0, 1]


def test_a_late_applied_ack_of_a_timed_out_decision_moves_the_baseline(make_fleet):
    """Decision 1 (prefill 2 -> 3) times out; traffic falls back, so no new decision is made; then
    the connector acks decision 1 applied. The fleet now runs 3 prefill engines: the planner must
    plan from them (and bring prefill back to 2), not hold a baseline of 2 for good."""
    fleet = make_fleet(ack_timeout_seconds=300)
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 180), ack(0, T0 + 200),
           *requests(40, T0 + 180, T0 + 360, tag="s"), *requests(20, T0 + 360, T0 + 905, tag="u"),
           ack(1, T0 + 730)]
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    ds = decisions(out)
    assert [(d.decision_id, d.targets["prefill"]) for d in ds[:2]] == [(0, 2), (1, 3)]
    at_720 = [o for o in out if o.time == T0 + 720][0]
    assert at_720.pending_decision_id is None and at_720.decision is None  # timed out, nothing to change
    at_900 = [o for o in out if o.time == T0 + 900][0]
    assert at_900.baseline["prefill"] == 3
    assert at_900.decision is not None and at_900.decision.targets["prefill"] == 2


def test_idle_traffic_scales_to_minimum(make_fleet):
    fleet = make_fleet()
    evs = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode"), ready("d1", "decode")]
    evs += requests(0.01, T0 + 1, T0 + 200)  # a trickle, then silence
    from fleetplan.schemas import ClockEvent

    evs.append(ClockEvent(deployment="d", time=T0 + 400))
    ds = decisions(fleet.run(evs))
    assert ds and ds[0].targets == {"prefill": 1, "decode": 1}


def test_throughput_change_is_capped(make_fleet):
    fleet = make_fleet(max_throughput_scaling_replicas=2)
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(200, T0 + 1, T0 + 182)])
    (d,) = decisions(out)
    assert d.targets["prefill"] == 3  # 1 + 2, although 13 are needed


def test_gpu_budget_never_exceeded(make_fleet):
    fleet = make_fleet(max_gpu_budget=5)
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(200, T0 + 1, T0 + 182)])
    (d,) = decisions(out)
    assert sum(d.targets.values()) <= 5
    assert d.throughput_reason == "gpu_budget_guard_hold"


def test_min_endpoints_by_control_event(make_fleet):
    fleet = make_fleet()
    evs = [ready("p0", "prefill"), ready("d0", "decode"),
           ControlEvent(deployment="d", time=T0 + 2, body=SetMinEndpoints(minimums={"decode": 3})),
           *requests(1, T0 + 1, T0 + 182)]
    (d,) = decisions(fleet.run(evs))
    assert d.targets == {"prefill": 1, "decode": 3} and d.config_version == 1


def test_advisory_decides_but_never_waits(make_fleet):
    fleet = make_fleet()
    evs = [ready("p0", "prefill"), ready("d0", "decode"),
           ControlEvent(deployment="d", time=T0 + 2, body=SetAdvisory(advisory=True)),
           *requests(20, T0 + 1, T0 + 545)]
    ds = decisions(fleet.run(evs))
    assert len(ds) == 1 and ds[0].advisory  # the same advice is not repeated
    assert fleet.states["d"].pending is None


# --- load loop ---------------------------------------------------------------


def _load_fleet(make_fleet, **extra):
    return make_fleet(enable_load_scaling=True, enable_throughput_scaling=False, **extra)


def _engines(t, role, n, **kw):
    return [fpm(f"{role[0]}{i}", role, t, counter=int(t), **kw) for i in range(n)]


def test_load_loop_scales_up_only_when_all_engines_are_hot(make_fleet):
    fleet = _load_fleet(make_fleet)
    evs = [ready("p0", "prefill"), ready("p1", "prefill"), ready("d0", "decode"), ready("d1", "decode")]
    evs += [fpm("p0", "prefill", T0 + 1, queued_prefill=100_000), fpm("p1", "prefill", T0 + 1, queued_prefill=0)]
    evs += _engines(T0 + 1, "decode", 2, decode_reqs=10, decode_kv=30_000)
    out = fleet.run([*evs, fpm("p0", "prefill", T0 + 6, queued_prefill=100_000, counter=6)])
    first = [o for o in out if o.time == T0 + 5][0]
    assert first.load_reasons["prefill"] != "scale_up"
    fleet2 = _load_fleet(make_fleet)
    evs2 = evs[:4] + _engines(T0 + 1, "prefill", 2, queued_prefill=100_000) + evs[6:]
    out2 = fleet2.run([*evs2, fpm("p0", "prefill", T0 + 6, queued_prefill=100_000, counter=6)])
    (d,) = decisions(out2)
    assert d.targets["prefill"] == 3 and d.load_reason == "scale_up"
    assert d.estimates["prefill"].ttft_ms > 500


def test_load_loop_consolidates_idle_engines(make_fleet):
    fleet = _load_fleet(make_fleet)
    evs = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode")]
    evs += _engines(T0 + 1, "prefill", 3, queued_prefill=0)
    evs += _engines(T0 + 1, "decode", 1, decode_reqs=4, decode_kv=12_000)
    (d,) = decisions(fleet.run([*evs, fpm("d0", "decode", T0 + 6, counter=7, decode_reqs=4, decode_kv=12_000)]))
    assert d.targets == {"prefill": 2, "decode": 1} and d.load_reason == "scale_down"


def test_load_loop_refuses_to_consolidate_a_busy_pair(make_fleet):
    fleet = _load_fleet(make_fleet)
    # each of two engines at ~350 ms TTFT: one engine would carry twice the queue, over budget
    evs = [ready("p0", "prefill"), ready("p1", "prefill"), ready("d0", "decode")]
    evs += _engines(T0 + 1, "prefill", 2, queued_prefill=13_000)
    evs += _engines(T0 + 1, "decode", 1, decode_reqs=4, decode_kv=12_000)
    out = fleet.run([*evs, fpm("d0", "decode", T0 + 6, counter=7, decode_reqs=4, decode_kv=12_000)])
    tick = [o for o in out if o.time == T0 + 5][0]
    assert tick.load_reasons["prefill"] == "scale_down_refused_consolidation"
    assert decisions(out) == []


def test_load_loop_needs_full_fpm_coverage(make_fleet):
    fleet = _load_fleet(make_fleet)
    evs = [ready("p0", "prefill"), ready("p1", "prefill"), ready("d0", "decode")]
    evs += [fpm("p0", "prefill", T0 + 1, queued_prefill=100_000), fpm("d0", "decode", T0 + 1, decode_reqs=1, decode_kv=10)]
    out = fleet.run([*evs, fpm("d0", "decode", T0 + 6, counter=3)])
    tick = [o for o in out if o.time == T0 + 5][0]
    assert tick.load_reasons["prefill"] == "worker_count_mismatch"


def test_throughput_floor_caps_load_scale_down(make_fleet):
    """Dynamo's order: before the first throughput floor the load loop sheds an idle-looking
    engine; once the floor is set, its scale-downs stop there and the fleet goes back up to it."""
    fleet = make_fleet(enable_load_scaling=True)
    evs = [ready(f"p{i}", "prefill") for i in range(2)] + [ready("d0", "decode")]
    evs += requests(20, T0 + 1, T0 + 191)
    for t in range(1, 191, 5):
        evs += _engines(T0 + t, "prefill", 2, queued_prefill=0)
        evs += _engines(T0 + t, "decode", 1, decode_reqs=4, decode_kv=12_000)
    evs.append(ack(0, T0 + 7))  # the connector applied the first decision
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    first, second = decisions(out)
    assert first.time == T0 + 5 and first.load_reason == "scale_down" and first.targets["prefill"] == 1
    # the two engines still report, but the fleet is at its floor of one: each later release is clamped
    assert all(o.load_reason == "reconcile_clamped_to_floor" and o.decision is None
               for o in out if T0 + 5 < o.time < T0 + 180)
    at_180 = [o for o in out if o.time == T0 + 180][0]
    assert at_180.throughput_reason == "set_lower_bound"
    assert at_180.lower_bound == {"prefill": 2, "decode": 1}
    assert at_180.load_reason == "scale_down_capped_by_throughput"
    assert second is at_180.decision and second.targets == {"prefill": 2, "decode": 1}


def test_scale_down_capped_by_throughput_reason(make_fleet):
    fleet = make_fleet(enable_load_scaling=True)
    evs = [ready(f"p{i}", "prefill") for i in range(2)] + [ready("d0", "decode")]
    evs += requests(20, T0 + 1, T0 + 191)
    for t in range(181, 191, 5):
        evs += _engines(T0 + t, "prefill", 2, queued_prefill=0)
        evs += _engines(T0 + t, "decode", 1, decode_reqs=4, decode_kv=12_000)
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    tick = [o for o in out if o.time == T0 + 185][0]
    assert tick.load_reason == "scale_down_capped_by_throughput"
    assert tick.targets["prefill"] == 2


def test_a_capped_scale_down_does_not_relabel_a_scale_up(make_fleet):
    """Prefill's scale-down held at the throughput floor while decode scales up: the decision is
    a scale-up (Dynamo's priority: scale_up over scale_down_capped_by_throughput), and prefill's
    own reason says it was capped, not released."""
    fleet = make_fleet(enable_load_scaling=True)
    evs = [ready(f"p{i}", "prefill") for i in range(2)] + [ready("d0", "decode")]
    evs += requests(20, T0 + 1, T0 + 191)
    for t in range(181, 191, 5):
        evs += _engines(T0 + t, "prefill", 2, queued_prefill=0)
        evs += _engines(T0 + t, "decode", 1, decode_reqs=256, decode_kv=900_000, queued_kv=900_000)
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    tick = [o for o in out if o.time == T0 + 185][0]
    assert tick.decision is not None and tick.decision.targets == {"prefill": 2, "decode": 2}
    assert tick.load_reason == "scale_up" and tick.decision.load_reason == "scale_up"
    assert tick.load_reasons == {"prefill": "scale_down_capped_by_throughput", "decode": "scale_up"}



def _a_queue_then_the_floor(make_fleet, *extra):
    """One prefill and one decode engine; a queue at T0 + 175 scales prefill up (acked at
    T0 + 183), and the throughput floor at T0 + 180 asks for more of both."""
    fleet = make_fleet(enable_load_scaling=True)
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(60, T0 + 1, T0 + 199), ack(0, T0 + 183), *extra]
    for t in range(1, 200, 5):
        evs += [fpm("p0", "prefill", T0 + t, wall=0.0, counter=t, queued_prefill=30_000 if 170 < t < 180 else 0),
                fpm("d0", "decode", T0 + t, wall=0.0, counter=t, decode_reqs=4, decode_kv=12_000)]
    return fleet.run(sorted(evs, key=lambda e: e.time))


def test_a_raise_to_the_throughput_floor_after_its_tick_says_scale_up(make_fleet):
    """The floor set at T0 + 180 while a scale-up was in flight raises the fleet at the first
    load tick after the ack. That decision said throughput ``not_due`` and load ``no_change``,
    nothing that explained it; as in Dynamo (the target above the current count), it is a
    ``scale_up``, for each role the floor raised."""
    out = _a_queue_then_the_floor(make_fleet)
    first, raised = decisions(out)
    assert first.time == T0 + 175 and first.load_reason == "scale_up"
    assert raised.time == T0 + 185 and raised.targets == {"prefill": 4, "decode": 2}
    assert raised.load_reason == "scale_up"
    tick = next(o for o in out if o.time == T0 + 185)
    assert tick.load_reasons == {"prefill": "scale_up", "decode": "scale_up"}


def test_a_raise_to_the_throughput_floor_while_engines_start_says_scale_up(make_fleet):
    """As above, with the inventory an orchestrator writes: the scale-up acked at T0 + 183 has its
    engine starting, so the load loop holds (scaling_in_progress) at T0 + 185, but the floor still
    grows the fleet. That decision said throughput ``not_due`` and load ``scaling_in_progress``, a
    hold, for a decision that scales up two roles."""
    out = _a_queue_then_the_floor(make_fleet, ready("p1", "prefill", T0 + 183, state="starting"))
    first, raised = decisions(out)
    assert first.time == T0 + 175 and first.load_reason == "scale_up"
    assert raised.time == T0 + 185 and raised.targets == {"prefill": 4, "decode": 2}
    assert raised.throughput_reason == "not_due" and raised.load_reason == "scale_up"
    tick = next(o for o in out if o.time == T0 + 185)
    assert tick.load_reasons == {"prefill": "scale_up", "decode": "scale_up"}


def test_a_scale_down_held_at_the_replica_floor_is_not_reported_as_one(make_fleet):
    """Two idle prefill engines at prefill_min_endpoint 2: the load loop's release is undone by the
    floor, so no tick may say scale_down while the fleet stays (Dynamo: no_change)."""
    fleet = _load_fleet(make_fleet, prefill_min_endpoint=2)
    evs = [ready("p0", "prefill"), ready("p1", "prefill"), ready("d0", "decode")]
    for t in range(1, 20, 5):
        evs += _engines(T0 + t, "prefill", 2, queued_prefill=0)
        evs += _engines(T0 + t, "decode", 1, decode_reqs=4, decode_kv=12_000)
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    assert out and decisions(out) == []
    assert all(o.targets["prefill"] == 2 for o in out)
    assert all(o.load_reason == "reconcile_clamped_to_floor" for o in out)
    assert all(o.load_reasons["prefill"] == "reconcile_clamped_to_floor" for o in out)


def test_a_scale_up_held_by_the_gpu_budget_is_not_reported_as_one(make_fleet):
    """One prefill and one decode engine fill max_gpu_budget 2: prefill's scale-up is held, and
    its own reason says so, as a move the replica bounds undo does (it said scale_up)."""
    fleet = _load_fleet(make_fleet, max_gpu_budget=2)
    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    for t in range(1, 12, 5):
        evs += _engines(T0 + t, "prefill", 1, queued_prefill=100_000)
        evs += _engines(T0 + t, "decode", 1, decode_reqs=4, decode_kv=12_000)
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    assert out and decisions(out) == []
    assert all(o.load_reason == "gpu_budget_guard_hold" for o in out)
    assert all(o.load_reasons == {"prefill": "gpu_budget_guard_hold", "decode": "no_change"} for o in out)


def test_threshold_mode_needs_no_profile(make_fleet):
    fleet = make_fleet(profile=False, optimization_target="throughput", max_kv_tokens=100_000,
                       context_length=8192)
    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    evs += [fpm("p0", "prefill", T0 + 1, queued_prefill=9000), fpm("d0", "decode", T0 + 1, decode_kv=1000)]
    (d,) = decisions(fleet.run([*evs, fpm("d0", "decode", T0 + 6, counter=2, decode_kv=1000)]))
    assert d.targets == {"prefill": 2, "decode": 1}


def test_agg_mode(make_fleet):
    fleet = make_fleet(mode="agg")
    out = fleet.run([ready("a0", "agg"), *requests(30, T0 + 1, T0 + 182)])
    tick = [o for o in out if o.time == T0 + 180][0]
    assert tick.estimates["agg"].engine_capacity_rps > 0
    ds = decisions(out)
    assert ds and ds[0].targets == {"agg": 3}  # 30 rps over ~10.8 rps per engine


def test_deployments_are_independent(make_fleet):
    fleet = make_fleet()
    a = [ready("p0", "prefill", dep="a"), ready("d0", "decode", dep="a"), *requests(20, T0 + 1, T0 + 182, dep="a")]
    b = [ready("p0", "prefill", dep="b"), ready("d0", "decode", dep="b"), *requests(1, T0 + 1, T0 + 182, dep="b")]
    ds = decisions(fleet.run(sorted(a + b, key=lambda e: e.time)))
    assert [(d.deployment, d.decision_id) for d in ds] == [("a", 0)]


def test_fpm_batch_equals_one_by_one(make_fleet):
    from fleetplan.schemas import FpmBatch

    fpms = [fpm(f"d{i % 3}", "decode", T0 + 1 + i * 0.01, counter=i, wall=0.01 + (i % 5) * 1e-3,
                decode_reqs=1 + i % 9, decode_kv=1000 * (1 + i % 13)) for i in range(300)]
    one, batched = make_fleet(), make_fleet()
    a, b = one.state("d"), batched.state("d")
    for f in fpms:
        one.planner.apply(a, f)
    batched.planner.apply(b, FpmBatch(deployment="d", time=fpms[-1].time, fpms=fpms))
    assert a.to_data() == b.to_data()


def _warmed_planner(tmp_path, predictor: str):
    """A planner warmed from 10 minutes of Mooncake rows at 2 req/s, ISL 1000 / OSL 100."""
    from fleetplan.bootstrap import build_planner

    trace = tmp_path / "warm.jsonl"
    trace.write_text("".join(
        f'{{"timestamp": {i * 500}, "input_length": 1000, "output_length": 100, "hash_ids": [1]}}\n'
        for i in range(1200)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"load_predictor: {predictor}\nload_predictor_warmup_trace: {trace}\n")
    return build_planner(cfg, "h200-llama3.1-8b")


def test_warm_start_from_a_trace(tmp_path):
    """`load_predictor_warmup_trace` warms the forecaster before the first window."""
    planner = _warmed_planner(tmp_path, "constant")
    # three full 180 s windows of 360 requests and the trailing 60 s (120), as Dynamo buckets
    assert [o.num_req for o in planner.warmup] == [360.0, 360.0, 360.0, 120.0]
    assert planner.new_state("d").forecaster.forecast() == (120.0, 1000.0, 100.0)


def test_a_warm_up_trace_calibrates_the_sizing_quantile_on_its_bursts(tmp_path):
    """The sizing quantile is of each window's busiest ``burst_window_seconds``: a warm-up trace's
    windows are fed theirs, as live windows are. Fed its window counts as peaks, a warmed P90 was
    conformal on the first tick and yet a P90 of counts: here a third of the busiest minute, and
    on lognormal traffic whose busiest minute runs 20 % over the window's mean, exceeded on 31 %
    of the next 40 windows (9 % after a cold start)."""
    from fleetplan.bootstrap import build_planner

    trace = tmp_path / "bursts.jsonl"
    # twelve 180-s windows, each with its 360 requests in its first minute
    trace.write_text("".join(
        f'{{"timestamp": {w * 180_000 + i * 166}, "input_length": 1000, "output_length": 100, "hash_ids": [1]}}\n'
        for w in range(12) for i in range(360)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"load_predictor: constant\nload_predictor_warmup_trace: {trace}\n")
    forecaster = build_planner(cfg, "h200-llama3.1-8b").new_state("d").forecaster
    assert forecaster.forecast()[0] == 360.0 and forecaster.calibrated(0.9, 1)
    assert forecaster.quantile(0.9, 1) == pytest.approx(3 * 360.0)  # the busiest minute, as a window count
    assert forecaster.quantile(0.9, 1, of="window") == pytest.approx(360.0)


sizes = st.integers(0, 6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rate=st.floats(0, 120), lo=sizes, hi=st.integers(3, 12), budget=st.integers(2, 20),
       prefill=sizes, decode=sizes)
def test_targets_never_break_bounds_or_budget(make_fleet, rate, lo, hi, budget, prefill, decode):
    fleet = make_fleet(min_endpoint=min(lo, hi), max_endpoint=hi, max_gpu_budget=budget)
    evs = [ready(f"p{i}", "prefill") for i in range(prefill)] + [ready(f"d{i}", "decode") for i in range(decode)]
    evs += requests(rate, T0 + 1, T0 + 182) if rate >= 0.01 else []
    from fleetplan.schemas import ClockEvent

    evs.append(ClockEvent(deployment="d", time=T0 + 182))
    for d in decisions(fleet.run(evs)):
        assert sum(d.targets.values()) <= budget
        for n in d.targets.values():
            assert n <= hi
            assert n >= min(lo, hi) or sum(d.targets.values()) + 1 > budget


def test_target_utilization_keeps_headroom(make_fleet):
    # 20 rps over 15.44 rps per prefill engine: 2 engines at 100%, 2 at 80% (16 / 12.35 -> 2)
    for util, expected in ((1.0, 2), (0.8, 2), (0.6, 3)):
        fleet = make_fleet(target_utilization=util)
        (d,) = decisions(fleet.run([ready("p0", "prefill"), ready("d0", "decode"),
                                    *requests(20, T0 + 1, T0 + 182)]))
        assert d.targets["prefill"] == expected, util


def test_hold_scale_down_until_the_first_floor(make_fleet):
    evs = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode")]
    evs += _engines(T0 + 1, "prefill", 3, queued_prefill=0)
    evs += _engines(T0 + 1, "decode", 1, decode_reqs=4, decode_kv=12_000)
    evs.append(fpm("d0", "decode", T0 + 6, counter=7, decode_reqs=4, decode_kv=12_000))
    # Dynamo's behaviour: the idle start sheds a prefill engine at once
    assert decisions(make_fleet(enable_load_scaling=True).run(list(evs)))
    held = make_fleet(enable_load_scaling=True, hold_scale_down_until_floor=True).run(list(evs))
    assert decisions(held) == []
    assert [o for o in held if o.time == T0 + 5][0].load_reasons["prefill"] == "scale_down_capped_by_throughput"


def test_windows_carry_their_start_to_the_daily_cycle(make_fleet):
    """The ensemble's daily phase is the window's event time, not a count of windows."""
    fleet = make_fleet(load_predictor="ensemble")
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 545)])
    ticks = [o for o in out if getattr(o, "observed", None) is not None]
    assert [o.observed.start_s for o in ticks] == [T0, T0 + 180, T0 + 360]
    count = fleet.state("d").forecaster.forecaster.predictors[0]
    model = count.to_state()["model"]
    assert model["timed"] and model["clock"] == (T0 + 540) // 180  # the next window's start


def test_an_ensemble_warmed_from_a_trace_moves_onto_the_window_clock(tmp_path):
    """The warm-up's windows are counted; the first live window sets the time of day."""
    from fleetplan.models.fleet import Fleet

    fleet = Fleet(_warmed_planner(tmp_path, "ensemble"))
    count = fleet.planner.new_state("d").forecaster.forecaster.predictors[0].to_state()["model"]
    assert (count["timed"], count["clock"]) == (False, 4)  # four warm-up windows, counted
    fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 185)])
    count = fleet.state("d").forecaster.forecaster.predictors[0].to_state()["model"]
    assert count["timed"] and count["clock"] == (T0 + 180) // 180


def test_requests_at_the_largest_accept_length_size_a_finite_fleet(make_fleet):
    """Every request at the schema's largest accept length (MAX_ACCEPT_LENGTH, 256 tokens a
    step): decode's capacity is large but finite and the tick decides. At 1e307, which
    the schema took until 2026-12-05, the capacity was infinite and the tick raised."""
    from fleetplan.schemas.events import MAX_ACCEPT_LENGTH

    fleet = make_fleet(sizing="fleetplan")
    reqs = [r.model_copy(update={"accept_length": MAX_ACCEPT_LENGTH}) for r in requests(20, T0 + 1, T0 + 185)]
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *reqs])
    (tick,) = [o for o in out if o.time == T0 + 180]
    assert tick.throughput_reason in ("scale", "set_lower_bound", "no_change")
    assert math.isfinite(tick.estimates["decode"].engine_capacity_rps)


def test_a_worker_stuck_starting_stops_holding_the_load_loop_after_the_ack_timeout(make_fleet):
    """A scale-up pod Pending with no GPU stays `starting`. It holds the load loop as a
    scaling operation in flight, but only for ack_timeout_seconds (Dynamo #14251: the
    planner never scaled down; fleetplan did not either until 2026-12-05)."""
    import numpy as np

    from fleetplan.schemas import ClockEvent

    def run(stuck: bool):
        fleet = make_fleet(enable_load_scaling=True, ack_timeout_seconds=600)
        evs = [*(ready(f"p{i}", "prefill") for i in range(4)), ready("d0", "decode")]
        if stuck:
            evs.append(ready("p9", "prefill", state="starting"))
        for t in np.arange(1.0, 1000, 5.0):
            evs += [fpm(f"p{i}", "prefill", T0 + t, counter=int(t)) for i in range(4)]
            evs.append(fpm("d0", "decode", T0 + t, counter=int(t), decode_reqs=1, decode_kv=3000))
        evs += requests(1, T0 + 1, T0 + 1000)
        return decisions(fleet.run([*sorted(evs, key=lambda e: e.time), ClockEvent(deployment="d", time=T0 + 1000)]))

    (healthy, *_) = run(stuck=False)
    assert healthy.time == T0 + 5 and healthy.targets["prefill"] == 3
    (unstuck, *_) = run(stuck=True)
    assert unstuck.time == T0 + 605  # the first load tick after it had been starting 600 s (from T0 + 0.1)
    assert unstuck.targets["prefill"] < 5 and unstuck.load_reason == "scale_down"


def _discovered_fleet(make_fleet, prefill: int, until: float):
    """``prefill`` prefill engines and one decode engine known only from their FPMs (no inventory),
    each passing once a second, and 20 rps of finished requests (2 prefill engines' worth)."""
    fleet = make_fleet()
    engines = [f"p{i}" for i in range(prefill)]
    passes = [fpm(w, "prefill" if w.startswith("p") else "decode", T0 + s + 0.5)
              for s in range(int(until - T0)) for w in [*engines, "d0"]]
    out = fleet.run(sorted([*passes, *requests(20, T0 + 1, until)], key=lambda e: e.time))
    return fleet, out


def test_the_ack_of_a_scale_down_times_no_startup(make_fleet):
    """Without inventory the applied ack of a scale-up times a startup; a decision that only
    released engines started none, and its ack (seconds, not minutes) is no startup."""
    from fleetplan.schemas import Ack, ClockEvent

    fleet, out = _discovered_fleet(make_fleet, 3, T0 + 185)
    (d,) = decisions(out)
    assert d.previous == {"prefill": 3, "decode": 1} and d.targets == {"prefill": 2, "decode": 1}
    fleet.run([Ack(deployment="d", time=d.time + 5.0, decision_id=d.decision_id, status="applied",
                   observed=dict(d.targets)), ClockEvent(deployment="d", time=T0 + 361)])
    state = fleet.state("d")
    assert state.desired == d.targets and state.startup_samples == []


def test_workers_still_starting_count_as_the_fleet(make_fleet):
    """Before any ack the fleet is what inventory names, starting workers included: one already
    starting is not asked for again."""
    fleet = make_fleet()
    out = fleet.run([ready("p0", "prefill"), ready("p1", "prefill", state="starting"), ready("d0", "decode"),
                     *requests(20, T0 + 1, T0 + 185)])
    (tick,) = [o for o in out if o.time == T0 + 180]
    assert tick.baseline == {"prefill": 2, "decode": 1} and tick.targets == {"prefill": 2, "decode": 1}
    assert decisions(out) == []


def test_a_failed_ack_leaves_the_fleet_where_it_was(make_fleet):
    """Only an ``applied`` ack says the fleet reached a decision's targets; after a failed one the
    planner plans from the counts it had, and asks again."""
    fleet = make_fleet()
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 365),
           ack(0, T0 + 200, status="failed")]
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    ds = decisions(out)
    assert [(d.decision_id, d.targets["prefill"]) for d in ds] == [(0, 2), (1, 2)]
    assert ds[1].previous == {"prefill": 1, "decode": 1}


def test_a_late_ack_of_a_timed_out_decision_after_a_newer_one_was_applied_changes_nothing(make_fleet):
    """Decision 1 times out; decision 2 is made and applied; then decision 1's applied ack comes:
    the fleet is past it (docs/planner.md: remembered until a newer one is acked)."""
    fleet = make_fleet(ack_timeout_seconds=300)
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 180), ack(0, T0 + 200),
           *requests(40, T0 + 180, T0 + 540, tag="s"), *requests(60, T0 + 540, T0 + 905, tag="u"),
           ack(2, T0 + 730), ack(1, T0 + 740)]
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    ds = decisions(out)
    assert [d.decision_id for d in ds] == [0, 1, 2] and ds[2].time == T0 + 720
    at_900 = [o for o in out if o.time == T0 + 900][0]
    assert at_900.baseline == ds[2].targets and at_900.decision is None


def test_the_ack_timeout_ends_on_the_tick_it_runs_out(make_fleet):
    """A decision unanswered for ``ack_timeout_seconds`` is given up at that tick, not one later:
    the default 1,800 s is ten 180-s windows, so the timeout always lands on a tick (here 180 s)."""
    fleet = make_fleet(ack_timeout_seconds=180)
    out = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 365)])
    ds = decisions(out)
    assert [(d.decision_id, d.time) for d in ds] == [(0, T0 + 180), (1, T0 + 360)]



def _warm_fleet():
    """A warm fleet's engines, ready at the start: 3 prefill and 4 decode."""
    return [ready(f"p{i}", "prefill") for i in range(3)] + [ready(f"d{i}", "decode") for i in range(4)]


def _first_ticks(make_fleet, hold: str, floor_headroom: str = "none"):
    """Fleetplan's sizing on a warm fleet of 3 prefill and 4 decode engines under 20 rps that 2 and 1
    serve, ticked three times (the startup horizon is 2 windows: 120 s of startup and a 180-s window).

    Prefill's floor takes no headroom for the forecast's error here (``floor_headroom: none``), so
    the first tick releases a prefill engine and the roles each hold keeps differ; with it, 3 stay.
    """
    fleet = make_fleet(sizing="fleetplan", hold_until_scored=hold, floor_headroom=floor_headroom)
    evs = _warm_fleet()
    evs += [*requests(20, T0 + 1, T0 + 545), ack(0, T0 + 200), ack(1, T0 + 380)]
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    return {o.time - T0: o for o in out if o.time - T0 in (180, 360, 540)}


def test_decode_keeps_its_engines_until_the_quantile_has_scored_a_forecast(make_fleet):
    ticks = _first_ticks(make_fleet, "decode")
    first = ticks[180]
    assert first.estimates["decode"].queueing_replicas == 1  # decode's own count releases 3 engines
    assert first.targets == {"prefill": 2, "decode": 4}  # prefill, whose rate count keeps its headroom, is not held
    assert first.predicted.quantile_calibrated is False
    # the first forecast spans two windows: until both have closed, decode is all the hold keeps
    assert ticks[360].targets == {"prefill": 2, "decode": 4}
    assert ticks[360].throughput_reason == "held_until_scored" and ticks[360].decision is None
    assert ticks[540].targets == {"prefill": 2, "decode": 1} and ticks[540].throughput_reason == "scale"


@pytest.mark.parametrize("hold, first_targets, reason", [
    ("none", {"prefill": 2, "decode": 1}, "scale"),
    ("all", {"prefill": 3, "decode": 4}, "held_until_scored"),
])
def test_hold_until_scored_names_the_roles_held(make_fleet, hold, first_targets, reason):
    first = _first_ticks(make_fleet, hold)[180]
    assert first.targets == first_targets and first.throughput_reason == reason


@pytest.mark.parametrize("hold, bound", [(None, {"prefill": 3, "decode": 4}),  # all, the default since 2026-12-07
                                         ("decode", {"prefill": 2, "decode": 4})])
def test_with_the_load_loop_the_hold_is_in_the_throughput_lower_bound(make_fleet, hold, bound):
    held = {} if hold is None else {"hold_until_scored": hold}
    fleet = make_fleet(sizing="fleetplan", enable_load_scaling=True, floor_headroom="none", **held)
    evs = _warm_fleet()
    out = fleet.run([*evs, *requests(20, T0 + 1, T0 + 185)])
    (first,) = [o for o in out if o.time == T0 + 180]
    assert first.throughput_reason == "set_lower_bound"
    assert first.lower_bound == bound


def test_the_hold_does_not_delay_the_minimum_when_traffic_stops(make_fleet):
    """Forecasts of zero traffic pool their errors apart; the fleet still goes to its minimum when it did."""
    from fleetplan.schemas import ClockEvent

    def reached_minimum(hold: str) -> float:
        fleet = make_fleet(sizing="fleetplan", hold_until_scored=hold)
        evs = _warm_fleet()
        evs += [*requests(60, T0 + 1, T0 + 1260), *(ClockEvent(deployment="d", time=T0 + t) for t in (1440, 1620, 1800))]
        decided = []
        for event in sorted(evs, key=lambda e: e.time):
            for o in fleet.run([event]):
                if o.decision is not None:
                    decided.append(o)
                    fleet.run([ack(o.decision.decision_id, o.time + 1)])
        return min(d.time for d in decided if d.decision.targets == {"prefill": 1, "decode": 1}) - T0

    assert reached_minimum("all") == reached_minimum("decode") == reached_minimum("none") == 1800


@settings(max_examples=200, deadline=None)
@given(
    hold=st.sampled_from(["none", "decode", "all"]),
    targets=st.fixed_dictionaries({"prefill": st.integers(1, 64), "decode": st.integers(1, 64)}),
    baseline=st.fixed_dictionaries({"prefill": st.integers(1, 64), "decode": st.integers(1, 64)}),
    coverage=st.one_of(st.none(), st.just(0.0), st.floats(0.01, 0.9)),
)
def test_the_hold_only_keeps_engines_the_fleet_has(hold, targets, baseline, coverage):
    """Whatever the counts: a held role keeps at most its current engines above what its counts ask,
    a scale-up is never cut, nothing is held once a forecast is scored or without a quantile."""
    cfg = config_from_dict({"hold_until_scored": hold})
    out = _hold_until_scored(cfg, targets, baseline, coverage)
    held = {"none": (), "decode": ("decode",), "all": ("prefill", "decode")}[hold]
    for role in targets:
        if role in held and coverage == 0.0:
            assert out[role] == max(targets[role], baseline[role])
        else:
            assert out[role] == targets[role]


def test_prefills_floor_keeps_the_headroom_for_the_forecasts_error_until_it_is_scored(make_fleet):
    """The first tick sizes for the largest burst seen, which covers half the windows: the rate count
    keeps target_utilization's headroom for that, and the floor now the same share of it."""
    without, with_margin = _first_ticks(make_fleet, "decode"), _first_ticks(make_fleet, "decode", "coverage")
    first = with_margin[180]
    assert first.predicted.quantile_calibrated is False
    assert first.predicted.floor_margin == pytest.approx(0.9 / 0.8)  # calibrated over target utilisation
    assert without[180].predicted.floor_margin == 1.0
    assert first.estimates["prefill"].queueing_replicas == 3 > without[180].estimates["prefill"].queueing_replicas
    assert first.targets == {"prefill": 3, "decode": 4}  # decode held, as before; prefill kept by its floor


def test_the_floors_margin_is_gone_once_the_quantile_is_conformal(make_fleet):
    """Calibrated, the quantile carries the forecast's error: both settings size the floor alike."""
    def ticks(floor_headroom: str):
        fleet = make_fleet(sizing="fleetplan", floor_headroom=floor_headroom)
        evs = _warm_fleet()
        out = fleet.run(sorted([*evs, *requests(20, T0 + 1, T0 + 180 * 14 + 5)], key=lambda e: e.time))
        return [o for o in out if o.predicted is not None and o.predicted.quantile_calibrated]

    calibrated, without = ticks("coverage"), ticks("none")
    assert len(calibrated) >= 2 and [o.time for o in calibrated] == [o.time for o in without]
    for a, b in zip(calibrated, without, strict=True):
        assert a.predicted.floor_margin == 1.0
        assert a.estimates["prefill"].queueing_replicas == b.estimates["prefill"].queueing_replicas


@settings(max_examples=200, deadline=None)
@given(
    floor_headroom=st.sampled_from(["none", "coverage"]),
    target=st.floats(0.3, 1.0), calibrated=st.one_of(st.none(), st.floats(0.3, 1.0)),
    uncalibrated=st.sampled_from(["full", "coverage"]), coverage=st.floats(0.0, 0.9),
)
def test_the_floors_margin_is_the_rate_counts_headroom_for_the_error(floor_headroom, target, calibrated,
                                                                      uncalibrated, coverage):
    """margin × the share sized at is calibrated_utilization: the floor takes exactly the headroom the
    rate count keeps beyond the queue's, never less than none, and none once the quantile is conformal."""
    cfg = config_from_dict({"floor_headroom": floor_headroom, "target_utilization": target,
                            "calibrated_utilization": calibrated, "uncalibrated_headroom": uncalibrated})
    share = _sizing_utilization(cfg, coverage)
    margin = floor_margin(cfg, share)
    assert margin >= 1.0
    if floor_headroom == "none" or calibrated is None or calibrated <= share:
        assert margin == 1.0
    else:
        assert margin * share == pytest.approx(calibrated)
    assert floor_margin(cfg, _sizing_utilization(cfg, cfg.sizing_quantile)) == 1.0
    assert floor_margin(cfg, None) == 1.0  # sized for the point: no quantile, no margin


def test_an_aggregated_deployment_is_held_only_when_every_role_is():
    """Its engines' count is a rate count with target_utilization's headroom, as prefill's is."""
    targets, baseline = {"agg": 2}, {"agg": 5}
    for hold, kept in (("none", 2), ("decode", 2), ("all", 5)):
        cfg = config_from_dict({"mode": "agg", "hold_until_scored": hold})
        assert _hold_until_scored(cfg, targets, baseline, 0.0) == {"agg": kept}
