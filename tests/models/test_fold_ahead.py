"""Folding ahead of the tick changes nothing any tick sees.

The live worker applies events as soon as the watermark passes them
(``advance(..., ahead)``) instead of all at their tick. For any arrival
order (within the grace period or far outside it, so that events arrive
below the watermark and force a rollback, or after their tick and are
late) the tick reports, the late events and the settled state must equal
those of folding at tick time.
"""

from __future__ import annotations

import random

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.fold_ahead import settled_data, snapshot
from fleetplan.models.sequencer import FoldAhead, advance, offer, watermark_of
from fleetplan.schemas import encode_event
from fleetplan.schemas.events import (
    ControlEvent,
    FpmBatch,
    SeedTraffic,
    SeedWindow,
    SetMinEndpoints,
)
from tests.models.factories import T0, fpm
from tests.models.test_sequencer import SCENARIO


def _events():
    """The sequencer scenario plus packed FPMs, a control event between two ticks and a seed before the first."""
    batches = [
        FpmBatch(deployment="d", time=T0 + t + 0.75, fpms=[
            fpm("p0", "prefill", T0 + t + 0.6, queued_prefill=(t * 131) % 30_000, counter=10_000 + t),
            fpm("d0", "decode", T0 + t + 0.75, decode_reqs=6, decode_kv=18_000 + t, counter=10_000 + t),
        ])
        for t in range(3, 540, 11)
    ]
    control = ControlEvent(deployment="d", time=T0 + 212.5, body=SetMinEndpoints(minimums={"decode": 2}))
    # the traffic of the half hour before, which replaces the forecaster at the first tick
    seed = ControlEvent(deployment="d", time=T0 + 0.5, body=SeedTraffic(windows=[
        SeedWindow(start_s=T0 - 180.0 * (10 - k), duration_s=180.0, num_req=2000.0 + 300 * k, isl=3000.0,
                   osl=150.0, peak=2400.0 + 300 * k)
        for k in range(10)
    ]))
    return sorted([*SCENARIO, *batches, control, seed], key=lambda e: e.time)


EVENTS = _events()


def _run(planner, events, ahead: FoldAhead | None, *, raw: bool = False):
    """Feed events in arrival order, firing ticks at the single-source watermark
    (``raw``: with the bytes of each event, which ``ahead`` keeps instead of it)."""
    state = planner.new_state("d")
    out = []
    for event in events:
        if not offer(state, event, ahead, raw=encode_event(event) if raw else None):
            out.append(("late", encode_event(event)))
            continue
        for report in advance(planner, state, watermark_of(state), ahead):
            out.append(("tick", orjson.dumps(report.to_dict()),
                        None if report.decision is None else encode_event(report.decision)))
    return state, out


def _settled(state, ahead):
    """The settled state, and every accepted event not yet part of a fired tick."""
    pending = list(state.buffer) + ([] if ahead is None else ahead.events())
    data = settled_data(state, ahead) if ahead is not None else snapshot(state)
    return orjson.dumps(data), sorted(encode_event(e) for e in pending)


def _arrival(events, seed: int, spread: float):
    rnd = random.Random(seed)
    delays = [rnd.uniform(0, spread) for _ in events]
    return [e for _, e in sorted(zip(delays, events, strict=True), key=lambda p: p[1].time + p[0])]


def _compare(planner, arrival, *, raw: bool = False):
    plain_state, plain = _run(planner, arrival, None)
    ahead = FoldAhead()
    eager_state, eager = _run(planner, arrival, ahead, raw=raw)
    assert eager == plain
    if raw:
        assert ahead.applied and all(isinstance(item, bytes) for item in ahead.applied)
    assert _settled(eager_state, ahead) == _settled(plain_state, None)
    # Finishing (every tick up to the last event) ends in the same state too.
    tail_plain = advance(planner, plain_state, plain_state.max_time)
    tail_eager = advance(planner, eager_state, eager_state.max_time, ahead)
    assert [r.to_dict() for r in tail_eager] == [r.to_dict() for r in tail_plain]
    assert _settled(eager_state, ahead) == _settled(plain_state, None)
    return ahead, plain


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=0, max_value=2**32))
def test_fold_ahead_equals_folding_at_the_tick_within_grace(make_fleet, seed):
    planner = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0).planner
    arrival = _arrival(EVENTS, seed, spread=2.8)
    ahead, out = _compare(planner, arrival)
    assert not any(kind == "late" for kind, *_ in out)
    assert any(len(item) == 3 and item[2] for item in out), "the scenario must decide"
    state, _ = _run(planner, arrival, FoldAhead())
    assert state.traffic_history[0][0] == T0 - 1800.0 and state.rejected_controls == 0, "the seed must apply"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(min_value=0, max_value=2**32))
def test_fold_ahead_equals_folding_at_the_tick_beyond_grace(make_fleet, seed):
    """Delays up to 12 s against 3 s of grace and 5 s ticks: rollbacks and late events."""
    planner = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0).planner
    ahead, out = _compare(planner, _arrival(EVENTS, seed, spread=12.0))
    assert ahead.rollbacks > 0 and any(kind == "late" for kind, *_ in out), "the scenario must go beyond grace"


def test_fold_ahead_keeping_the_bytes_of_applied_events(make_fleet):
    """The worker hands ``offer`` each record's bytes: a rollback decodes them again."""
    planner = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0).planner
    ahead, _ = _compare(planner, _arrival(EVENTS, 7, spread=12.0), raw=True)
    assert ahead.rollbacks > 0


def test_an_event_below_the_watermark_rolls_back_and_is_folded_in_order(make_fleet):
    planner = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0).planner
    arrival = _arrival(EVENTS, 7, spread=12.0)
    ahead, out = _compare(planner, arrival)
    assert ahead.rollbacks > 0
    assert any(kind == "late" for kind, *_ in out)


def test_control_events_wait_for_their_tick(make_fleet):
    """The config callers read between ticks (grace, interval) changes only at the tick."""
    planner = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0).planner
    state, ahead = planner.new_state("d"), FoldAhead()
    control = next(e for e in EVENTS if e.type == "control" and isinstance(e.body, SetMinEndpoints))
    for event in EVENTS:
        offer(state, event, ahead)
        advance(planner, state, watermark_of(state), ahead)
        if state.last_tick is not None and state.last_tick <= control.time < state.max_time - 3.0:
            assert ahead.through is not None and ahead.through <= control.time
            assert control in state.buffer and not state.min_overrides
