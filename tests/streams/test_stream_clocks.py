"""Event-time clocks and input positions, in-process."""

from __future__ import annotations

from fleetplan.streams.positions import InputPositions
from fleetplan.streams.topics import CLOCKED, partition_for
from fleetplan.streams.watermark import Watermarks

FPM, REQ = CLOCKED
TP = ("fpm", 0)


def test_a_deployment_clock_is_its_slowest_live_source():
    w = Watermarks(CLOCKED, idle_after_s=5)
    w.observe(FPM, 0, "a", 100.0, now=0.0)
    assert w.time(0, "a", now=0.1)[0] is None  # requests may still show up
    w.observe(REQ, 0, "a", 90.0, now=0.2)
    assert w.time(0, "a", now=0.3)[0] == 90.0
    w.observe(REQ, 0, "a", 120.0, now=0.4)
    assert w.time(0, "a", now=0.5)[0] == 100.0


def test_deployments_on_one_partition_keep_their_own_clocks():
    w = Watermarks(CLOCKED, idle_after_s=5)
    for src in CLOCKED:
        w.observe(src, 0, "ahead", 500.0, now=0.0)
        w.observe(src, 0, "behind", 100.0, now=0.0)
    assert w.time(0, "ahead", now=1.0)[0] == 500.0
    assert w.time(0, "behind", now=1.0)[0] == 100.0


def test_a_missing_or_silent_source_stops_holding_the_clock():
    w = Watermarks(CLOCKED, idle_after_s=5)
    w.observe(FPM, 0, "a", 100.0, now=0.0)
    assert w.time(0, "a", now=4.0)[0] is None
    w.observe(FPM, 0, "a", 100.0, now=5.5)
    assert w.time(0, "a", now=6.0)[0] == 100.0  # no request records at all: FPMs alone
    w.observe(REQ, 0, "a", 50.0, now=6.5)
    assert w.time(0, "a", now=7.0)[0] == 100.0  # never backwards


def test_an_idle_deployment_follows_its_partition():
    w = Watermarks(CLOCKED, idle_after_s=5)
    for src in CLOCKED:
        w.observe(src, 0, "quiet", 100.0, now=0.0)
        w.observe(src, 0, "busy", 100.0, now=0.0)
    for t in range(1, 10):
        for src in CLOCKED:
            w.observe(src, 0, "busy", 100.0 + t, now=float(t))
    assert w.time(0, "quiet", now=9.5)[0] == 109.0


def test_records_are_accepted_in_order_and_resume_waits_for_the_unsettled():
    p = InputPositions()
    p.reset(TP, 10)
    assert not p.accept(TP, 9, now=0)  # before the resume offset: a duplicate
    assert all(p.accept(TP, o, now=0) for o in (10, 11, 12))
    assert not p.accept(TP, 11, now=0)  # read twice around a seek
    p.settle(TP, 11)
    assert p.resume(TP) == 10  # 10 still waits for its tick
    p.settle(TP, 10)
    assert p.resume(TP) == 12
    p.settle(TP, 12)
    assert p.resume(TP) == 13 and p.changed() == {0: {"fpm": 13}} and p.changed() == {}


def test_a_partition_stuck_past_its_expected_offset_is_sought_again_then_jumps():
    p = InputPositions(reseek_after_s=1.0, max_reseeks=2)
    p.reset(TP, 0)
    assert not p.accept(TP, 5, now=0.0)  # a leftover fetched before the seek
    assert p.due_for_reseek(now=0.5) == {}
    assert p.due_for_reseek(now=1.0) == {TP: 0}
    assert not p.accept(TP, 6, now=1.5)
    assert p.due_for_reseek(now=2.6) == {TP: 0}
    assert p.accept(TP, 7, now=3.0)  # sought twice, still no offset 0: a real gap
    assert p.jumps == 1 and p.resume(TP) == 7


def test_a_stall_that_healed_does_not_count_against_the_next():
    """The reseeks count one stall: once the expected offset comes (the seek worked), the next
    stall is sought ``max_reseeks`` times again before the jump that skips records. Counted
    over the worker's life instead, stalls that each healed made a later leftover jump at once,
    past records that were only waiting to be read again; the test above never healed."""
    p = InputPositions(reseek_after_s=1.0, max_reseeks=2)
    p.reset(TP, 0)
    assert not p.accept(TP, 5, now=0.0)
    assert p.due_for_reseek(now=1.0) == {TP: 0}
    assert p.accept(TP, 0, now=1.5)  # the seek worked: offset 0 came, in order
    assert not p.accept(TP, 9, now=2.0)  # a later stall: a leftover again
    assert p.due_for_reseek(now=3.0) == {TP: 1}
    assert not p.accept(TP, 9, now=3.5)  # sought once for this stall: not yet a gap
    assert p.jumps == 0
    assert p.accept(TP, 1, now=3.6) and p.resume(TP) == 0


def test_deployments_hash_like_kafkas_default_partitioner():
    # Known values of murmur2 as used by the Java client and aiokafka.
    assert [partition_for(d, 2) for d in ("alpha", "epsilon")] == [0, 1]


def test_sources_silent_together_hold_the_clock_again_when_one_comes_back():
    """Both sources silent past ``idle_after`` (a broker or bridge outage), then the FPM
    backlog is read first: the request records were as silent as the FPMs, not down, so
    they hold the clock again until they come back (or stay away ``idle_after`` more)."""
    w = Watermarks(CLOCKED, idle_after_s=5)
    for src in CLOCKED:
        w.observe(src, 0, "a", 100.0, now=0.0)
    w.observe(FPM, 0, "a", 160.0, now=30.0)
    assert w.time(0, "a", now=30.1)[0] == 100.0
    w.observe(REQ, 0, "a", 160.0, now=30.2)
    assert w.time(0, "a", now=30.3)[0] == 160.0
    w.observe(FPM, 0, "a", 170.0, now=40.0)  # silent again; this time requests stay away
    assert w.time(0, "a", now=44.0)[0] == 160.0
    w.observe(FPM, 0, "a", 175.0, now=44.5)
    assert w.time(0, "a", now=45.5)[0] == 175.0  # idle_after after the FPMs came back


def test_a_source_down_while_another_is_heard_stops_holding_the_clock_for_good():
    w = Watermarks(CLOCKED, idle_after_s=5)
    for src in CLOCKED:
        w.observe(src, 0, "a", 100.0, now=0.0)
    for t in range(1, 12):  # the request bridge is down, the FPMs go on
        w.observe(FPM, 0, "a", 100.0 + t, now=float(t))
    assert w.time(0, "a", now=11.5)[0] == 111.0
