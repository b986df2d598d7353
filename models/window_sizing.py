"""What the throughput sizing takes from a window's traffic besides its count.

Two things: the length mix (a per-role correction of the capacity at the
mean lengths, the prefill queue's budget per length bucket, decode's slot
classes) and the arrivals' burstiness (the dispersion the queueing floor
takes). The throughput loop sizes the forecast with them and the load-only
measured floor sizes the window it has measured, so both read them here.
"""

from __future__ import annotations

from fleetplan.models.config import PlannerConfig
from fleetplan.models.mix import LengthMix, mix_factor
from fleetplan.models.queueing import Dispersion
from fleetplan.models.state import DeploymentState
from fleetplan.models.throughput import bucket_budgets, engine_capacity
from fleetplan.schemas.events import Role


def queueing_dispersion(cfg: PlannerConfig, dispersion: float, curve: list[list[float]]) -> Dispersion:
    """What the queueing floor takes as the arrivals' burstiness (``queueing_arrivals``).

    ``poisson``: 1; ``measured``: the index of dispersion at 1 s;
    ``timescales``: the dispersion curve from 1 s to 16 s (1 s alone until a
    window has measured it), so bursts that last seconds count.
    """
    if cfg.queueing_arrivals == "poisson":
        return 1.0
    if cfg.queueing_arrivals == "timescales" and curve:
        return curve
    return dispersion


def size_mix(state: DeploymentState, mix: LengthMix, kv_hit: float, accept: float):
    """Set the window's per-role mix correction; return what the queueing models take from the mix.

    The prefill queue's budgets per length bucket and decode's ``(share,
    mean OSL)`` per bucket (its slot budgets); each ``None`` (the mean
    request's) with ``capacity_mix: mean`` or an empty window, and the
    budgets also while the prefill model is not ready.
    """
    cfg = state.config
    if cfg.capacity_mix != "buckets" or not mix.count:
        return None, None
    capacities = {role: _capacity_memo(state, role, kv_hit, accept) for role in cfg.roles if state.perf[role].ready}
    state.mix_factor = _mix_factors(state, mix, capacities)
    osl_classes = [(share, osl) for share, _, osl in mix.groups()]
    if "prefill" in capacities:
        return bucket_budgets(cfg, mix, capacities["prefill"]), osl_classes
    return None, osl_classes


def _capacity_memo(state: DeploymentState, role: Role, kv_hit: float, accept: float):
    """``(isl, osl) -> Capacity | None`` of one role for this tick, each length computed once.

    The request-mix factor and the queueing floor's budgets ask for the same
    buckets; a wide mix has a few dozen, and each is a capacity search.
    """
    model, cfg = state.perf[role], state.config
    seen: dict[tuple[float, float], object] = {}

    def capacity_of(isl: float, osl: float):
        key = (isl, osl)
        if key not in seen:
            seen[key] = engine_capacity(model, cfg, isl, osl, kv_hit, accept)
        return seen[key]

    return capacity_of


def _mix_factors(state: DeploymentState, mix: LengthMix, capacities: dict) -> dict:
    """Per role, the window's capacity on its mix over its capacity at the mean lengths."""
    factors: dict[Role, float] = {}
    for role, capacity_of in capacities.items():

        def capacity_at(isl: float, osl: float, capacity_of=capacity_of) -> float | None:
            cap = capacity_of(isl, osl)
            return None if cap is None else cap.rps

        factor = mix_factor(mix, capacity_at)
        if factor is not None:
            factors[role] = factor
    return factors
