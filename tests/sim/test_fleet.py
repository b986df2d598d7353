"""Fleet lifecycle: startup, draining without drops, GPU-seconds, routing, the connector."""

from __future__ import annotations

import pytest

from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.connector import SimConnector
from fleetplan.sim.engines import SimRequest
from fleetplan.sim.fleet import FleetListener, KvTransfer, SimFleet
from fleetplan.sim.router import make_router
from fleetplan.sim.startup import parse_startup
from tests.sim.sim_helpers import run_all


class Log(FleetListener):
    def __init__(self):
        self.changes = []
        self.finished = []

    def worker_changed(self, engine, state, decision_id):
        self.changes.append((engine.worker_id, state, decision_id))

    def request_finished(self, req):
        self.finished.append(req)


def make_fleet(timing, limits, mode="disagg", router="least-loaded", startup="120", gpus=1):
    clock = VirtualClock()
    log = Log()
    roles = ("prefill", "decode") if mode == "disagg" else ("agg",)
    fleet = SimFleet(
        clock, mode, timing, limits, {r: gpus for r in roles}, make_router(router),
        parse_startup(startup), KvTransfer(), log,
    )
    return fleet, clock, log


def submit_at(fleet, clock, t, i, isl=1000, osl=50, hashes=()):
    clock.at(t, lambda: fleet.submit(SimRequest(i, clock.now, isl, osl, hashes)))


def test_a_request_crosses_prefill_transfer_and_decode(timing, limits):
    fleet, clock, log = make_fleet(timing, limits)
    fleet.add_ready("prefill")
    fleet.add_ready("decode")
    submit_at(fleet, clock, 0.0, 0, isl=2000, osl=11)
    run_all(clock)
    (req,) = log.finished
    transfer = KvTransfer().seconds(2000)
    assert req.first_token == pytest.approx(timing.prefill_s(2000) + transfer)
    assert req.end - req.first_token == pytest.approx(10 * timing.decode_s(1, 2006), rel=0.01)
    assert req.prefill_engine.worker_id == "prefill-0" and req.decode_engine.worker_id == "decode-0"
    assert fleet.in_flight == 0


def test_draining_finishes_everything_it_holds(timing, limits):
    fleet, clock, log = make_fleet(timing, limits)
    fleet.add_ready("prefill")
    decodes = [fleet.add_ready("decode"), fleet.add_ready("decode")]
    for i in range(200):
        submit_at(fleet, clock, i * 0.01, i, osl=400)
    clock.at(1.5, lambda: fleet.stop(decodes[0], 7))
    run_all(clock)
    assert len(log.finished) == 200  # nothing dropped
    assert decodes[0].state == "gone"
    gone_at = decodes[0].stopped
    last_on_it = max(r.end for r in log.finished if r.decode_engine is decodes[0])
    assert gone_at == pytest.approx(last_on_it)
    assert ("decode-0", "draining", 7) in log.changes
    # nothing was routed to it after the drain began
    assert all(r.first_token < 1.5 + 0.01 for r in log.finished if r.decode_engine is decodes[0])


def test_gpu_seconds_run_from_start_to_gone(timing, limits):
    fleet, clock, log = make_fleet(timing, limits, startup="100", gpus=4)
    fleet.add_ready("prefill")
    fleet.add_ready("decode")
    clock.at(10.0, lambda: fleet.start("decode", 0))
    run_all(clock)  # ready at 110
    new = fleet.engines[-1]
    assert new.state == "ready"
    clock.at(500.0, lambda: fleet.stop(new, 1))
    run_all(clock)
    assert new.stopped == 500.0
    # 2 engines for 600 s + the new one from 10 s to 500 s, 4 GPUs each
    assert fleet.gpu_seconds(600.0) == pytest.approx(4 * (600 + 600 + 490))


def test_a_starting_worker_can_be_cancelled(timing, limits):
    fleet, clock, log = make_fleet(timing, limits, startup="120")
    fleet.add_ready("prefill")
    fleet.add_ready("decode")
    clock.at(5.0, lambda: fleet.start("prefill", 0))
    clock.at(30.0, lambda: fleet.stop(fleet.engines[-1], 1))
    run_all(clock)
    late = fleet.engines[-1]
    assert late.state == "gone" and late.stopped == 30.0
    assert [s for w, s, _ in log.changes if w == late.worker_id] == ["starting", "gone"]


