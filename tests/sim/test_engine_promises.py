"""What docs/simulate.md promises of an engine, request by request, on hand-checked cases:
a lone request's TTFT and ITL are its profile's pass times, a prompt after a prefix hit
is chunked as perf-model.md's ``chunked()`` times its fresh tokens, every request is
served once however engines come and go, and TTFT/ITL are measured as the SLA defines
them."""

from __future__ import annotations

import math
import random

import pytest

from fleetplan.models.perf.chunking import chunked_time
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.engines import SimRequest
from fleetplan.sim.fleet import FleetListener, KvTransfer, SimFleet
from fleetplan.sim.metrics import RequestLog
from fleetplan.sim.router import ROUTERS, make_router
from fleetplan.sim.startup import parse_startup
from tests.sim.sim_helpers import run_all


def test_a_lone_agg_request_takes_its_prompt_pass_then_decode_steps_of_a_batch_of_one(make_engine, timing):
    engine, clock, rec = make_engine("agg")
    engine.enqueue(SimRequest(0, 0.0, 3000, 11))
    run_all(clock)
    (req, end), = rec.finished
    assert req.first_token == pytest.approx(timing.prefill_s(3000))
    # ten steps of one sequence whose context grows from 3,001 to 3,010 tokens
    assert (end - req.first_token) / 10 == pytest.approx(timing.decode_s(1, 3005), rel=1e-3)


@pytest.mark.parametrize("isl", [12_000, 20_000, 30_000])
def test_a_long_prompt_after_a_prefix_hit_is_chunked_as_chunked_times_its_fresh_tokens(make_engine, timing, isl):
    engine, clock, rec = make_engine("prefill", prefix_block_tokens=512)
    blocks = math.ceil(isl / 512)
    engine.enqueue(SimRequest(0, 0.0, 4096, 2, hash_ids=tuple(range(8))))
    run_all(clock)
    start = clock.now
    long = SimRequest(1, start, isl, 2, hash_ids=tuple(range(blocks)))
    engine.enqueue(long)
    run_all(clock)
    assert long.cached == 4096
    fresh = isl - 4096
    assert long.prefill_end - start == pytest.approx(chunked_time(fresh, 8192, timing.prefill_s))
    assert engine.iterations == 1 + math.ceil(fresh / 8192)


class _Finished(FleetListener):
    def __init__(self) -> None:
        self.requests: list[SimRequest] = []

    def request_finished(self, req: SimRequest) -> None:
        self.requests.append(req)


@pytest.mark.parametrize("mode", ["disagg", "agg"])
@pytest.mark.parametrize("router", ROUTERS)
def test_every_request_is_served_once_while_engines_start_and_drain(timing, limits, mode, router):
    rng = random.Random(7)
    clock = VirtualClock()
    done = _Finished()
    roles = ("prefill", "decode") if mode == "disagg" else ("agg",)
    fleet = SimFleet(clock, mode, timing, limits, dict.fromkeys(roles, 1), make_router(router),
                     parse_startup("3"), KvTransfer(), done)
    for role in roles:
        fleet.add_ready(role)
        fleet.add_ready(role)
    sent = []
    t = 0.0
    for i in range(200):
        t += rng.expovariate(20.0)
        blocks = rng.randint(1, 8)
        hashes = tuple(rng.randrange(3) * 100 + b if b < 3 else rng.randrange(10**6) for b in range(blocks))
        req = SimRequest(i, round(t, 1), rng.randint(1, blocks * 512), rng.choice([1, 2, rng.randint(1, 300)]), hashes)
        sent.append(req)
        clock.at(req.arrival, fleet.submit, req)

    def scale(role: str) -> None:
        live = [e for e in fleet.live(role) if e.state in ("starting", "ready")]
        if live and rng.random() < 0.5:
            fleet.stop(rng.choice(live), None)  # a ready engine drains, a starting one is cancelled
        else:
            fleet.start(role, None)

    for _ in range(30):
        clock.at(rng.uniform(0.0, t), scale, rng.choice(roles))
    for role in roles:
        clock.at(t + 1.0, fleet.start, role, None)  # the last role left empty gets an engine again
    run_all(clock)
    assert sorted(r.index for r in done.requests) == list(range(200))  # each once
    assert fleet.in_flight == 0 and not any(fleet.frontend.values())
    for req in sent:
        assert req.arrival <= req.first_token <= req.end
    for engine in fleet.engines:
        assert engine.state in ("ready", "gone", "starting")
        assert (engine.running, engine.kv, engine.kv_reserved, engine.prefill_backlog, engine.inbound) == (0, 0, 0, 0, 0)


def test_ttft_and_itl_are_measured_as_the_sla_defines_them():
    log = RequestLog()
    answer = SimRequest(0, 1.0, 1000, 11)
    answer.first_token, answer.end = 1.25, 1.75
    one = SimRequest(1, 2.0, 1000, 1)
    one.first_token = one.end = 2.1
    log.add(answer)
    log.add(one)
    a = log.arrays()
    assert a["ttft"].tolist() == pytest.approx([0.25, 0.1])
    assert a["itl"][0] == pytest.approx(0.05)  # (end − first token) / (osl − 1)
    assert math.isnan(a["itl"][1])  # a one-token answer has no ITL: it meets any target
