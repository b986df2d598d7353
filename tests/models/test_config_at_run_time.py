"""Config changed at run time (set_config, set_min_endpoints) leaves no stale part of the old one."""

from __future__ import annotations

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.fleet import Fleet
from fleetplan.models.planner import Planner
from fleetplan.schemas import ClockEvent, ControlEvent, SetAdvisory, SetConfig, SetMinEndpoints
from fleetplan.sim.profiles import load_profile
from tests.models.factories import T0, fpm, ready, requests


def _fleet(**changes) -> Fleet:
    cfg = config_from_dict({**REFERENCE_SIZING, "load_predictor": "constant", "max_gpu_budget": 64, **changes})
    return Fleet(Planner(cfg, profile=load_profile("h200-llama3.1-8b")))


def _set(t: float, **changes) -> ControlEvent:
    return ControlEvent(deployment="d", time=t, body=SetConfig(changes=changes))


def test_a_shortened_throughput_interval_reads_the_window_at_its_own_length():
    """The window open when 180 s became 20 s began on the old grid: 180 s of a steady 10 req/s
    is 10 req/s, not 90 (it was divided by the new 20 s)."""
    events = [ready("p0", "prefill"), ready("d0", "decode"), *requests(10, T0 + 1, T0 + 600),
              _set(T0 + 350, throughput_adjustment_interval_seconds=20)]
    reports = [r for r in _fleet().run(sorted(events, key=lambda e: e.time)) if r.predicted is not None]
    assert [round(r.predicted.rps, 1) for r in reports[:3]] == [9.9, 10.0, 10.0]
    assert not any(r.decision for r in reports)


def test_switching_the_throughput_loop_off_drops_its_floor():
    """A busy first window left a floor of 4 prefill engines; with the loop off, the idle fleet's
    scale-down verdicts are no longer capped by it."""
    events = [ready(f"p{i}", "prefill") for i in range(4)] + [ready("d0", "decode"), ready("d1", "decode")]
    events += requests(60, T0 + 1, T0 + 180)
    events.append(_set(T0 + 190, enable_throughput_scaling=False))
    for t in range(181, 400, 5):
        events += [fpm(f"p{i}", "prefill", T0 + t, counter=t) for i in range(4)]
        events += [fpm(f"d{i}", "decode", T0 + t, counter=t, decode_reqs=1, decode_kv=100) for i in range(2)]
    fleet = _fleet(enable_load_scaling=True, load_floor="none")
    reports = fleet.run(sorted(events, key=lambda e: e.time))
    assert fleet.states["d"].lower_bound == {}
    decided = [r.decision for r in reports if r.decision is not None and r.time > T0 + 190]
    assert decided and decided[0].targets["prefill"] < 4 and decided[0].load_reason == "scale_down"


def test_a_load_loop_switched_back_on_waits_out_its_stabilization_again():
    def released(toggle: bool) -> list[float]:
        events = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode")]
        if toggle:
            events += [_set(T0 + 60, enable_load_scaling=False), _set(T0 + 1000, enable_load_scaling=True)]
        for t in range(1, 1400, 5):
            if toggle and 60 < t < 1000:
                continue
            events += [fpm(f"p{i}", "prefill", T0 + t, counter=t) for i in range(3)]
            events += [fpm("d0", "decode", T0 + t, counter=t, decode_reqs=4, decode_kv=12_000)]
        fleet = _fleet(enable_load_scaling=True, enable_throughput_scaling=False,
                       load_scale_down_stabilization_seconds=300.0)
        return [r.time - T0 for r in fleet.run(sorted(events, key=lambda e: e.time)) if r.decision]

    assert released(False)[0] == 305
    assert released(True)[0] == 1305  # 300 s after the loop came back, not at its first verdict


def test_a_minimum_above_the_ceiling_is_refused():
    fleet = _fleet(prefill_max_endpoint=3)
    fleet.run([ready("p0", "prefill"), ready("d0", "decode"),
               ControlEvent(deployment="d", time=T0 + 5, body=SetMinEndpoints(minimums={"prefill": 5})),
               ClockEvent(deployment="d", time=T0 + 200)])
    state = fleet.states["d"]
    assert state.rejected_controls == 1 and state.min_overrides == {}


def test_a_ceiling_lowered_under_a_run_time_minimum_is_refused():
    """The same contradiction the other way round: set_min_endpoints raised prefill's floor to 4,
    then a set_config put its ceiling at 2. It was taken, and the clamp kept the ceiling, so
    prefill went from 4 engines to 2 under the floor the operator had set, without a word."""
    fleet = _fleet()
    reports = fleet.run([*(ready(f"p{i}", "prefill") for i in range(4)), ready("d0", "decode"),
                         ControlEvent(deployment="d", time=T0 + 5, body=SetMinEndpoints(minimums={"prefill": 4})),
                         _set(T0 + 6, prefill_max_endpoint=2),
                         ClockEvent(deployment="d", time=T0 + 400)])
    state = fleet.states["d"]
    assert state.rejected_controls == 1 and state.config.prefill_max_endpoint is None
    assert all(r.decision.targets["prefill"] >= 4 for r in reports if r.decision)


