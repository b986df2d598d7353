"""Synthetic traffic for the streams tests: events of one deployment that make the
planner decide often (see DECIDING_CONFIG), and a planner built from that config."""

from __future__ import annotations

from pathlib import Path

from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.schemas.events import (
    ClockEvent,
    ForwardPassMetrics,
    FpmBatch,
    QueuedRequests,
    RequestRecord,
    ScheduledRequests,
)

ROOT = Path(__file__).resolve().parents[2]
FLEETPLAN = str(ROOT / ".venv" / "bin" / "fleetplan")
T0 = 1_000.0

DECIDING_CONFIG = {
    "mode": "agg",
    "optimization_target": "throughput",  # threshold mode: load loop on, no perf model
    "load_adjustment_interval_seconds": 5,
    "context_length": 8192,
    # hot: 4,000 KV + 9,000 queued prompt tokens, over the cache (Dynamo's agg figure): up;
    # idle: 4,000, a third of it: down
    "max_kv_tokens": 12_000,
    "ack_timeout_seconds": 5,
    "grace_seconds": 1,
    "max_gpu_budget": -1,
    "max_endpoint": 8,
}


def deciding_planner() -> Planner:
    return Planner(config_from_dict(dict(DECIDING_CONFIG)))


def fpm(deployment: str, t: float, counter: int, *, worker: str = "w0", hot: bool = True) -> ForwardPassMetrics:
    """One agg engine iteration; ``hot`` queues more prompt tokens than its KV cache has room for."""
    return ForwardPassMetrics(
        deployment=deployment, time=t, role="agg", worker_id=worker, counter_id=counter, wall_time=0.02,
        scheduled=ScheduledRequests(num_decode_requests=4, sum_decode_kv_tokens=4000),
        queued=QueuedRequests(num_prefill_requests=3 if hot else 0, sum_prefill_tokens=9000 if hot else 0),
    )


def request(deployment: str, t: float, n: int) -> RequestRecord:
    return RequestRecord(
        deployment=deployment, time=t, request_id=f"{deployment}-r{n}", input_tokens=100 + n % 7,
        output_tokens=20 + n % 5, cached_tokens=n % 50, request_received_ms=(t - 0.5) * 1000.0,
        ttft_ms=40.0, avg_itl_ms=8.0,
    )


def hot_phase(t: float) -> bool:
    """Load pattern: 20 s hot, 20 s idle, so decisions come in runs."""
    return int((t - T0) // 20) % 2 == 0


def traffic(deployment: str, seconds: float, *, step: float = 0.25, start: float = T0,
            batch: int = 1) -> tuple[list, list]:
    """(fpm events, request events) of one deployment over ``seconds`` of event time.

    ``batch`` > 1 packs consecutive FPMs into FpmBatch records, cut at whole seconds
    as the bridge does.
    """
    fpms, requests = [], []
    n = int(seconds / step)
    for i in range(n):
        t = start + i * step
        fpms.append(fpm(deployment, t, i, hot=hot_phase(t)))
        if i % 3 == 0:
            requests.append(request(deployment, t, i))
    if batch > 1:
        packed, group = [], []
        for f in fpms:
            if group and (len(group) >= batch or int(f.time) != int(group[0].time)):
                packed.append(FpmBatch(deployment=deployment, time=group[-1].time, fpms=group))
                group = []
            group.append(f)
        if group:
            packed.append(FpmBatch(deployment=deployment, time=group[-1].time, fpms=group))
        fpms = packed
    return fpms, requests


def clock(deployment: str, t: float) -> ClockEvent:
    return ClockEvent(deployment=deployment, time=t, source="test")


