"""The load-only loop's floor: the engines the measured traffic needs.

Without the throughput loop, the load loop sees only snapshots of each
engine's queue; this module sizes the traffic the deployment has actually
received (the current window and the closed ones it remembers) the way the
throughput loop sizes a forecast, and holds the load loop's verdict at or
above it (``load_floor: measured``, docs/planner.md).
"""

from __future__ import annotations

from fleetplan.models.config import PlannerConfig
from fleetplan.models.load import LoadSignal
from fleetplan.models.state import DeploymentState
from fleetplan.models.throughput import propose_throughput
from fleetplan.models.window_sizing import queueing_dispersion, size_mix
from fleetplan.schemas.events import Role

MEASURED_RATE_MIN_SECONDS = 60.0
"""Without the throughput loop, the load loop's floor measures the current window once it is this long."""


def measures_floor(cfg: PlannerConfig) -> bool:
    """Whether the load loop keeps the fleet at what the measured traffic needs.

    With the throughput loop on, its floor already holds what the forecast
    needs. Without it, the loop's only view is a snapshot of each engine's
    queue, which is near empty on a fleet at 80 % utilisation whose prompts
    take tens of milliseconds: it would release an engine the traffic
    needs, and add one only once every queue had overflowed, a startup
    too late (docs/planner.md).
    """
    return cfg.load_floor == "measured" and not cfg.throughput_enabled and cfg.sla_mode


def hold_measured_floor(
    cfg: PlannerConfig, signal: LoadSignal, role: Role, baseline, floor: dict[Role, int],
) -> LoadSignal:
    """The verdict, moved so the role ends at or above the engines the measured traffic needs.

    A raise moves at most ``max_throughput_scaling_replicas`` at once, as
    the throughput loop does, so one odd window cannot multiply the fleet.
    """
    need = floor.get(role)
    if need is None or baseline[role] + signal.step >= need:
        return signal
    if need > baseline[role]:
        step = max(signal.step, min(need - baseline[role], cfg.max_throughput_scaling_replicas))
        return LoadSignal(step, "scale_up_to_measured_rate", signal.ttft_ms, signal.itl_ms)
    return LoadSignal(0, "scale_down_capped_by_measured_rate", signal.ttft_ms, signal.itl_ms)


def measured_floor(state, now, baseline, minimums, kv_hit, accept) -> dict[Role, int]:
    """Per role, the engines the measured traffic needs (the planner asks once a tick).

    That is the most any remembered window needed: the current one (once it
    holds a minute) and the closed ones within ``load_floor_memory_seconds``,
    so a burst keeps its engines for a while after it passes, as Kubernetes'
    HPA holds scale-downs for 300 s. In the deployment's first minute of
    traffic, the fleet as it is: the first seconds' finished requests are
    the short ones, and a deployment that starts on a warm fleet must not
    shed it on idle-looking snapshots. Before any traffic, nothing: the
    snapshots tell the truth.
    """
    start = window_began(state)
    floors = list(state.measured_floors)
    if state.first_traffic is None:
        floors = []
    elif now - start >= MEASURED_RATE_MIN_SECONDS:
        floors.append(engines_measured(state, now - start, baseline, minimums, kv_hit, accept))
    elif now - state.first_traffic < MEASURED_RATE_MIN_SECONDS:
        # the first minute of traffic, also when a window closed inside it
        floors.append(dict(baseline))
    return {
        role: max(f[role] for f in floors if role in f)
        for role in state.config.roles if any(role in f for f in floors)
    }


def window_began(state: DeploymentState) -> float | None:
    """When the traffic window began: at its tick, or at the first request when that came later.

    Before the first interval's tick, and in the window the traffic began in after idle
    ticks (a fleet provisioned ahead of its launch): dated from the tick before, 20 s of
    traffic were read over 140 s, a floor of 2 prefill engines where the first minute of
    traffic keeps the fleet as it is, and the raise at 40 s asked for 4 where 5 were needed.
    """
    first, start = state.first_traffic, state.window_start
    if start is None or (first is not None and first > start):
        return first
    return start


def engines_measured(state, duration, baseline, minimums, kv_hit, accept) -> dict[Role, int]:
    """Per role, the engines the window's traffic needs, sized as the throughput loop sizes a forecast.

    The rate and the queueing floor both count, with the window's own mix
    and burstiness; nothing (``{}``) when the window is empty or the perf
    model cannot size it yet.
    """
    cfg = state.config
    obs = state.window.observation(
        duration, by_arrival=state.seen_arrivals, last_osl=state.forecaster.forecaster.last_osl,
    )
    if duration <= 0 or not obs.num_req:
        return {}
    if obs.kv_hit_rate is not None:
        kv_hit = obs.kv_hit_rate
    if obs.accept_length is not None:
        accept = obs.accept_length
    budgets, osl_classes = size_mix(state, state.window.length_mix, kv_hit, accept)
    began = window_began(state) or 0.0
    measured = state.window.arrival_dispersion(began, duration)
    if measured is None:
        dispersion = queueing_dispersion(cfg, state.arrival_dispersion, state.dispersion_curve)
    else:
        curve = []
        if cfg.queueing_arrivals == "timescales":  # the only mode that reads it; it rebins the window
            curve = state.window.dispersion_curve(began, duration) or []
        dispersion = queueing_dispersion(cfg, measured, curve)
    interval = cfg.throughput_adjustment_interval_seconds
    count = obs.num_req * interval / duration
    if duration >= cfg.burst_seconds:
        # the busiest sub-window, as the throughput loop sizes: bursty traffic needs its peaks
        peak = state.window.peak_count(interval, cfg.burst_seconds, by_arrival=state.seen_arrivals)
        count = max(count, peak or 0.0)
    proposal = propose_throughput(
        cfg, baseline, minimums, (count, obs.isl, obs.osl), kv_hit, accept, state.perf,
        mix_factor=state.mix_factor if cfg.capacity_mix == "buckets" else None,
        arrival_dispersion=dispersion, queue_budgets=budgets, osl_classes=osl_classes,
    )
    if proposal.targets is None:
        return {}
    return dict(proposal.needed)