def test_requests_wait_at_the_frontend_until_an_engine_is_ready(timing, limits):
    fleet, clock, log = make_fleet(timing, limits, startup="60")
    fleet.add_ready("decode")
    clock.at(0.0, lambda: fleet.start("prefill", 0))
    submit_at(fleet, clock, 1.0, 0)
    run_all(clock)
    (req,) = log.finished
    assert req.first_token > 60.0  # the wait counts in its TTFT


def test_an_engine_stopped_as_it_becomes_ready_leaves_the_waiting_requests_waiting(timing, limits):
    """The ready event can run a planner tick before the frontend's queue is handed out; a tick
    that stopped the only engine of the role sent each waiting request back to the queue being
    emptied, for ever. They wait for the next engine instead."""
    class Stopping(Log):
        def worker_changed(self, engine, state, decision_id):
            super().worker_changed(engine, state, decision_id)
            if state == "ready" and engine.role == "prefill":
                fleet.stop(engine, None)

    clock = VirtualClock()
    log = Stopping()
    fleet = SimFleet(clock, "disagg", timing, limits, {"prefill": 1, "decode": 1}, make_router("least-loaded"),
                     parse_startup("60"), KvTransfer(), log)
    clock.at(0.0, lambda: fleet.start("prefill", 0))
    submit_at(fleet, clock, 1.0, 0)
    submit_at(fleet, clock, 2.0, 1)
    run_all(clock)
    assert [r.index for r in fleet.frontend["prefill"]] == [0, 1] and not log.finished


def test_round_robin_cycles_and_least_loaded_balances(timing, limits):
    fleet, clock, log = make_fleet(timing, limits, router="round-robin")
    for _ in range(3):
        fleet.add_ready("prefill")
    fleet.add_ready("decode")
    for i in range(6):
        submit_at(fleet, clock, 0.0, i)
    run_all(clock)
    by = {}
    for r in log.finished:
        by.setdefault(r.prefill_engine.worker_id, []).append(r.index)
    assert by == {"prefill-0": [0, 3], "prefill-1": [1, 4], "prefill-2": [2, 5]}

    fleet, clock, log = make_fleet(timing, limits, router="least-loaded")
    big, small = fleet.add_ready("prefill"), fleet.add_ready("prefill")
    fleet.add_ready("decode")
    submit_at(fleet, clock, 0.0, 0, isl=16000)
    submit_at(fleet, clock, 0.0, 1, isl=500)
    submit_at(fleet, clock, 0.0, 2, isl=500)
    run_all(clock)
    placed = {r.index: r.prefill_engine for r in log.finished}
    assert placed[0] is big and placed[1] is small and placed[2] is small


def test_prefix_router_sends_a_shared_prefix_to_the_engine_that_cached_it(timing, limits):
    fleet, clock, log = make_fleet(timing, limits, router="prefix")
    fleet.add_ready("prefill")
    fleet.add_ready("prefill")
    fleet.add_ready("decode")
    prefix = tuple(range(10))
    submit_at(fleet, clock, 0.0, 0, isl=5120, hashes=prefix)
    submit_at(fleet, clock, 0.0, 1, isl=600, hashes=(500, 501))  # goes to the idle engine
    for i in range(2, 6):
        submit_at(fleet, clock, 5.0 + i, i, isl=5632, hashes=prefix + (900 + i,))
    run_all(clock)
    home = next(r for r in log.finished if r.index == 0).prefill_engine
    for r in log.finished:
        if r.index >= 2:
            assert r.prefill_engine is home and r.cached == 5120


def test_connector_starts_drains_and_acks_when_ready(timing, limits):
    fleet, clock, log = make_fleet(timing, limits, startup="120")
    acks = []
    connector = SimConnector(fleet, lambda i, status, observed: acks.append((clock.now, i, status, observed)))
    original = fleet.listener.worker_changed

    def relay(engine, state, decision_id):
        original(engine, state, decision_id)
        if state == "ready":
            connector.worker_ready(engine)

    fleet.listener.worker_changed = relay
    fleet.add_ready("prefill")
    fleet.add_ready("decode")
    clock.at(10.0, lambda: connector.apply(0, {"prefill": 3, "decode": 1}))
    run_all(clock)
    assert acks == [(130.0, 0, "applied", {"prefill": 3, "decode": 1})]
    clock.at(200.0, lambda: connector.apply(1, {"prefill": 1, "decode": 1}))
    run_all(clock)
    assert acks[-1] == (200.0, 1, "applied", {"prefill": 1, "decode": 1})
    assert fleet.count("prefill", "gone") == 2
    # a decision that arrives while another waits for its workers supersedes it
    clock.at(300.0, lambda: connector.apply(2, {"prefill": 2, "decode": 1}))
    clock.at(310.0, lambda: connector.apply(3, {"prefill": 1, "decode": 1}))
    run_all(clock)
    assert [a[1:3] for a in acks[-2:]] == [(2, "superseded"), (3, "applied")]