def test_a_floor_set_by_set_config_replaces_an_earlier_set_min_endpoints():
    """set_min_endpoints put prefill's floor at 4; a later set_config of prefill_min_endpoint: 1
    was taken (config_version counted it) but never used: the earlier control's 4 shadowed it
    for good, and the idle fleet was raised to 4 prefill engines. The later word is the floor."""
    fleet = _fleet()
    reports = fleet.run([ready("p0", "prefill"), ready("d0", "decode"),
                         ControlEvent(deployment="d", time=T0 + 5, body=SetMinEndpoints(minimums={"prefill": 4})),
                         _set(T0 + 6, prefill_min_endpoint=1),
                         ClockEvent(deployment="d", time=T0 + 400)])
    state = fleet.states["d"]
    assert state.rejected_controls == 0 and state.min_overrides == {}
    assert not [r.decision for r in reports if r.decision]


def test_a_set_config_of_advisory_replaces_an_earlier_set_advisory():
    """set_advisory put the deployment in advisory mode; a later set_config of advisory: false was
    taken (config_version counted it, the config said false) but never used: the control's word
    shadowed it for good, and every decision after it was still advisory, never applied. The later
    word is the mode, as for a floor."""
    fleet = _fleet()
    events = [ready("p0", "prefill"), ready("d0", "decode"), *requests(20, T0 + 1, T0 + 400),
              ControlEvent(deployment="d", time=T0 + 5, body=SetAdvisory(advisory=True)), _set(T0 + 6, advisory=False)]
    reports = fleet.run(sorted(events, key=lambda e: e.time))
    state = fleet.states["d"]
    assert state.config.advisory is False and state.advisory is False
    decided = [r.decision for r in reports if r.decision]
    assert decided and not any(d.advisory for d in decided)


def test_a_replica_ceiling_wins_over_the_floor_budget():
    """Five agg engines over a ceiling of 3, with a floor budget of 4 GPUs the ceilings cannot
    hold: the fleet comes down to its ceiling (the budget used to keep it at 4)."""
    cfg = config_from_dict({"mode": "agg", "max_endpoint": 3, "min_gpu_budget": 4, "max_gpu_budget": -1,
                            "load_predictor": "constant"})
    reports = Fleet(Planner(cfg)).run([ready(f"w{i}", "agg") for i in range(5)]
                                      + [ClockEvent(deployment="d", time=T0 + 200)])
    decisions = [r.decision for r in reports if r.decision]
    assert decisions and decisions[0].targets == {"agg": 3}



def test_a_measured_floor_switched_back_on_does_not_hold_a_window_from_before():
    """A busy first window left a floor of three prefill engines; load_floor: none then ran for
    800 s (the engines held by a minimum), and when measured came back that window's floor
    still held the idle fleet: the floors kept are the last closed windows', and none closes
    into them while nothing is measured."""
    def first_release(busy: bool) -> float:
        events = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode")]
        events += requests(40 if busy else 0.5, T0 + 1, T0 + 180)
        events += [_set(T0 + 181, load_floor="none"), _set(T0 + 1000, load_floor="measured", prefill_min_endpoint=1)]
        events += _three_prefill_one_decode(until=1400)
        fleet = _fleet(enable_load_scaling=True, enable_throughput_scaling=False, load_floor="measured",
                       prefill_min_endpoint=3)
        reports = fleet.run(sorted(events, key=lambda e: e.time))
        return [r.time - T0 for r in reports if r.decision][0]

    assert first_release(busy=True) == first_release(busy=False) == 1005  # busy: 1260 (two windows later)


def test_a_switch_to_a_threshold_target_with_no_kv_capacity_is_refused():
    """Decode's threshold rule reads KV use over the cache size: a config file that switches to a
    threshold target with neither max_kv_tokens nor a profile is refused when the planner is
    built, and a set_config that does the same was taken, after which every decode verdict was
    insufficient_data and decode never scaled, however full its cache."""
    cfg = config_from_dict({"mode": "decode", "load_predictor": "constant"})
    events = [ready("d0", "decode"), _set(T0 + 5, optimization_target="latency"),
              ClockEvent(deployment="d", time=T0 + 200)]
    fleet = Fleet(Planner(cfg))
    fleet.run(events)
    state = fleet.states["d"]
    assert state.rejected_controls == 1 and state.config.optimization_target == "sla"
    profiled = Fleet(Planner(cfg, profile=load_profile("h200-llama3.1-8b")))  # the profile measured it
    profiled.run(events)
    assert profiled.states["d"].rejected_controls == 0
    assert profiled.states["d"].config.optimization_target == "latency"


