"""How long a new worker takes to serve: measured from inventory, used as a horizon.

Capacity asked for now arrives one startup later (image pull, weight load,
warm-up: minutes for a large model), and the next decision's capacity one
throughput interval after that. So the replicas chosen at a tick must carry
the load from ``now + startup`` to ``now + interval + startup``: the
throughput loop, in ``startup_quantile`` sizing, sizes for the largest
window count among the next ``ceil((startup + interval) / interval)``
windows.

The startup is measured, not assumed: the time from a scale-up decision to
the ready event of a worker it started (the inventory event names the
decision), or, when the orchestrator does not say which decision started a
worker, from the worker's own ``starting`` event to ``ready``. A deployment
with no inventory at all (fleetplan's live stack has no producer of it) is
timed by its acks instead: a connector acks a decision ``applied`` once the
fleet serves it (Kubernetes: the DGD is stable; virtual: the orchestrator
completed it), so the ack of a scale-up whose observed counts reach every
target is a startup too, the slowest of its engines'. The median of the
last ``STARTUP_SAMPLES`` is used (one slow image pull should not stretch
every later horizon); ``startup_seconds`` from the config stands in until
the first sample.
"""

from __future__ import annotations

import math

from fleetplan.models.config import MAX_STARTUP_SECONDS

STARTUP_SAMPLES = 8
SCALE_UP_MEMORY = 16
"""Recent scale-up decisions remembered so a late ready event still finds its decision."""


def record_scale_up(state, decision_id: int, time: float) -> None:
    """Remember when a decision that adds workers was made."""
    state.scale_up_times.append([decision_id, time])
    del state.scale_up_times[:-SCALE_UP_MEMORY]


def startup_sample(state, ev, previous) -> None:
    """Record one startup from a worker's ready event, if it can be timed."""
    start = None
    if ev.decision_id is not None:
        start = _scale_up_time(state, ev.decision_id)
    if start is None and previous is not None:
        start = previous.since  # time of its 'starting' event
    _keep(state, start, ev.time)


def ack_startup_sample(state, ack, targets: dict, reached: dict | None = None) -> None:
    """Record one startup from the ``applied`` ack of a scale-up decision, if inventory times none.

    Only where the deployment has had no inventory event: ready events time
    each engine, an ack only the slowest of a decision's, and both at once
    would count one scale-up twice. Only when the ack's observed counts reach
    every target: a connector that stopped waiting (Kubernetes'
    ``--ready-timeout``) acks with what serves so far, and that ack's time is
    not when the new engines served. Only when the decision asks for more
    than ``reached``, the counts the fleet was last acked at: a decision the
    ack timeout gave up on is made again from the baseline it never moved,
    and once the late ack of the first has moved it, the second started no
    engine, and its ack timed what was left of the first's startup.
    """
    if state.inventory_seen or ack.status != "applied":
        return
    if any(ack.observed.get(role, -1) < count for role, count in targets.items()):
        return
    if reached is not None and all(count <= reached.get(role, 0) for role, count in targets.items()):
        return
    _keep(state, _scale_up_time(state, ack.decision_id), ack.time)


def _scale_up_time(state, decision_id: int) -> float | None:
    return next((t for d, t in state.scale_up_times if d == decision_id), None)


def _keep(state, start: float | None, ready: float) -> None:
    if start is None or ready < start:
        return
    state.startup_samples.append(float(ready - start))
    del state.startup_samples[:-STARTUP_SAMPLES]


def measured_startup_seconds(state) -> float:
    """Median of the recent startups (the upper one of an even count), else the config's.

    Held to ``MAX_STARTUP_SECONDS``, the bound ``startup_seconds`` has: the
    horizon is that many windows of quantiles, and a ready event from a
    clock-skewed orchestrator (any time before 2100 passes the schema)
    measured years, whose horizon took seconds and memory at every tick.
    """
    samples = sorted(state.startup_samples)
    if not samples:
        return state.config.startup_seconds
    return min(samples[len(samples) // 2], MAX_STARTUP_SECONDS)


def startup_horizon_windows(state) -> int:
    """Throughput windows one decision's replicas must cover: ``ceil((startup + I) / I)``."""
    interval = state.config.throughput_adjustment_interval_seconds
    return max(1, math.ceil((measured_startup_seconds(state) + interval) / interval - 1e-9))
