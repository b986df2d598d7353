"""The load loop past Dynamo's ±1: a scale-up sized to the shortfall, scale-downs held, and a floor from the measured traffic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.load import EngineLoads, prefill_signal
from fleetplan.models.perf import seeded_perf_model
from fleetplan.schemas import ClockEvent, RequestArrival
from fleetplan.sim.profiles import load_profile
from tests.models.factories import T0, decisions, fpm, ready, requests


@pytest.fixture(scope="module")
def prefill_model():
    return seeded_perf_model(load_profile("h200-llama3.1-8b"), "prefill")


def _queues(*tokens: float) -> EngineLoads:
    q = np.array(tokens, dtype=np.float64)
    return EngineLoads(q, np.zeros_like(q), np.zeros_like(q))


def _worst_ttft(model, loads: EngineLoads, scale: float) -> float:
    return float(model.estimate_ttft_ms_many(loads.queued_prefill, 0.0, queue_scale=scale).max())


@pytest.mark.parametrize("queued", [16_000.0, 24_000.0, 40_000.0])
def test_scale_up_adds_the_fewest_engines_that_bring_every_engine_back(prefill_model, queued):
    cfg = config_from_dict({"load_max_scale_up_step": 8})
    loads = _queues(queued, queued * 1.1, queued * 1.2)
    assert _worst_ttft(prefill_model, loads, 1.0) > cfg.ttft_ms  # all three over: a scale-up
    sig = prefill_signal(cfg, prefill_model, loads, 0.0)
    n, k = len(loads), sig.step
    assert sig.reason == "scale_up" and 1 <= k < cfg.load_max_scale_up_step
    assert _worst_ttft(prefill_model, loads, n / (n + k)) <= cfg.ttft_ms
    assert k == 1 or _worst_ttft(prefill_model, loads, n / (n + k - 1)) > cfg.ttft_ms


def test_scale_up_is_capped_and_dynamo_adds_one(prefill_model):
    backlog = _queues(400_000.0, 400_000.0)  # minutes of prompts: no step within the cap is enough
    assert prefill_signal(config_from_dict({"load_max_scale_up_step": 8}), prefill_model, backlog, 0.0).step == 8
    assert prefill_signal(config_from_dict({"load_max_scale_up_step": 3}), prefill_model, backlog, 0.0).step == 3
    assert prefill_signal(config_from_dict(dict(REFERENCE_SIZING)), prefill_model, backlog, 0.0).step == 1


def _idle_fleet(until: float, hot_at: float | None = None) -> list:
    """Three idle prefill engines and one decode engine, reporting every 5 s until ``until``.

    At ``hot_at`` one prefill engine reports a long queue: the others could not take it.
    """
    evs = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode")]
    for t in np.arange(1.0, until - T0, 5.0):
        hot = hot_at is not None and abs(T0 + t - hot_at) < 1
        evs += [fpm(f"p{i}", "prefill", T0 + t, queued_prefill=100_000 if hot and i == 0 else 0, counter=int(t))
                for i in range(3)]
        evs.append(fpm("d0", "decode", T0 + t, counter=int(t), decode_reqs=4, decode_kv=12_000))
    evs.append(ClockEvent(deployment="d", time=until))
    return evs


def _load_only(make_fleet, **config):
    return make_fleet(enable_load_scaling=True, enable_throughput_scaling=False, **config)


def test_an_engine_is_released_after_one_startup_of_spare_verdicts(make_fleet):
    dynamo = decisions(_load_only(make_fleet).run(_idle_fleet(T0 + 200)))
    assert dynamo[0].time == T0 + 5  # the first verdict releases
    # null: one startup (configured, 120 s, until one is measured) of verdicts, from the first at T0 + 5
    held = _load_only(make_fleet, sizing="fleetplan", startup_seconds=120,
                      load_scale_down_stabilization_seconds=None).run(_idle_fleet(T0 + 200))
    (first, *_) = decisions(held)
    assert first.time == T0 + 125 and first.targets["prefill"] == 2 and first.load_reason == "scale_down"
    waiting = [o for o in held if T0 + 5 <= o.time < T0 + 125]
    assert waiting and all(o.load_reasons["prefill"] == "scale_down_stabilizing" for o in waiting)
    short = decisions(_load_only(make_fleet, load_scale_down_stabilization_seconds=30).run(_idle_fleet(T0 + 200)))
    assert short[0].time == T0 + 35


def test_a_busy_verdict_restarts_the_wait(make_fleet):
    out = _load_only(make_fleet, load_scale_down_stabilization_seconds=30).run(
        _idle_fleet(T0 + 200, hot_at=T0 + 21))
    # spare from T0 + 5; at T0 + 25 one engine's queue refuses consolidation; spare again from T0 + 30
    assert decisions(out)[0].time == T0 + 60


def test_the_wait_starts_again_after_each_release(make_fleet):
    fleet = _load_only(make_fleet, load_scale_down_stabilization_seconds=30)
    evs = _idle_fleet(T0 + 200)
    out = fleet.run(evs)
    (first,) = decisions(out)  # unacknowledged: the loop holds while it is in flight
    assert first.time == T0 + 35
    assert not fleet.state("d").down_since


def test_a_release_the_replica_floor_undid_does_not_restart_the_wait(make_fleet):
    """Spare verdicts from T0 + 5 on, the release held at prefill_min_endpoint 3 until a
    set_min_endpoints lowers it at T0 + 62: the run is 57 s long, past the 30 s wait, so the
    engine goes at the next tick. The release the floor undid at T0 + 35 restarted the run, as
    if it had happened, and the engine waited 5 s more, each tick between saying
    scale_down_stabilizing and reconcile_clamped_to_floor by turns."""
    from fleetplan.schemas import ControlEvent, SetMinEndpoints

    fleet = _load_only(make_fleet, load_scale_down_stabilization_seconds=30, prefill_min_endpoint=3)
    evs = [*_idle_fleet(T0 + 100),
           ControlEvent(deployment="d", time=T0 + 62, body=SetMinEndpoints(minimums={"prefill": 1}))]
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    (first,) = decisions(out)
    assert first.time == T0 + 65 and first.targets["prefill"] == 2
    held = [o for o in out if T0 + 35 <= o.time < T0 + 65]
    assert all(o.load_reasons["prefill"] == "reconcile_clamped_to_floor" for o in held)


def test_down_verdicts_round_trip_and_old_state_restores(make_fleet):
    from fleetplan.models.state import DeploymentState

    fleet = _load_only(make_fleet, load_scale_down_stabilization_seconds=60)
    fleet.run(_idle_fleet(T0 + 40))
    state = fleet.state("d")
    assert state.down_since == {"prefill": T0 + 5}
    data = state.to_data()
    assert DeploymentState.from_data(data).to_data() == data
    del data["down_since"]  # written before the wait existed
    assert DeploymentState.from_data(data).down_since == {}


def test_without_the_throughput_loop_the_window_stays_bounded(make_fleet):
    fleet = _load_only(make_fleet)
    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    evs += [RequestArrival(deployment="d", time=T0 + 1 + i / 10, request_id=f"a{i}", input_tokens=100)
            for i in range(10 * 1000)]
    fleet.run([*evs, ClockEvent(deployment="d", time=T0 + 1002)])
    window = fleet.state("d").window
    # the throughput interval (180 s) is the most a window holds, one count per second
    assert 0 < len(window.second_arrivals) <= 180


# --- without the throughput loop: the floor the measured traffic sets -----------------------


def _prefill_rps(make_fleet) -> float:
    """One prefill engine's SLA-bound rate at the test traffic's lengths (3,000 in, 150 out)."""
    from fleetplan.models.throughput import engine_capacity

    fleet = _load_only(make_fleet, sizing="fleetplan")
    state = fleet.planner.new_state("d")
    return engine_capacity(state.perf["prefill"], state.config, 3000, 150).rps


def _with_traffic(rate: float, until: float) -> list:
    """The idle-looking fleet of ``_idle_fleet`` while requests arrive at ``rate`` from T0 + 1."""
    evs = _idle_fleet(until)
    clock = evs.pop()
    return sorted([*evs, *requests(rate, T0 + 1, until)], key=lambda e: e.time) + [clock]


@pytest.mark.parametrize("interval", [180, 60, 30])
def test_a_load_only_fleet_keeps_what_the_measured_traffic_needs(make_fleet, interval):
    # the traffic needs the three prefill engines (2.2 engines' worth at 80 % utilisation),
    # though every snapshot shows an empty queue; windows shorter than a minute are measured
    # when they close
    rate = 2.2 * 0.8 * _prefill_rps(make_fleet)
    fleet = _load_only(make_fleet, sizing="fleetplan", throughput_adjustment_interval_seconds=interval)
    out = fleet.run(_with_traffic(rate, T0 + 400))
    assert all(d.targets["prefill"] >= 3 for d in decisions(out))
    held = [o for o in out if o.load_reasons.get("prefill") == "scale_down_capped_by_measured_rate"]
    assert held and held[0].time == T0 + 5  # from the first verdict: no minute measured yet, the fleet holds
    assert held[-1].time >= T0 + 395  # and to the end of the run
    # Dynamo's load loop releases on the first idle-looking verdict
    dynamo = decisions(_load_only(make_fleet).run(_with_traffic(rate, T0 + 400)))
    assert dynamo[0].time == T0 + 5 and dynamo[0].targets["prefill"] == 2


def test_the_floor_raises_a_fleet_short_of_the_measured_traffic(make_fleet):
    rate = 4.5 * 0.8 * _prefill_rps(make_fleet)  # five engines' worth, on three
    fleet = _load_only(make_fleet, sizing="fleetplan")
    out = fleet.run(_with_traffic(rate, T0 + 100))
    (up,) = decisions(out)  # unacknowledged: nothing more while it is in flight
    # the first minute of traffic (from T0 + 1) is measured at the first tick after T0 + 61
    assert up.time == T0 + 65 and up.load_reason == "scale_up_to_measured_rate"
    assert up.targets["prefill"] >= 5 and up.targets["decode"] >= 1
    assert up.estimates["prefill"].measured_floor == up.targets["prefill"]  # the audit sees the floor
    # a raise moves at most max_throughput_scaling_replicas at once, as the throughput loop does
    capped = _load_only(make_fleet, sizing="fleetplan", max_throughput_scaling_replicas=1)
    (up,) = decisions(capped.run(_with_traffic(rate, T0 + 100)))
    assert up.targets["prefill"] == 4 and up.load_reason == "scale_up_to_measured_rate"


def test_the_floor_brings_back_a_role_with_no_engine(make_fleet):
    """A role at 0 engines sends no FPMs, so no snapshot; the measured traffic still needs it."""
    rate = 0.5 * _prefill_rps(make_fleet)
    events = [e for e in _with_traffic(rate, T0 + 100)
              if getattr(e, "worker_id", None) != "d0"]  # no decode engine, and so no decode FPMs
    fleet = _load_only(make_fleet, sizing="fleetplan", min_endpoint=0)
    (up,) = decisions(fleet.run(events))
    assert up.time == T0 + 65 and up.targets["decode"] >= 1
    assert up.load_reason == "scale_up_to_measured_rate"


def test_traffic_that_began_just_before_the_tick_is_not_read_as_a_rate(make_fleet):
    """Ten requests 50 ms before the first interval tick closed a 50-ms window, read as
    200 a second: a floor of 16 prefill engines and a decision for 9, held for the floor
    memory (before 2026-12-05). A window cut that short now measures nothing, as in the
    throughput loop."""
    from fleetplan.schemas import RequestRecord

    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    for t in np.arange(1.0, 400, 5.0):
        evs += [fpm("p0", "prefill", T0 + t, counter=int(t)),
                fpm("d0", "decode", T0 + t, counter=int(t), decode_reqs=1, decode_kv=3000)]
    evs += [RequestRecord(deployment="d", time=T0 + 179.99, request_id=f"x{i}", input_tokens=3000,
                          output_tokens=150, request_received_ms=(T0 + 179.95) * 1000) for i in range(10)]
    fleet = _load_only(make_fleet, sizing="fleetplan")
    out = fleet.run([*sorted(evs, key=lambda e: e.time), ClockEvent(deployment="d", time=T0 + 400)])
    assert decisions(out) == []
    assert all(not floor for floor in fleet.state("d").measured_floors)


def test_with_no_traffic_the_snapshots_decide(make_fleet):
    out = decisions(_load_only(make_fleet, sizing="fleetplan").run(_idle_fleet(T0 + 200)))
    assert out[0].time == T0 + 5 and out[0].targets["prefill"] == 2  # as Dynamo: nothing measured to hold


def test_the_floor_is_only_for_load_only_deployments(make_fleet):
    rate = 2.2 * 0.8 * _prefill_rps(make_fleet)
    both = make_fleet(sizing="fleetplan", enable_load_scaling=True).run(_with_traffic(rate, T0 + 400))
    assert not any("measured_rate" in str(o.load_reasons) for o in both)


def test_the_measured_floor_round_trips_and_old_state_restores(make_fleet):
    from fleetplan.models.state import DeploymentState

    fleet = _load_only(make_fleet, sizing="fleetplan")
    fleet.run(_with_traffic(2.2 * 0.8 * _prefill_rps(make_fleet), T0 + 200))
    state = fleet.state("d")
    (closed,) = state.measured_floors  # the window closed at T0 + 180 was measured
    assert closed["prefill"] >= 3
    data = state.to_data()
    assert DeploymentState.from_data(data).to_data() == data
    del data["measured_floors"]  # written before the floor existed
    assert DeploymentState.from_data(data).measured_floors == []


def test_a_busy_window_holds_its_engines_for_the_floor_memory(make_fleet):
    # the first window's traffic needs the three prefill engines, then it falls to a trickle
    rate = 2.2 * 0.8 * _prefill_rps(make_fleet)
    evs = _idle_fleet(T0 + 900)
    clock = evs.pop()
    traffic = [*requests(rate, T0 + 1, T0 + 180), *requests(0.5, T0 + 180, T0 + 900, tag="t")]
    evs = sorted([*evs, *traffic], key=lambda e: e.time) + [clock]

    def first_release(**config) -> float:
        (release,) = decisions(_load_only(make_fleet, sizing="fleetplan", **config).run(evs))
        assert release.targets["prefill"] == 2
        return release.time

    # 300 s (the default) keeps the two windows closed at T0 + 180 and T0 + 360: the busy one
    # holds until T0 + 540; the least memory, one window, holds it until the next closes
    assert first_release() == T0 + 540
    assert first_release(load_floor_memory_seconds=0) == first_release(load_floor_memory_seconds=180) == T0 + 360


def test_aggregated_engines_get_the_measured_floor_too(make_fleet):
    # one aggregated engine whose snapshots are within the SLA (an 80 ms ITL target: idle, the
    # seeded engine takes 58 ms with a prompt chunk aboard), under traffic that needs several
    evs = [ready("a0", "agg"), *(fpm("a0", "agg", T0 + t, counter=int(t)) for t in np.arange(1.0, 100.0, 5.0))]
    evs = sorted([*evs, *requests(30, T0 + 1, T0 + 100)], key=lambda e: e.time)
    evs.append(ClockEvent(deployment="d", time=T0 + 100))
    (up,) = decisions(_load_only(make_fleet, sizing="fleetplan", mode="agg", itl=80).run(evs))
    assert up.time == T0 + 65 and up.load_reason == "scale_up_to_measured_rate" and up.targets["agg"] >= 3
    assert not decisions(_load_only(make_fleet, mode="agg", itl=80).run(evs))  # Dynamo's: within the SLA, hold


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.floats(min_value=2.0, max_value=80.0), st.floats(min_value=1.0, max_value=2.0),
       st.sampled_from([(3000, 150), (600, 400), (12_000, 60)]))
def test_more_traffic_never_lowers_the_measured_floor(make_fleet, rate, factor, lengths):
    isl, osl = lengths

    def floor(r: float) -> dict:
        evs = _idle_fleet(T0 + 200)
        clock = evs.pop()
        evs = sorted([*evs, *requests(r, T0 + 1, T0 + 180, isl=isl, osl=osl)], key=lambda e: e.time) + [clock]
        fleet = _load_only(make_fleet, sizing="fleetplan")
        fleet.run(evs)
        (closed,) = fleet.state("d").measured_floors
        return closed

    low, high = floor(rate), floor(rate * factor)
    assert all(low[role] <= high[role] for role in low)


def test_attention_dp_ranks_are_not_counted_as_engines_to_release(make_fleet):
    """One decode worker reporting two attention-DP ranks is one engine: releasing it leaves none
    (min_endpoint 0 sent decode to 0 while it served), and N/(N-1) is over workers, not ranks."""
    fleet = make_fleet(enable_load_scaling=True, enable_throughput_scaling=False, min_endpoint=0)
    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    for t in (1, 6):
        evs += [fpm("d0", "decode", T0 + t, decode_reqs=4, decode_kv=12_000, counter=t).model_copy(
            update={"dp_rank": r}) for r in (0, 1)]
        evs.append(fpm("p0", "prefill", T0 + t, counter=t))
    out = fleet.run(sorted(evs, key=lambda e: e.time))
    assert out and decisions(out) == []
    assert all(o.load_reasons["decode"] == "no_change" for o in out)


def test_a_released_engine_holds_the_load_loop_until_it_is_gone(make_fleet):
    """Without inventory a released engine stays known, with its last FPM, until it has been
    silent for 30 s (``GONE_AFTER_SILENCE_SECONDS``; a draining one keeps reporting), and the
    load loop counted it: two engines that could not take each other's queue (2 -> 1 refused)
    looked like three that could (3 -> 2), and a second engine went 5 s after the first. As in
    Dynamo, FPMs from more engines than decided hold the loop (``worker_count_mismatch``)."""
    from tests.models.factories import ack

    evs = []
    for t in range(1, 6):  # three idle prefill engines and a decode engine, known from their FPMs
        evs += [fpm(f"p{i}", "prefill", T0 + t, wall=0.0, counter=t) for i in range(3)]
        evs.append(fpm("d0", "decode", T0 + t, wall=0.0, counter=t, decode_reqs=4, decode_kv=12_000))
    evs.append(ack(0, T0 + 6))  # the first idle verdict released p2; its FPMs stop
    for t in range(6, 45):  # the two left each queue 6,500 prompt tokens
        evs += [fpm(f"p{i}", "prefill", T0 + t, wall=0.0, counter=t, queued_prefill=6_500) for i in range(2)]
        evs.append(fpm("d0", "decode", T0 + t, wall=0.0, counter=t, decode_reqs=4, decode_kv=12_000))
    out = _load_only(make_fleet).run([*evs, ClockEvent(deployment="d", time=T0 + 45)])
    (release,) = decisions(out)
    assert release.time == T0 + 5 and release.targets["prefill"] == 2
    reasons = {o.time - T0: o.load_reasons["prefill"] for o in out if o.time > T0 + 5}
    # p2's last FPM (T0 + 5) is 30 s old at T0 + 35: taken for gone, the two engines decide
    assert {t for t, r in reasons.items() if r == "worker_count_mismatch"} == {10, 15, 20, 25, 30}
    assert {reasons[t] for t in (35, 40, 45)} == {"scale_down_refused_consolidation"}
    assert all(o.load_reasons["decode"] == "no_change" for o in out)


def test_a_load_only_loop_reads_the_measured_accept_length_and_kv_hit_rate(make_fleet):
    """Speculative decoding emits ``accept_length`` tokens a pass, so the load loop divides a
    pass by it to get the ITL, and a prefix-cache hit shortens the prefill it times. Only the
    throughput loop stored the last window's figures: without it the load loop read accept 1
    and no cache hits for good, and a decode engine at 7 ms a token (22 ms a pass, accept 3)
    was scaled up against a 20 ms target that the same deployment with both loops kept."""
    evs = [fpm("d0", "decode", T0 + t, wall=0.0, counter=t, decode_reqs=200,
               decode_kv=400_000 if t > 180 else 12_000) for t in range(1, 200)]
    finished = [r.model_copy(update={"accept_length": 3.0, "kv_hit_rate": 0.5})
                for r in requests(2, T0 + 1, T0 + 170)]
    evs = sorted([*evs, *finished], key=lambda e: e.time) + [ClockEvent(deployment="d", time=T0 + 200)]
    for loops in ({"enable_throughput_scaling": False}, {}):
        fleet = make_fleet(mode="decode", itl=20, enable_load_scaling=True, **loops)
        out = fleet.run(evs)
        at_185 = next(o for o in out if o.time == T0 + 185)
        assert at_185.load_reasons == {"decode": "no_change"}, loops
        assert at_185.estimates["decode"].itl_ms < 20 and decisions(out) == []
        state = fleet.state("d")
        assert (state.last_accept_length, state.last_kv_hit_rate) == (3.0, 0.5)


def test_the_measured_floor_sizes_for_the_busiest_minute(make_fleet):
    """Half an engine's worth of traffic for two minutes, then a minute at six engines' worth:
    the window's mean is 2.3 engines' worth, but the minute that queued needed six engines at
    their SLA-bound rate, so the floor from that window is no fewer (docs/planner.md: the window's
    busiest minute)."""
    one = _prefill_rps(make_fleet)
    evs = _idle_fleet(T0 + 190)
    clock = evs.pop()
    traffic = [*requests(0.5 * one, T0 + 1, T0 + 120), *requests(6 * one, T0 + 120, T0 + 180, tag="b")]
    fleet = _load_only(make_fleet, sizing="fleetplan")
    fleet.run([*sorted([*evs, *traffic], key=lambda e: e.time), clock])
    (closed,) = fleet.state("d").measured_floors  # the window the tick at T0 + 180 closed
    assert closed["prefill"] >= 6


def test_traffic_that_begins_after_idle_ticks_is_measured_from_its_first_request(make_fleet):
    """A load-only fleet that ticked idle before its launch: the window its traffic began in
    was dated from the tick before, so 20 s of traffic read over 140 s (a floor of 2 where the
    first minute keeps the fleet as it is) and the raise 40 s in asked for 4 engines, not 5.
    Measured from the first request, the launch is raised as one from the first tick is."""
    rate = 4.5 * 0.8 * _prefill_rps(make_fleet)  # five engines' worth, on three

    def first_raise(begin: float):
        evs = _idle_fleet(T0 + begin + 200)
        clock = evs.pop()
        evs = sorted([*evs, *requests(rate, T0 + begin, T0 + begin + 200)], key=lambda e: e.time)
        fleet = _load_only(make_fleet, sizing="fleetplan", load_scale_down_stabilization_seconds=10**6)
        (up,) = decisions(fleet.run([*evs, clock]))
        return up.time - T0 - begin, up.targets["prefill"]

    assert first_raise(1) == (64, 5)
    assert first_raise(300) == (60, 5)
