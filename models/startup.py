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
worker, from the worker's own ``starting`` event to ``ready``. The median
of the last ``STARTUP_SAMPLES`` is used (one slow image pull should not
stretch every later horizon); ``startup_seconds`` from the config stands
in until the first sample.
"""

from __future__ import annotations

import math

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
        start = next((t for d, t in state.scale_up_times if d == ev.decision_id), None)
    if start is None and previous is not None:
        start = previous.since  # time of its 'starting' event
    if start is None or ev.time < start:
        return
    state.startup_samples.append(float(ev.time - start))
    del state.startup_samples[:-STARTUP_SAMPLES]


def measured_startup_seconds(state) -> float:
    """Median of the recent startups (the upper one of an even count), else the config's."""
    samples = sorted(state.startup_samples)
    if not samples:
        return state.config.startup_seconds
    return samples[len(samples) // 2]


def startup_horizon_windows(state) -> int:
    """Throughput windows one decision's replicas must cover: ``ceil((startup + I) / I)``."""
    interval = state.config.throughput_adjustment_interval_seconds
    return max(1, math.ceil((measured_startup_seconds(state) + interval) / interval - 1e-9))