def test_a_prompt_is_not_routed_behind_a_pass_in_flight(timing, limits):
    """Two long prompts 10 ms apart on two idle prefill engines each get one:
    the first engine is mid-pass, and that counts as load until the pass ends."""
    fleet, clock, log = make_fleet(timing, limits)
    first, second = fleet.add_ready("prefill"), fleet.add_ready("prefill")
    fleet.add_ready("decode")
    submit_at(fleet, clock, 0.0, 0, isl=4000, osl=2)
    submit_at(fleet, clock, 0.01, 1, isl=4000, osl=2)
    run_all(clock)
    by_index = {r.index: r for r in log.finished}
    assert by_index[0].prefill_engine is first and by_index[1].prefill_engine is second
    ttft = [by_index[i].first_token - by_index[i].arrival for i in (0, 1)]
    assert ttft[0] == pytest.approx(ttft[1])


def test_one_passs_prompts_spread_over_the_decode_engines(timing, limits):
    """Eight prompts finish in one prefill pass; their KV transfers are all in
    flight at once, and the decode router counts them, so each of four idle
    decode engines takes two."""
    fleet, clock, log = make_fleet(timing, limits)
    fleet.add_ready("prefill")
    decodes = [fleet.add_ready("decode") for _ in range(4)]
    for i in range(8):
        submit_at(fleet, clock, 0.0, i, isl=500, osl=20)
    run_all(clock)
    placed = [sum(r.decode_engine is e for r in log.finished) for e in decodes]
    assert placed == [2, 2, 2, 2]
    assert all(e.inbound == 0 and e.inbound_context == 0 for e in decodes)


def test_requests_arriving_at_one_instant_share_the_first_pass(timing, limits):
    """Four prompts at t = 0 start one prefill pass together, whatever order the
    arrivals and the engine's start were scheduled in."""
    fleet, clock, log = make_fleet(timing, limits)
    prefill = fleet.add_ready("prefill")
    fleet.add_ready("decode")

    def arrive(i):
        fleet.submit(SimRequest(i, clock.now, 1000, 2))
        if i < 3:
            clock.at(0.0, arrive, i + 1)  # as the runner does: the next arrival after the submit

    clock.at(0.0, arrive, 0)
    run_all(clock)
    assert prefill.iterations == 1
    assert [r.prefill_start for r in log.finished] == [0.0] * 4
    assert [r.prefill_end for r in log.finished] == [pytest.approx(timing.prefill_s(4000))] * 4


def test_end_of_instant_callbacks_run_after_everything_due_then():
    """``at_end`` runs after every ordinary callback at its time, even those
    scheduled after it, and in the order it was called among its kind."""
    clock = VirtualClock()
    order = []
    clock.at(1.0, order.append, "a")
    clock.at_end(1.0, order.append, "end-1")
    clock.at_end(1.0, order.append, "end-2")
    clock.at(1.0, lambda: (order.append("b"), clock.at(1.0, order.append, "c")))
    clock.at(0.5, order.append, "early")
    clock.at(2.0, order.append, "later")
    run_all(clock)
    assert order == ["early", "a", "b", "c", "end-1", "end-2", "later"]


def test_an_unknown_agg_scheduler_is_refused_naming_the_choices():
    """Any name but "prefill-first" ran the chunked scheduler without a word."""
    from fleetplan.sim.runner import SimOptions

    assert SimOptions(agg_scheduler="prefill-first").agg_scheduler == "prefill-first"
    with pytest.raises(ValueError, match=r"agg_scheduler: one of chunked, prefill-first, got 'prefill_first'"):
        SimOptions(agg_scheduler="prefill_first")