def test_a_new_burst_window_takes_the_window_open_at_the_width_it_was_counted_at():
    """A steady 10 req/s, its burst window changed from 60 s to 20 s before the first tick: the
    window's 60-s counts were read as 20-s ones, its peak three times the rate (5,400 for 1,800),
    which sized prefill for 30 req/s and stayed in the sizing quantile's calibration."""
    def first_windows(burst: int, change: bool) -> list:
        events = [ready("p0", "prefill"), ready("d0", "decode"), *requests(10, T0 + 1, T0 + 600)]
        if change:
            events.append(_set(T0 + 170, burst_window_seconds=20))
        fleet = _fleet(throughput_sizing="startup_quantile", burst_window_seconds=burst)
        reports = [r for r in fleet.run(sorted(events, key=lambda e: e.time)) if r.predicted is not None]
        return [round(r.predicted.sized_rps, 1) for r in reports[:3]], fleet.states["d"]

    sized, state = first_windows(60, change=True)
    assert sized == first_windows(20, change=False)[0] == [10.0, 10.1, 10.1]
    assert [row[7] for row in state.traffic_history[:3]] == [1800.0] * 3  # each window's peak
    assert state.config.burst_window_seconds == 20


def test_a_budget_that_cannot_hold_one_of_the_profiles_engines_a_role_is_refused():
    """The 70B profile's engines take 2 GPUs: a budget of 3 is refused at start, and a set_config
    to it was taken, after which the budget, which wins over the floors, kept prefill at 0."""
    cfg = config_from_dict({"load_predictor": "constant", "max_gpu_budget": 16})
    _budget_of_3_is_refused(Fleet(Planner(cfg, profile=load_profile("h100-llama3.3-70b"))))


def _budget_of_3_is_refused(fleet: Fleet, *first) -> None:
    """A set_config to a budget of 3 over 2-GPU engines, on a busy fleet: refused, and prefill kept."""
    events = [*first, *requests(2, T0 + 1, T0 + 400), _set(T0 + 10, max_gpu_budget=3)]
    for t in range(1, 400, 5):
        events += [fpm("p0", "prefill", T0 + t, counter=t),
                   fpm("d0", "decode", T0 + t, counter=t, decode_reqs=2, decode_kv=1000)]
    reports = fleet.run(sorted(events, key=lambda e: e.time))
    state = fleet.states["d"]
    assert state.rejected_controls == 1 and state.config.max_gpu_budget == 16
    assert all(r.decision.targets["prefill"] >= 1 for r in reports if r.decision)


def test_a_budget_that_cannot_hold_one_of_the_inventorys_engines_a_role_is_refused():
    """The same with engines whose size only the inventory gives (2 GPUs each, the profile's 1):
    the tick prices them at 2, and a set_config to a budget of 3 was checked against the
    profile's 1-GPU engines, taken, and then cut prefill to 0 at the next throughput tick."""
    _budget_of_3_is_refused(_fleet(max_gpu_budget=16), ready("p0", "prefill", gpus=2), ready("d0", "decode", gpus=2))


def test_a_budget_the_inventory_outgrew_before_a_change_does_not_refuse_it():
    """A budget of 3 passed at start (the profile's engines take 1 GPU) and the inventory then
    reported 2-GPU engines: a set_config of another field is not the budget's change, and is taken."""
    fleet = _fleet(max_gpu_budget=3)
    fleet.run([ready("p0", "prefill", gpus=2), ready("d0", "decode", gpus=2), _set(T0 + 10, ttft_ms=300),
               ClockEvent(deployment="d", time=T0 + 200)])
    state = fleet.states["d"]
    assert state.rejected_controls == 0 and state.config.ttft_ms == 300


def test_a_shorter_floor_memory_forgets_the_older_windows_floors_at_its_tick():
    """A busy first window, then idle ones, its floor remembered 900 s: a set_config to 0 s (the last
    closed window alone) at 370 s kept the busy window's three prefill engines until the next window
    closed, at 540 s, as the floors kept were trimmed only when one was added."""
    events = [ready(f"p{i}", "prefill") for i in range(3)] + [ready("d0", "decode")]
    events += requests(40, T0 + 1, T0 + 180) + requests(0.5, T0 + 180, T0 + 800, tag="q")
    events.append(_set(T0 + 370, load_floor_memory_seconds=0))
    events += _three_prefill_one_decode(until=800)
    fleet = _fleet(enable_load_scaling=True, enable_throughput_scaling=False, load_floor="measured",
                   load_floor_memory_seconds=900)
    reports = fleet.run(sorted(events, key=lambda e: e.time))
    assert [r.time - T0 for r in reports if r.decision][0] == 375


def _three_prefill_one_decode(until: int) -> list:
    """The FPMs of three idle prefill engines and one decode engine holding one sequence,
    every 5 s from T0 + 1 to ``until``: what the load loop's measured floor reads."""
    events = []
    for t in range(1, until, 5):
        events += [fpm(f"p{i}", "prefill", T0 + t, counter=t) for i in range(3)]
        events += [fpm("d0", "decode", T0 + t, counter=t, decode_reqs=1, decode_kv=100)]
    return events
