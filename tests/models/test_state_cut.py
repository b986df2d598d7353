"""Cut the events anywhere, restore the state from its JSON, continue: the decisions of one run.

``test_state.py`` checks this on one disagg scenario with whole-number traffic. Here the
scenario is one of a matrix (every load predictor, disagg and agg, cold, warmed up or seeded,
a ``set_config`` that shortens the throughput interval and swaps the predictor), its traffic
has arrivals, prefix-cache hits and accept lengths whose floats are not round, and the cut
falls where restores go wrong: just before and after each tick fires, with a control event
waiting in the buffer, and anywhere inside a window.
"""

from __future__ import annotations

import functools
import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.config import config_from_dict
from fleetplan.models.fleet import Fleet
from fleetplan.models.forecast import TrafficObservation
from fleetplan.models.planner import Planner
from fleetplan.models.predictor_swap import seed_control
from fleetplan.models.sequencer import advance, offer, watermark_of
from fleetplan.schemas import ControlEvent, RequestArrival, RequestRecord, SetConfig
from fleetplan.schemas.codec import event_to_dict
from fleetplan.sim.profiles import load_profile
from tests.models.factories import T0, ack, fpm, ready

PREDICTORS = ("constant", "kalman", "arima", "arima_frozen", "ensemble", "prophet")
END = 1500.0  # seconds of traffic after T0


@functools.cache
def _profile():
    return load_profile("h200-llama3.1-8b")


def _planner(mode: str, predictor: str, start: str) -> Planner:
    cfg = config_from_dict({
        "mode": mode, "load_predictor": predictor, "max_gpu_budget": 64, "enable_load_scaling": True,
        "load_scale_down_stabilization_seconds": None, "load_max_scale_up_step": 8, "grace_seconds": 2.0,
        "ack_timeout_seconds": 40.0,  # decisions the acks below miss still let the next through
    })
    warmup = None
    if start == "warm_up":
        warmup = [TrafficObservation(duration_s=180, num_req=540.0 + 37.3 * i, isl=2100.0 + i / 3, osl=151.7)
                  for i in range(6)]
    return Planner(cfg, profile=_profile(), warmup=warmup)


def _engines(mode: str) -> list[tuple[str, str]]:
    """Three agg engines, one more than the traffic needs: a cold agg start makes its decisions once the
    hold until a forecast is scored lets a scale-down through (with two, its one decision was the first
    tick's release, which hold_until_scored: all, the default since 2026-12-07, keeps)."""
    return [("a0", "agg"), ("a1", "agg"), ("a2", "agg")] if mode == "agg" else [("p0", "prefill"), ("d0", "decode")]


