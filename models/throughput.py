"""The throughput loop: predicted demand over per-engine capacity.

Every ``throughput_adjustment_interval_seconds`` the planner forecasts the
next window's request count and mean ISL/OSL, asks the perf model how many
requests per second one engine serves within the SLA, and sizes each role
to ``ceil(demand / capacity)``, never below the role's minimum and moving at
most ``max_throughput_scaling_replicas`` per decision (reference notes §2b).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetplan.models.config import PlannerConfig
from fleetplan.schemas.events import PredictedLoad, Role


@dataclass(frozen=True)
class ThroughputProposal:
    """What the throughput loop wants; ``targets`` is None when it holds."""

    reason: str
    targets: dict[Role, int] | None = None
    predicted: PredictedLoad | None = None
    capacity_rps: dict[Role, float] = field(default_factory=dict)


def replicas_for(demand_rps: float, engine_rps: float, minimum: int) -> int:
    """Engines needed to serve ``demand_rps``, at least ``minimum``."""
    if demand_rps <= 0:
        return minimum
    if engine_rps <= 0:
        raise ValueError("engine capacity must be positive")
    # A tiny epsilon keeps exact multiples (10.0 / 5.0) from rounding up on float noise.
    return max(math.ceil(demand_rps / engine_rps - 1e-9), minimum)


def cap_change(desired: int, current: int, max_step: int, minimum: int) -> int:
    """Move at most ``max_step`` from ``current``; recovering the floor may exceed it."""
    capped = min(max(desired, current - max_step), current + max_step)
    return max(capped, minimum) if desired >= minimum else capped


def propose_throughput(
    config: PlannerConfig,
    current: Mapping[Role, int],
    minimums: Mapping[Role, int],
    forecast: tuple[float, float, float],
    kv_hit_rate: float,
    accept_length: float,
    perf: Mapping[Role, object],
) -> ThroughputProposal:
    """Size every role for the forecast window."""
    num_req, isl, osl = forecast
    interval = config.throughput_adjustment_interval_seconds
    demand_rps = num_req / interval
    predicted = PredictedLoad(
        num_req=num_req, isl=isl, osl=osl, rps=demand_rps,
        kv_hit_rate=kv_hit_rate, accept_length=accept_length,
    )
    capacity: dict[Role, float] = {}
    targets: dict[Role, int] = {}
    for role in config.roles:
        model = perf[role]
        if demand_rps > 0:
            if not model.ready:
                return ThroughputProposal("model_not_ready", None, predicted, capacity)
            cap = model.capacity_rps(
                isl=max(round(isl), 1), osl=max(round(osl), 1), ttft_ms=config.ttft_ms,
                itl_ms=config.itl_ms, kv_hit_rate=kv_hit_rate, accept_length=accept_length,
            )
            if cap is None or cap.rps <= 0:
                return ThroughputProposal("model_not_ready", None, predicted, capacity)
            capacity[role] = cap.rps
            # Sizing at 100% of the SLA-bound rate leaves no room for bursts
            # within the window; target_utilization < 1 keeps headroom.
            desired = replicas_for(demand_rps, cap.rps * config.target_utilization, minimums[role])
        else:
            desired = minimums[role]
        targets[role] = cap_change(
            desired, current[role], config.max_throughput_scaling_replicas, minimums[role]
        )
    return ThroughputProposal("scale", targets, predicted, capacity)
