"""Event factories for core tests."""

from __future__ import annotations

from fleetplan.schemas import (
    Ack,
    ForwardPassMetrics,
    InventoryEvent,
    QueuedRequests,
    RequestRecord,
    ScheduledRequests,
)

T0 = 1_800_000_000.0  # a multiple of 180, 5 and 60: ticks fall on round offsets from it


def ready(worker: str, role: str, t: float = T0 + 0.1, state: str = "ready", gpus: int = 1, dep: str = "d"):
    return InventoryEvent(deployment=dep, time=t, worker_id=worker, role=role, state=state, gpus=gpus)


def requests(rate: float, start: float, end: float, isl: int = 3000, osl: int = 150, dep: str = "d", tag: str = "r"):
    """Finished requests at a steady rate in [start, end)."""
    out = []
    n = int((end - start) * rate)
    for i in range(n):
        t = start + i / rate
        out.append(RequestRecord(deployment=dep, time=t, request_id=f"{tag}{i}", input_tokens=isl,
                                 output_tokens=osl, request_received_ms=max(t - 0.2, 0) * 1000))
    return out


def fpm(worker: str, role: str, t: float, *, wall: float = 0.02, queued_prefill: int = 0,
        decode_reqs: int = 0, decode_kv: int = 0, queued_kv: int = 0, prefill_tokens: int = 0,
        counter: int = 0, dep: str = "d"):
    return ForwardPassMetrics(
        deployment=dep, time=t, role=role, worker_id=worker, counter_id=counter, wall_time=wall,
        scheduled=ScheduledRequests(
            num_prefill_requests=1 if prefill_tokens else 0, sum_prefill_tokens=prefill_tokens,
            num_decode_requests=decode_reqs, sum_decode_kv_tokens=decode_kv),
        queued=QueuedRequests(
            num_prefill_requests=1 if queued_prefill else 0, sum_prefill_tokens=queued_prefill,
            sum_decode_kv_tokens=queued_kv),
    )


def ack(decision_id: int, t: float, status: str = "applied", dep: str = "d"):
    return Ack(deployment=dep, time=t, decision_id=decision_id, status=status)


def decisions(outputs):
    return [o.decision for o in outputs if getattr(o, "decision", None) is not None]