@functools.cache
def _events(mode: str, start: str, reconfigure: bool) -> tuple:
    """Arrivals and finished requests at an uneven rate, FPMs, acks, and the controls."""
    rnd = random.Random(11)
    evs: list = [ready(w, role) for w, role in _engines(mode)]
    t = T0 + 0.37
    i = 0
    while t < T0 + END:
        isl = 1500 + rnd.randrange(3000)
        evs.append(RequestArrival(deployment="d", time=t, request_id=f"r{i}", input_tokens=isl))
        done = t + 0.3 + rnd.random() * 2
        evs.append(RequestRecord(
            deployment="d", time=done, request_id=f"r{i}", input_tokens=isl, output_tokens=80 + rnd.randrange(200),
            cached_tokens=rnd.randrange(isl // 3), accept_length=1.0 + rnd.random() * 2,
            request_received_ms=t * 1000, ttft_ms=100 * rnd.random(), avg_itl_ms=10 * rnd.random()))
        rate = 3.0 + 2.5 * ((t - T0) // 200 % 3)  # requests a second, changing every 200 s
        t += rnd.expovariate(rate)
        i += 1
    for k in range(1, int(END), 3):
        for w, role in _engines(mode):
            load = (k * 7919 + len(w)) % 9
            evs.append(fpm(w, role, T0 + k + 0.41 + len(w) / 10, counter=k, wall=0.01 + load * 0.003,
                           queued_prefill=load * 900 if role != "decode" else 0,
                           decode_reqs=load + 2 if role != "prefill" else 0, decode_kv=2000 * load + k))
    evs += [ack(n, T0 + 200 + 170 * n) for n in range(5)]
    if start == "seed":
        rows = [[T0 - 180 * (8 - j), 180.0, 600.0 + 41.7 * j, 2000.5 + j, 150.25, 0.1 + j / 70, 1.3, 5.3 + j / 9]
                for j in range(8)]
        evs.append(seed_control("d", T0, rows))
    if reconfigure:
        evs.append(ControlEvent(deployment="d", time=T0 + 701.5, body=SetConfig(changes={
            "throughput_adjustment_interval_seconds": 60, "load_predictor": "kalman", "quantile_basis": "tokens"})))
    return tuple(sorted(evs, key=lambda e: e.time))


def _dump(out) -> bytes:
    """Each output as it leaves the core: a report with its decision in full, or a late event."""
    return orjson.dumps([
        [o.to_dict(), None if o.decision is None else event_to_dict(o.decision)] if hasattr(o, "to_dict")
        else [o.time, o.last_tick] for o in out
    ])


@functools.cache
def _straight(mode: str, predictor: str, start: str, reconfigure: bool) -> tuple[list[bytes], tuple[int, ...]]:
    """Each event's outputs in one uninterrupted run, and the cuts worth trying."""
    fleet = Fleet(_planner(mode, predictor, start))
    events = _events(mode, start, reconfigure)
    per_event = [_dump(fleet.feed(e)) for e in events] + [_dump(fleet.finish())]
    fired = [i for i, e in enumerate(events) if per_event[i] != b"[]"]
    controls = [i for i, e in enumerate(events) if e.type == "control"]
    # just before and after each tick fires, and with a control waiting for its tick
    near = {j for i in fired for j in (i - 1, i, i + 1)} | {j for i in controls for j in (i + 1, i + 2, i + 40)}
    return per_event, tuple(sorted(j for j in near if 0 < j < len(events)))


def _check_cut(mode: str, predictor: str, start: str, reconfigure: bool, cut: int, *, reread: bool = False) -> None:
    """Restore at ``cut`` from the state's JSON; with ``reread``, as the worker does: the state
    without its buffer, the buffered events read again (here in reverse) before the next event."""
    expected, _ = _straight(mode, predictor, start, reconfigure)
    events = _events(mode, start, reconfigure)
    first = Fleet(_planner(mode, predictor, start))
    got = [_dump(first.feed(e)) for e in events[:cut]]
    blob = orjson.dumps(first.to_data())  # what a changelog table stores
    restored = Fleet(first.planner)
    restored.load_data(orjson.loads(blob))
    assert orjson.dumps(restored.to_data()) == blob
    if reread:
        state = restored.states["d"]
        buffered, state.buffer = state.buffer, []
        restored.load_data(orjson.loads(orjson.dumps(restored.to_data())))
        state = restored.states["d"]
        for event in reversed(buffered):
            assert offer(state, event)
        assert advance(restored.planner, state, watermark_of) == []  # the straight run fired these already
    got += [_dump(restored.feed(e)) for e in events[cut:]] + [_dump(restored.finish())]
    assert b"decision_id\":0" in b"".join(expected), "the scenario must produce decisions"
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"cut at {cut}: event {i} ({events[min(i, len(events) - 1)].time - T0:.3f}) differs"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["disagg", "agg"]), st.sampled_from(PREDICTORS),
       st.sampled_from(["cold", "warm_up", "seed"]), st.booleans(), st.booleans(), st.data())
def test_a_cut_anywhere_restores_to_the_same_decisions(mode, predictor, start, reconfigure, reread, data):
    _, near = _straight(mode, predictor, start, reconfigure)
    n = len(_events(mode, start, reconfigure))
    cut = data.draw(st.one_of(st.sampled_from(near), st.integers(1, n - 1)), label="cut")
    _check_cut(mode, predictor, start, reconfigure, cut, reread=reread)


@pytest.mark.parametrize("predictor", PREDICTORS)
def test_a_cut_just_after_the_interval_change_restores(predictor):
    """The set_config waits in the buffer for its tick, then the tick after applies it."""
    _, near = _straight("disagg", predictor, "warm_up", True)
    controls = [i for i, e in enumerate(_events("disagg", "warm_up", True)) if e.type == "control"]
    for cut in (controls[-1] + 1, next(j for j in near if j > controls[-1] + 2)):
        _check_cut("disagg", predictor, "warm_up", True, cut)
