"""Demand counted at arrival: what the throughput loop sees under overload."""

from __future__ import annotations

import pytest

from fleetplan.models.canonical import canonical_key
from fleetplan.schemas import RequestArrival, RequestRecord
from fleetplan.streams.tables import TrafficSums
from tests.models.factories import T0, decisions, ready, requests


def arrivals(rate: float, start: float, end: float, isl: int = 3000, tag: str = "a"):
    n = int((end - start) * rate)
    return [RequestArrival(deployment="d", time=start + i / rate, request_id=f"{tag}{i}", input_tokens=isl)
            for i in range(n)]


def _tick(out, t):
    return [o for o in out if o.time == t][0]


def test_without_arrivals_the_loop_counts_finished_requests(make_fleet):
    out = make_fleet().run([ready("p0", "prefill"), ready("d0", "decode"), *requests(5, T0 + 1, T0 + 185)])
    assert _tick(out, T0 + 180).observed.num_req == pytest.approx(5 * 179, abs=1)


def test_arrivals_are_the_demand_when_the_fleet_cannot_keep_up(make_fleet):
    # 40 rps arrive, the overloaded fleet finishes 5 rps: Dynamo-style counting sees 5
    evs = [ready("p0", "prefill"), ready("d0", "decode"),
           *arrivals(40, T0 + 1, T0 + 185), *requests(5, T0 + 1, T0 + 185, osl=300)]
    out = make_fleet(max_throughput_scaling_replicas=20).run(sorted(evs, key=lambda e: e.time))
    tick = _tick(out, T0 + 180)
    assert tick.observed.num_req == pytest.approx(40 * 179, abs=1)
    assert tick.observed.isl == 3000 and tick.observed.osl == 300  # OSL from the finished ones
    # 40 rps of ISL 3000 needs 3 prefill engines at 15.4 rps each
    assert decisions(out)[0].targets["prefill"] == 3


def test_a_window_where_nothing_finished_carries_the_last_osl(make_fleet):
    first = [*arrivals(10, T0 + 1, T0 + 180), *requests(10, T0 + 1, T0 + 180, osl=400)]
    second = arrivals(10, T0 + 181, T0 + 365, tag="b")
    out = make_fleet().run(sorted([ready("p0", "prefill"), ready("d0", "decode"), *first, *second],
                                  key=lambda e: e.time))
    tick = _tick(out, T0 + 360)
    assert tick.observed.num_req == pytest.approx(1790, abs=1)
    assert tick.observed.osl == 400


def test_an_arrival_sorts_before_the_record_of_the_same_request_and_time():
    (arrival,) = arrivals(1, T0, T0 + 1, tag="x")
    (record,) = requests(1, T0, T0 + 1, tag="x")
    assert canonical_key(arrival) < canonical_key(record)


def test_the_traffic_mirror_counts_what_the_core_counts():
    sums = TrafficSums()
    for ev in [*arrivals(2, 0, 5), *requests(1, 0, 3, osl=200)]:
        sums.add(ev)
    assert (sums.arrivals, sums.count) == (10, 3)
    observed = {"num_req": 10.0, "isl": 3000.0, "osl": 200.0, "kv_hit_rate": None, "accept_length": None}
    assert sums.mismatch(observed, by_arrival=True) is None
    assert sums.mismatch(observed) == "num_req"
    # nothing finished: the core carried an OSL over, which the window cannot check
    only_arrivals = TrafficSums()
    for ev in arrivals(2, 0, 5):
        only_arrivals.add(ev)
    carried = {"num_req": 10.0, "isl": 3000.0, "osl": 321.0, "kv_hit_rate": None, "accept_length": None}
    assert only_arrivals.mismatch(carried, by_arrival=True) is None


def test_traffic_that_starts_mid_window_is_counted_as_a_rate(make_fleet):
    # a deployment whose traffic begins 120 s into its first 180 s window: that window is carried
    # into the next, and its 240 s at 10 rps are 2,400 requests, a rate of 10 rps, not 2,400 / 180
    from fleetplan.schemas import ClockEvent

    evs = [ready("p0", "prefill"), ready("d0", "decode"), *arrivals(10, T0 + 120, T0 + 360),
           ClockEvent(deployment="d", time=T0 + 361)]
    (tick,) = [o for o in make_fleet(sizing="fleetplan").run(evs) if o.observed is not None]
    assert tick.time == T0 + 360
    assert tick.observed.num_req == pytest.approx(1800.0, rel=0.02)  # 2,400 over 240 s, per 180 s
    # traffic from the window's start is a whole window, as before
    evs = [ready("p0", "prefill"), ready("d0", "decode"), *arrivals(10, T0 + 1, T0 + 180),
           ClockEvent(deployment="d", time=T0 + 181)]
    (tick,) = [o for o in make_fleet(sizing="fleetplan").run(evs) if o.observed is not None]
    assert tick.observed.num_req == 1790.0


def test_a_first_window_too_short_to_be_a_rate_is_not_fed(make_fleet):
    """One request a millisecond before the first tick must not read as 1,000 a second."""
    from fleetplan.schemas.events import RequestArrival

    fleet = make_fleet(sizing="fleetplan", max_throughput_scaling_replicas=32)
    tick = T0 + 180
    events = [ready("p0", "prefill", tick - 100), ready("d0", "decode", tick - 100),
              RequestArrival(deployment="d", time=tick - 0.001, request_id="a0", input_tokens=3000)]
    events += [RequestArrival(deployment="d", time=tick + 1 + i / 2, request_id=f"b{i}", input_tokens=3000)
               for i in range(2 * 360)]
    events += requests(2, tick + 1, tick + 361, tag="b")
    ticks = [o for o in fleet.run(sorted(events, key=lambda e: e.time))
             if getattr(o, "throughput_reason", "not_due") not in ("not_due", "disabled")]
    first, second = ticks[0], ticks[1]
    assert first.time == tick and first.throughput_reason == "no_traffic_data" and first.observed is None
    # the first full window is the first one the forecast sees: 2 requests a second, one engine each
    assert second.observed.num_req == pytest.approx(358, abs=2)
    assert second.targets == {"prefill": 1, "decode": 1}


