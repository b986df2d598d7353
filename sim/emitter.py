"""Turning what the simulated fleet does into fleetplan events.

Every event is built once, from numbers the simulator computed, and goes to
two places: the controller (the planning core's ``Fleet.feed``) and the
run's JSONL log, so the log holds exactly the inputs the planner saw, in
the order it saw them, and ``fleetplan plan`` replays it decision for
decision.

Events are built from complete dicts of known-good values without
re-validation (about 1.8 µs instead of 5 µs each; a day of traffic is
millions of events). ``FLEETPLAN_SIM_VALIDATE=1`` validates every event
instead, to catch a simulator bug that produced a negative count or a NaN;
the tests check that both ways give equal events.
"""

from __future__ import annotations

import os
from typing import IO

from fleetplan.schemas.codec import encode_event
from fleetplan.schemas.events import (
    Ack,
    ClockEvent,
    ControlEvent,
    ForwardPassMetrics,
    InventoryEvent,
    QueuedRequests,
    RequestArrival,
    RequestRecord,
    ScheduledRequests,
)

VALIDATE = os.environ.get("FLEETPLAN_SIM_VALIDATE", "") not in ("", "0")
_set = object.__setattr__


def _trusted(cls):
    """A constructor that takes a dict holding every field, already of the right type."""
    if VALIDATE:
        return cls.model_validate

    def build(values: dict):
        obj = cls.__new__(cls)
        _set(obj, "__dict__", values)
        _set(obj, "__pydantic_fields_set__", set(values))
        _set(obj, "__pydantic_extra__", None)
        _set(obj, "__pydantic_private__", None)
        return obj

    return build


_fpm = _trusted(ForwardPassMetrics)
_scheduled = _trusted(ScheduledRequests)
_queued = _trusted(QueuedRequests)
_request = _trusted(RequestRecord)
_arrival = _trusted(RequestArrival)
_inventory = _trusted(InventoryEvent)
_clock = _trusted(ClockEvent)
_ack = _trusted(Ack)


class EventLog:
    """The run's JSONL log (the same line format as :mod:`fleetplan.eventlog`)."""

    def __init__(self, out: IO[bytes] | None) -> None:
        self.out = out
        self.count = 0

    def write(self, event) -> None:
        if self.out is not None:
            self.out.write(encode_event(event) + b"\n")
            self.count += 1


def fpm_event(deployment: str, time: float, role: str, worker_id: str, s: dict) -> ForwardPassMetrics:
    n_pre, pre_tokens, pre_kv, n_dec, dec_kv = s["sched"]
    q_pre_n, q_pre_tokens, q_dec_n, q_dec_kv = s["queued"]
    scheduled = {
        "num_prefill_requests": n_pre, "sum_prefill_tokens": pre_tokens, "var_prefill_length": 0.0,
        "sum_prefill_kv_tokens": pre_kv, "num_decode_requests": n_dec,
        "sum_decode_kv_tokens": dec_kv, "var_decode_kv_tokens": 0.0,
    }
    queued = {
        "num_prefill_requests": q_pre_n, "sum_prefill_tokens": q_pre_tokens, "var_prefill_length": 0.0,
        "num_decode_requests": q_dec_n, "sum_decode_kv_tokens": q_dec_kv, "var_decode_kv_tokens": 0.0,
    }
    return _fpm({
        "deployment": deployment, "time": float(time), "schema_version": 1, "type": "fpm",
        "role": role, "worker_id": worker_id, "dp_rank": 0,
        "counter_id": s["counter"], "wall_time": float(s["wall_time"]),
        "scheduled": scheduled if VALIDATE else _scheduled(scheduled),
        "queued": queued if VALIDATE else _queued(queued),
    })


def request_event(deployment: str, req) -> RequestRecord:
    prefill = req.prefill_engine
    decode = req.decode_engine
    itl = (req.end - req.first_token) / (req.osl - 1) * 1000.0 if req.osl > 1 else None
    start = req.prefill_start if req.prefill_start >= 0 else req.arrival
    return _request({
        "deployment": deployment, "time": float(req.end), "schema_version": 1, "type": "request",
        "request_id": req.rid, "model": None,
        "input_tokens": req.isl, "output_tokens": req.osl, "cached_tokens": req.cached,
        "request_received_ms": req.arrival * 1000.0,
        "prefill_wait_time_ms": (start - req.arrival) * 1000.0,
        "prefill_time_ms": max(0.0, req.prefill_end - start) * 1000.0,
        "ttft_ms": (req.first_token - req.arrival) * 1000.0,
        "total_time_ms": (req.end - req.arrival) * 1000.0,
        "avg_itl_ms": itl,
        "kv_hit_rate": req.cached / req.isl,
        "accept_length": None, "queue_depth": None,
        "prefill_worker_id": None if prefill is None else prefill.worker_id,
        "decode_worker_id": None if decode is None else decode.worker_id,
    })


def arrival_event(deployment: str, req) -> RequestArrival:
    return _arrival({
        "deployment": deployment, "time": float(req.arrival), "schema_version": 1, "type": "arrival",
        "request_id": req.rid, "model": None, "input_tokens": req.isl,
    })


def inventory_event(
    deployment: str, time: float, worker_id: str, role: str, state: str, gpus: int,
    decision_id: int | None,
) -> InventoryEvent:
    return _inventory({
        "deployment": deployment, "time": float(time), "schema_version": 1, "type": "inventory",
        "worker_id": worker_id, "role": role, "state": state, "gpus": gpus, "decision_id": decision_id,
    })


def clock_event(deployment: str, time: float) -> ClockEvent:
    return _clock({"deployment": deployment, "time": float(time), "schema_version": 1, "type": "clock", "source": "sim"})


def retune_event(deployment: str, time: float, changes: dict) -> ControlEvent:
    """A retune decision's config change, as an operator's ``set_config`` (validated: rare)."""
    return ControlEvent.model_validate({
        "deployment": deployment, "time": float(time), "type": "control", "issued_by": "retune",
        "body": {"command": "set_config", "changes": dict(changes)},
    })


def ack_event(deployment: str, time: float, decision_id: int, status: str, observed: dict) -> Ack:
    return _ack({
        "deployment": deployment, "time": float(time), "schema_version": 1, "type": "ack",
        "decision_id": decision_id, "status": status, "observed": dict(observed), "error": None,
    })
