"""Turning what the simulated fleet does into fleetplan events.

Every event is built once, from numbers the simulator computed, and goes to
two places: the controller (the planning core's ``Fleet.feed``) and the
run's JSONL log, so the log holds exactly the inputs the planner saw, in
the order it saw them, and ``fleetplan plan`` replays it decision for
decision.

Events are built with ``model_validate`` on plain dicts: a few microseconds
each, and a simulator bug that produced a negative count or a NaN fails
loudly here instead of deep in the planner.
"""

from __future__ import annotations

from typing import IO

from fleetplan.schemas.codec import encode_event
from fleetplan.schemas.events import (
    Ack,
    ClockEvent,
    ForwardPassMetrics,
    InventoryEvent,
    RequestRecord,
)

_fpm = ForwardPassMetrics.model_validate
_request = RequestRecord.model_validate
_inventory = InventoryEvent.model_validate
_clock = ClockEvent.model_validate
_ack = Ack.model_validate


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
    return _fpm({
        "deployment": deployment, "time": time, "role": role, "worker_id": worker_id,
        "counter_id": s["counter"], "wall_time": s["wall_time"],
        "scheduled": {
            "num_prefill_requests": n_pre, "sum_prefill_tokens": pre_tokens,
            "sum_prefill_kv_tokens": pre_kv, "num_decode_requests": n_dec,
            "sum_decode_kv_tokens": dec_kv,
        },
        "queued": {
            "num_prefill_requests": q_pre_n, "sum_prefill_tokens": q_pre_tokens,
            "num_decode_requests": q_dec_n, "sum_decode_kv_tokens": q_dec_kv,
        },
    })


def request_event(deployment: str, req) -> RequestRecord:
    prefill = req.prefill_engine
    decode = req.decode_engine
    itl = (req.end - req.first_token) / (req.osl - 1) * 1000.0 if req.osl > 1 else None
    start = req.prefill_start if req.prefill_start >= 0 else req.arrival
    return _request({
        "deployment": deployment, "time": req.end, "request_id": req.rid,
        "input_tokens": req.isl, "output_tokens": req.osl, "cached_tokens": req.cached,
        "request_received_ms": req.arrival * 1000.0,
        "prefill_wait_time_ms": (start - req.arrival) * 1000.0,
        "prefill_time_ms": max(0.0, req.prefill_end - start) * 1000.0,
        "ttft_ms": (req.first_token - req.arrival) * 1000.0,
        "total_time_ms": (req.end - req.arrival) * 1000.0,
        "avg_itl_ms": itl,
        "kv_hit_rate": req.cached / req.isl,
        "prefill_worker_id": None if prefill is None else prefill.worker_id,
        "decode_worker_id": None if decode is None else decode.worker_id,
    })


def inventory_event(
    deployment: str, time: float, worker_id: str, role: str, state: str, gpus: int,
    decision_id: int | None,
) -> InventoryEvent:
    return _inventory({
        "deployment": deployment, "time": time, "worker_id": worker_id, "role": role,
        "state": state, "gpus": gpus, "decision_id": decision_id,
    })


def clock_event(deployment: str, time: float) -> ClockEvent:
    return _clock({"deployment": deployment, "time": time, "source": "sim"})


def ack_event(deployment: str, time: float, decision_id: int, status: str, observed: dict) -> Ack:
    return _ack({
        "deployment": deployment, "time": time, "decision_id": decision_id, "status": status,
        "observed": observed,
    })
