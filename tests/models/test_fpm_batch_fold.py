"""Folding an FPM batch decoded by msgspec is folding it decoded by pydantic.

The worker decodes ``fpm_batch`` records into :class:`WireFpmBatch` structs
(``schemas/fpm_wire.py``); the audit, the simulator and ``fleetplan plan``
decode them into pydantic models. The same records must leave the same state,
byte for byte, and the same tick reports and decisions. And a batch, however
decoded, must leave the state that applying its FPMs one by one leaves.
"""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.models.sequencer import FoldAhead, advance, offer, watermark_of
from fleetplan.schemas import decode_event, encode_event
from fleetplan.schemas.events import (
    ForwardPassMetrics,
    FpmBatch,
    InventoryEvent,
    QueuedRequests,
    ScheduledRequests,
)
from fleetplan.schemas.fpm_wire import WireFpmBatch, decode_input
from tests.models.factories import T0

WORKERS = {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode", "a0": "agg"}


def random_fpm(rng: random.Random, t: float) -> ForwardPassMetrics:
    worker = rng.choice(sorted(WORKERS))
    # Mostly the engine's own role; sometimes another (a mislabelled engine, or a
    # role the mode does not plan).
    role = rng.choice([WORKERS[worker]] * 4 + ["prefill", "decode", "agg"])
    return ForwardPassMetrics(
        deployment="d", time=t, role=role, worker_id=worker, dp_rank=rng.randint(0, 2),
        counter_id=rng.randint(0, 10**6),
        wall_time=0.0 if rng.random() < 0.1 else rng.uniform(0.001, 0.5),  # some heartbeats
        scheduled=ScheduledRequests(
            num_prefill_requests=rng.randint(0, 8), sum_prefill_tokens=rng.randint(0, 40_000),
            sum_prefill_kv_tokens=rng.randint(0, 20_000), num_decode_requests=rng.randint(0, 64),
            sum_decode_kv_tokens=rng.randint(0, 200_000), var_decode_kv_tokens=rng.uniform(0, 1e6),
        ),
        queued=QueuedRequests(num_prefill_requests=rng.randint(0, 5),
                              sum_prefill_tokens=rng.randint(0, 90_000)),
    )


def event_log(seed: int, steps: int) -> list:
    """FPM batches (up to 40 FPMs, random engines) with inventory steps between them."""
    rng = random.Random(seed)
    events, t = [], T0
    for _ in range(steps):
        t += rng.uniform(0.05, 2.0)
        if rng.random() < 0.2:
            worker = rng.choice(sorted(WORKERS))
            events.append(InventoryEvent(deployment="d", time=t, worker_id=worker, role=WORKERS[worker],
                                         state=rng.choice(["starting", "ready", "draining", "gone"])))
            continue
        times = sorted(t - rng.uniform(0, 0.04) for _ in range(rng.randint(1, 40)))
        fpms = [random_fpm(rng, ft) for ft in times]
        events.append(FpmBatch(deployment="d", time=times[-1], fpms=fpms))
    return events


event_logs = st.builds(event_log, st.integers(0, 2**32), st.integers(1, 40))


def state_bytes(state) -> bytes:
    return orjson.dumps(state.to_data())


def fold(planner, events) -> bytes:
    state = planner.new_state("d")
    for event in events:
        planner.apply(state, event)
    return state_bytes(state)


def one_by_one(events) -> list:
    out = []
    for event in events:
        out.extend(event.fpms if event.type == "fpm_batch" else [event])
    return out


def ticked(planner, events) -> tuple[list, bytes]:
    """The worker's way: offered, folded ahead, ticks at the watermark."""
    state, ahead, out = planner.new_state("d"), FoldAhead(), []
    for event in events:
        offer(state, event, ahead)
        for report in advance(planner, state, watermark_of(state), ahead):
            out.append((orjson.dumps(report.to_dict()),
                        None if report.decision is None else encode_event(report.decision)))
    out += [(orjson.dumps(r.to_dict()), None) for r in advance(planner, state, state.max_time + 10, ahead)]
    return out, state_bytes(state)


SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("mode", ["disagg", "agg"])
@SETTINGS
@given(event_logs)
def test_wire_batches_fold_to_the_same_state_bytes(make_fleet, mode, events):
    planner = make_fleet(mode=mode, enable_load_scaling=True).planner
    records = [encode_event(e) for e in events]
    wire = [decode_input(r) for r in records]
    assert [type(w) is WireFpmBatch for w in wire] == [e.type == "fpm_batch" for e in events]
    reference = fold(planner, [decode_event(r) for r in records])
    assert fold(planner, wire) == reference
    assert fold(planner, one_by_one(events)) == reference


@SETTINGS
@given(event_logs)
def test_wire_batches_tick_and_decide_alike(make_fleet, events):
    planner = make_fleet(mode="disagg", enable_load_scaling=True, load_predictor="kalman",
                         grace_seconds=1.0).planner
    records = [encode_event(e) for e in events]
    assert ticked(planner, [decode_input(r) for r in records]) == ticked(
        planner, [decode_event(r) for r in records])


def test_a_realistic_log_decides_alike(make_fleet):
    """Hours of steady packed FPMs with decisions: not only small random logs."""
    planner = make_fleet(mode="agg", enable_load_scaling=True, grace_seconds=1.0).planner
    events = []
    for second in range(900):
        fpms = [ForwardPassMetrics(
            deployment="d", time=T0 + second + k / 20, role="agg", worker_id=f"a{e}",
            counter_id=second * 20 + k, wall_time=0.02 + (k % 7) * 0.003,
            scheduled=ScheduledRequests(num_decode_requests=8 + (second // 60) % 9 + e,
                                        sum_decode_kv_tokens=8000 + (second * 37 + k) % 5000),
            queued=QueuedRequests(num_prefill_requests=(second // 120) % 3, sum_prefill_tokens=9000 * ((second // 120) % 3)),
        ) for k in range(20) for e in range(3)]
        events.append(FpmBatch(deployment="d", time=max(f.time for f in fpms), fpms=fpms))
    records = [encode_event(e) for e in events]
    wire, reference = ticked(planner, [decode_input(r) for r in records]), ticked(
        planner, [decode_event(r) for r in records])
    assert any(d for _, d in reference[0]), "the log must decide"
    assert wire == reference
