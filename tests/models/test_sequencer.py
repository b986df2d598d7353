"""Event time: arrival order within the grace period never changes a decision."""

from __future__ import annotations

import random

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.fleet import LateEvent
from fleetplan.models.sequencer import first_tick_after
from fleetplan.schemas import encode_event
from tests.models.factories import T0, ack, fpm, ready, requests


def _scenario():
    """Three throughput windows of changing load with load-loop FPMs and an ack."""
    evs = [ready("p0", "prefill"), ready("d0", "decode")]
    evs += requests(20, T0 + 1, T0 + 180) + requests(35, T0 + 180, T0 + 360, tag="b")
    evs += requests(8, T0 + 360, T0 + 545, tag="c")
    evs.append(ack(0, T0 + 250))
    for t in range(1, 545, 7):
        evs.append(fpm("p0", "prefill", T0 + t + 0.5, queued_prefill=(t * 997) % 40_000, counter=t))
        evs.append(fpm("d0", "decode", T0 + t + 0.25, decode_reqs=8, decode_kv=20_000 + t, counter=t))
    return sorted(evs, key=lambda e: e.time)


SCENARIO = _scenario()


def _reports_a_second_apart():
    """Each engine's FPMs a second apart, every one with its own load: a jitter of more than
    half a second swaps an engine's neighbouring reports, so a tick keeps the latest report
    (and feeds the perf model in order) only if it applies its events in event-time order.
    ``SCENARIO``'s requests are alike and its FPMs 7 s apart: any order folds to the same."""
    evs = []
    for t in range(1, 545):
        evs.append(fpm("p0", "prefill", T0 + t + 0.75, queued_prefill=(t * 7919) % 40_000,
                       wall=0.01 + (t % 13) * 0.004, counter=100_000 + t))
        evs.append(fpm("d0", "decode", T0 + t + 0.6, decode_reqs=4 + t % 9, decode_kv=20_000 + (t * 37) % 5000,
                       wall=0.01 + (t % 7) * 0.003, counter=100_000 + t))
    return evs


ORDER_SENSITIVE = sorted(SCENARIO + _reports_a_second_apart(), key=lambda e: e.time)


def _fold(make_fleet, events):
    fleet = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0)
    outs = fleet.run(events)
    return [orjson.dumps(o.to_dict()) for o in outs], [
        encode_event(o.decision) for o in outs if getattr(o, "decision", None)
    ]


def _jitter(events, keys):
    """Reorder events by a perturbed time that moves each by less than the grace period."""
    return [e for _, e in sorted(zip(keys, events, strict=True), key=lambda p: (p[1].time + p[0],))]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=0, max_value=2**32))
def test_shuffle_within_grace_never_changes_decisions(make_fleet, seed):
    rnd = random.Random(seed)
    baseline = _fold(make_fleet, ORDER_SENSITIVE)
    keys = [rnd.uniform(-1.4, 1.4) for _ in ORDER_SENSITIVE]  # |delay difference| < 2.8 s < grace 3 s
    shuffled = _jitter(ORDER_SENSITIVE, keys)
    assert shuffled != ORDER_SENSITIVE
    assert _fold(make_fleet, shuffled) == baseline
    assert baseline[1], "the scenario must produce decisions"


def _request_at(t: float, tag: str):
    return requests(1, T0, T0 + 1, tag=tag)[0].model_copy(update={"time": t, "request_received_ms": (t - 0.2) * 1000})


def test_late_event_is_refused_and_counted(make_fleet):
    fleet = make_fleet()
    fleet.run(SCENARIO[:50] + requests(1, T0 + 190, T0 + 200, tag="z"))
    late = fleet.feed(requests(1, T0 + 10, T0 + 11, tag="late")[0])
    assert len(late) == 1 and late[0].last_tick == T0 + 180
    assert fleet.states["d"].late_events == 1
    # the edge: the tick at T0 + 180 saw the events before it, so one a millisecond before it is
    # late; one at it is the next tick's (a refusal a second off either way went unnoticed)
    (edge,) = fleet.feed(_request_at(T0 + 179.999, "edge"))
    assert isinstance(edge, LateEvent) and fleet.states["d"].late_events == 2
    assert fleet.feed(_request_at(T0 + 180, "on")) == [] and fleet.states["d"].late_events == 2


def test_ticks_fall_on_the_grid():
    assert first_tick_after(T0 + 0.1, 5) == T0 + 5
    assert first_tick_after(T0, 5) == T0 + 5
    assert first_tick_after(T0 + 4.999, 5) == T0 + 5
