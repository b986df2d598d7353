"""A deployment silent past every timer skips its silent ticks (models/sequencer.py).

One event dated decades before the rest (an engine on a monotonic clock, a
producer's default of 0) started its deployment's clock there, and the fold
then owed a tick every 5 s up to the real events: ``fleetplan plan`` and the
worker spun for good on 340 million of them. Ticks in a silence only replay
the timers and feed the forecaster empty windows, so once every timer has had
its tick the rest are skipped, on the events alone: a replay, folded ahead or
at the tick, skips the same ones.
"""

from __future__ import annotations

import random

from fleetplan.models import sequencer
from fleetplan.models.sequencer import SILENCE_SKIPPED_AFTER_SECONDS, advance, offer, watermark_of
from fleetplan.schemas.events import ClockEvent
from tests.models.factories import T0, fpm, ready, requests
from tests.models.test_fold_ahead import EVENTS, _compare
from tests.models.test_sequencer import SCENARIO

QUIET = SILENCE_SKIPPED_AFTER_SECONDS + 180 + 5  # a day, then a throughput window and a tick more


def test_an_event_decades_early_costs_a_day_of_ticks_not_decades(make_fleet):
    fleet = make_fleet(enable_load_scaling=True)
    out = fleet.run([ClockEvent(deployment="d", time=1.0), *SCENARIO])
    times = [o.time for o in out]
    fired_in_silence = [t for t in times if t < T0]
    # every tick up to a day and a window past the clock event fires (its timers' ticks), no more
    assert fired_in_silence == [5.0 * k for k in range(1, int((1.0 + QUIET) // 5) + 1)]
    assert min(t for t in times if t >= T0) == T0 + 5  # the first tick that sees the real events
    state = fleet.state("d")
    skipped_from = fired_in_silence[-1] + 5
    assert state.silent_ticks_skipped == (T0 - skipped_from) / 5 + 1  # T0 itself sees no event yet
    assert state.late_events == 0


def test_the_first_window_after_a_silence_is_an_interval_long(make_fleet):
    """Started where the last fired throughput tick left it, the window was the whole silence,
    and its rate a day's average: the first window after it is read as after any tick."""
    early = make_fleet().run([ClockEvent(deployment="d", time=1.0), *SCENARIO])
    plain = make_fleet().run(SCENARIO)
    first = next(o for o in early if o.time >= T0 and o.observed is not None)
    again = next(o for o in plain if o.observed is not None)
    assert first.time == again.time == T0 + 180
    assert first.observed.num_req == again.observed.num_req > 0
    assert first.observed.duration_s == again.observed.duration_s == 180


def test_the_timers_fire_before_the_skip(make_fleet):
    """An engine known only from its FPMs is forgotten a day after its last one
    (``discovered_engine_ttl_seconds``): that tick fires, though the ticks after it are skipped."""
    fleet = make_fleet()
    evs = [fpm("p0", "prefill", T0 + t, counter=t) for t in range(1, 30)]
    fleet.run([*evs, *requests(1, T0 + 3 * 86_400, T0 + 3 * 86_400 + 10)])
    state = fleet.state("d")
    assert "p0" not in state.workers
    assert state.silent_ticks_skipped > 0


def test_heartbeats_keep_a_quiet_deployment_ticking(make_fleet):
    """The bridge's clock events are events: a deployment without traffic but with heartbeats
    is not silent, and fires every tick as before."""
    fleet = make_fleet()
    beats = [ClockEvent(deployment="d", time=T0 + 600.0 * k) for k in range(0, 6 * 27)]  # 27 h
    out = fleet.run(beats)
    assert fleet.state("d").silent_ticks_skipped == 0
    interval = fleet.state("d").config.tick_interval_seconds  # the throughput loop's 180 s alone
    assert [o.time for o in out] == [T0 + interval * k for k in range(1, int((beats[-1].time - T0) // interval) + 1)]


def test_a_silence_is_skipped_the_same_folded_ahead_and_at_the_tick(make_fleet):
    """The sequencer's scenario, its second half two days later: the worker's fold-ahead
    and folding at the tick skip the same ticks and end in the same state, whatever the
    arrival order within and beyond the grace period."""
    gap = 2 * 86_400.0
    shifted = [e.model_copy(update={"time": e.time + gap}) if e.time >= T0 + 270 else e for e in EVENTS]
    planner = make_fleet(enable_load_scaling=True, load_predictor="kalman", grace_seconds=3.0).planner
    for seed in range(2):
        rnd = random.Random(seed)
        delays = [rnd.uniform(0, 12.0) for _ in shifted]
        arrival = [e for _, e in sorted(zip(delays, shifted, strict=True), key=lambda p: p[1].time + p[0])]
        _compare(planner, arrival)
    state = planner.new_state("d")
    for event in shifted:
        offer(state, event)
        advance(planner, state, watermark_of(state))
    assert state.silent_ticks_skipped > 0


def _busy_then_light_after(silence: float):
    """Ten busy minutes (40 req/s, queued prompts), ``silence`` seconds of nothing, then light traffic."""
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *requests(40, T0 + 1, T0 + 600)]
    back = T0 + silence
    evs += requests(0.5, back, back + 600, tag="z")
    for k in range(1, 120):
        evs.append(fpm("p0", "prefill", T0 + 5 * k + 0.5, queued_prefill=2000, counter=k))
        evs.append(fpm("d0", "decode", T0 + 5 * k + 0.5, decode_reqs=40, decode_kv=40_000, counter=k))
        evs.append(fpm("p0", "prefill", back + 5 * k + 0.5, counter=1000 + k))
        evs.append(fpm("d0", "decode", back + 5 * k + 0.5, decode_reqs=1, decode_kv=500, counter=1000 + k))
    return sorted(evs, key=lambda e: e.time)


def test_a_floor_memory_longer_than_a_day_is_waited_out_before_the_skip(make_fleet, monkeypatch):
    """The load loop alone holds the fleet at the floors measured over ``load_floor_memory_seconds``;
    the silent windows' empty floors push a busy window's out. With a memory of three days, a
    skip after one day kept the busy floor, and light traffic five days later was met with a
    scale-up to it (prefill 1 -> 4) where firing every silent tick changed nothing."""
    day = 86_400.0
    config = dict(sizing="fleetplan", enable_throughput_scaling=False, enable_load_scaling=True,
                  load_adjustment_interval_seconds=60, load_floor_memory_seconds=int(3 * day))
    events = _busy_then_light_after(5 * day)
    skipped = make_fleet(**config)
    after = [r.to_dict() for r in skipped.run(events) if r.time > T0 + 5 * day]
    assert skipped.state("d").silent_ticks_skipped > 0
    monkeypatch.setattr(sequencer, "SILENCE_SKIPPED_AFTER_SECONDS", 1e12)  # every silent tick fired
    fired = make_fleet(**config)
    assert after == [r.to_dict() for r in fired.run(events) if r.time > T0 + 5 * day]
    assert fired.state("d").silent_ticks_skipped == 0