def _answered(rate: float, start: float, end: float, osls=(60, 150, 250, 400, 700)):
    """Arrivals at ``rate`` in [start, end), each finished once its answer is decoded (20 ms a
    token): a long answer finishes seconds after a short one that arrived with it."""
    out = []
    for i in range(int((end - start) * rate)):
        t, osl = start + i / rate, osls[i % len(osls)]
        out.append(RequestArrival(deployment="d", time=t, request_id=f"q{i}", input_tokens=1000))
        out.append(RequestRecord(deployment="d", time=t + 0.05 + osl * 0.02, request_id=f"q{i}",
                                 input_tokens=1000, output_tokens=osl, request_received_ms=t * 1000))
    return sorted(out, key=lambda e: e.time)


def test_a_partial_first_window_does_not_size_decode_from_its_short_answers(make_fleet):
    """Traffic that began 30 s before the first 60-s tick: the answers that finished by then are
    the short ones (mean OSL 269 of the 312 that arrived), so decode's capacity read 16 % high
    and its slot count cut 3 engines to 2 on traffic that needs 3 (the compose demo's first
    tick, 33 s after its fleet started: ITL p90 121 ms on 2 engines). As Dynamo's first
    adjustment, one interval after the planner starts, the first window sized holds at least
    an interval of traffic: the partial one is carried into the next."""
    fleets = [ready(f"p{i}", "prefill", T0 + 0.1) for i in range(3)]
    fleets += [ready(f"d{i}", "decode", T0 + 0.1) for i in range(3)]

    def first_sizings(begin: float):
        fleet = make_fleet(sizing="fleetplan", throughput_adjustment_interval_seconds=60,
                           enable_load_scaling=False)
        out = fleet.run([*fleets, *_answered(90, T0 + begin, T0 + 200)])
        return [o for o in out if getattr(o, "throughput_reason", "not_due") != "not_due"][:2]

    # traffic from the window's start: a whole first window, decode kept at 3
    assert [t.targets["decode"] for t in first_sizings(0.5)] == [3, 3]
    ticks = first_sizings(30.0)
    assert [t.targets["decode"] for t in ticks] == [3, 3]
    held, first = ticks
    assert held.time == T0 + 60 and held.throughput_reason == "no_traffic_data" and held.decision is None
    assert held.targets == {"prefill": 3, "decode": 3}
    # the next tick sizes the 90 s from the first request, its count scaled to a 60-s window
    assert first.time == T0 + 120 and first.observed.num_req == pytest.approx(90 * 60, rel=0.01)
    assert first.targets["decode"] == 3


def test_traffic_that_starts_mid_window_after_idle_ticks_is_counted_as_a_rate(make_fleet):
    """A fleet provisioned ahead of its launch ticks idle first: the window its traffic begins
    in is as partial as a first window is. It read 60 s of 10 rps over 180 s, 3.3 rps, and
    the first sizing after launch cut the fleet to a third of what the traffic needs."""
    from fleetplan.schemas import ClockEvent

    evs = [ready("p0", "prefill"), ready("d0", "decode"), *arrivals(10, T0 + 300, T0 + 540),
           ClockEvent(deployment="d", time=T0 + 541)]
    ticks = [o for o in make_fleet(sizing="fleetplan").run(evs)
             if getattr(o, "throughput_reason", "not_due") != "not_due"]
    assert [(t.time - T0, t.throughput_reason) for t in ticks[:2]] == [
        (180, "no_traffic_data"), (360, "no_traffic_data")]
    (sized,) = [t for t in ticks if t.observed is not None]
    assert sized.time == T0 + 540
    assert sized.observed.num_req == pytest.approx(1800.0, rel=0.02)  # 2,400 over 240 s, per 180 s


def test_a_window_before_any_request_finished_does_not_size_decode(make_fleet):
    """Answers that take five minutes (a reasoning model): the first windows counted by arrival
    hold requests none of which has finished, so no OSL is known, neither in the window nor
    from one before. Sized at an OSL of 0 (one token), a warm fleet's 6 decode engines were cut
    to 1 with 1,790 requests decoding; the loop now holds until an OSL is measured."""
    from fleetplan.schemas import ClockEvent

    evs = [ready("p0", "prefill"), *[ready(f"d{i}", "decode") for i in range(6)]]
    for i in range(10 * 400):
        t = T0 + 1 + i / 10
        evs.append(RequestArrival(deployment="d", time=t, request_id=f"q{i}", input_tokens=3000))
        evs.append(RequestRecord(deployment="d", time=t + 300, request_id=f"q{i}", input_tokens=3000,
                                 output_tokens=6000, request_received_ms=t * 1000))
    evs = [*sorted(evs, key=lambda e: e.time), ClockEvent(deployment="d", time=T0 + 361)]
    ticks = [o for o in make_fleet(sizing="fleetplan").run(evs)
             if getattr(o, "throughput_reason", "not_due") != "not_due"]
    held, sized = ticks[0], ticks[1]
    assert held.time == T0 + 180 and held.throughput_reason == "no_traffic_data"
    assert held.decision is None and held.targets["decode"] == 6
    assert sized.time == T0 + 360 and sized.observed.osl == 6000
    assert sized.targets["decode"] >= 6
