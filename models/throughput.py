"""The throughput loop: predicted demand over per-engine capacity.

Every ``throughput_adjustment_interval_seconds`` the planner forecasts the
next window's request count and mean ISL/OSL, asks the perf model how many
requests per second one engine serves within the SLA, and sizes each role
to ``ceil(demand / capacity)``, never below the role's minimum and moving at
most ``max_throughput_scaling_replicas`` per decision (Dynamo's ``core/throughput_scaling.py``).

fleetplan's sizing (the defaults; ``REFERENCE_SIZING`` restores Dynamo's,
docs/sizing.md) departs in five places here: ``sized_num_req`` replaces
the point forecast with an upper quantile over the startup horizon,
``mix_factor`` corrects each role's capacity for the window's ISL/OSL mix
(``fleetplan.models.mix``), ``target_utilization`` keeps headroom (less
once the sizing quantile is calibrated: ``rate_share``),
prefill gets a queueing floor (``fleetplan.models.queueing``) whose wait
budgets come from the same mix, one per length bucket, and decode, where
its rate is set by the batch limit rather than the ITL target, is sized
by the wait for a batch slot that the ITL target leaves room for
(``decode_sizing: queueing``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from fleetplan.models.config import PlannerConfig
from fleetplan.models.mix import LengthMix
from fleetplan.models.queueing import (
    MAX_ENGINES,
    Budgets,
    Dispersion,
    dispersion_points,
    queueing_replicas,
    slot_replicas,
)
from fleetplan.schemas.events import PredictedLoad, Role


@dataclass(frozen=True)
class ThroughputProposal:
    """What the throughput loop wants; ``targets`` is None when it holds."""

    reason: str
    targets: dict[Role, int] | None = None
    predicted: PredictedLoad | None = None
    capacity_rps: dict[Role, float] = field(default_factory=dict)
    # what set each count: engines by rate, and the queueing model's (None: none applied); prefill
    # takes the larger (a floor), decode the queueing count where there is one (it replaces the headroom)
    rate_replicas: dict[Role, int] = field(default_factory=dict)
    queueing_replicas: dict[Role, int | None] = field(default_factory=dict)
    # each role's count before the step cap: what the window needs
    needed: dict[Role, int] = field(default_factory=dict)
    # the share of each role's per-engine rate that its rate count sized for
    utilization: dict[Role, float] = field(default_factory=dict)


def concurrency_share(batch: int, q: float) -> float:
    """The largest share of a decode engine's batch at which its concurrent
    sequences stay within the batch in a q-share of moments.

    Sequences in flight on an engine are Poisson with mean ``m = share ·
    batch`` whatever their lengths (M/G/∞ occupancy), so their q-quantile is
    about ``m + z_q·√m``. Setting it to ``batch`` gives ``√m = (√(z² + 4·batch)
    − z) / 2``. A batch of a few sequences (a tight ITL target on a large
    model) needs a small share, a batch of hundreds nearly all of it.
    """
    if batch <= 0:
        return 1.0
    z = NormalDist().inv_cdf(q)
    root = (math.sqrt(z * z + 4.0 * batch) - z) / 2.0
    return min(1.0, root * root / batch)


def rate_share(config: PlannerConfig, role: Role, share: float, batch: int) -> float:
    """The share of ``role``'s per-engine rate to size for, given the loop's ``share``.

    Below ``target_utilization`` nothing changes. Above it (a calibrated
    quantile, which covers the forecast's error), prefill takes the share
    as it is, because its queueing floor models its waits; decode sized by
    rate runs at the batch its ITL target allows, so it takes no more than
    :func:`concurrency_share` of that batch leaves, and never less than
    ``target_utilization``.
    """
    if share <= config.target_utilization or role == "prefill":
        return share
    return max(config.target_utilization, min(share, concurrency_share(batch, config.sizing_quantile)))


def replicas_for(demand_rps: float, engine_rps: float, minimum: int) -> int:
    """Engines needed to serve ``demand_rps``, at least ``minimum``."""
    if demand_rps <= 0:
        return minimum
    if engine_rps <= 0:
        raise ValueError("engine capacity must be positive")
    # A tiny epsilon keeps exact multiples (10.0 / 5.0) from rounding up on float noise.
    needed = demand_rps / engine_rps - 1e-9
    return max(MAX_ENGINES if needed >= MAX_ENGINES else math.ceil(needed), minimum)


def engine_capacity(
    model, config: PlannerConfig, isl: float, osl: float, kv_hit_rate: float | None = None,
    accept_length: float | None = None,
):
    """One engine's SLA-bound operating point at whole-token ``isl``/``osl`` (None if unknown).

    With ``prefill_capacity: backlog_all`` a prefill engine's rate is at
    most what it sustains with a queue (:func:`backlog_capped`) wherever
    it is read, the queueing floor and the mix's buckets too; its batch
    and TTFT stay the best batch's.
    """
    cap = model.capacity_rps(
        isl=max(round(isl), 1), osl=max(round(osl), 1), ttft_ms=config.ttft_ms,
        itl_ms=config.itl_ms, kv_hit_rate=kv_hit_rate, accept_length=accept_length,
    )
    if cap is None or config.prefill_capacity != "backlog_all" or model.role != "prefill":
        return cap
    return replace(cap, rps=backlog_capped(model, cap.rps, isl, kv_hit_rate))


def backlog_capped(model, rps: float, isl: float, kv_hit_rate: float | None) -> float:
    """``rps``, or the rate a prefill engine with a queue sustains at whole-token ``isl`` if lower."""
    backlog = model.backlog_rps(max(round(isl), 1), kv_hit_rate)
    return rps if backlog is None or backlog >= rps else backlog


def rate_count_capacity(config: PlannerConfig, role: Role, model, rps: float, mix_factor: float,
                        isl: float, kv_hit_rate: float | None) -> float:
    """The per-engine rate a role's rate count divides by: ``rps`` (the capacity search's) times the mix's factor.

    With ``prefill_capacity: backlog`` prefill's rate count alone takes
    what an engine with a queue sustains, if lower: it sizes for a window's
    work, which a loaded engine serves in full passes. The queueing floor
    keeps the best batch's rate, whose exponential service times already
    overstate a pass's spread.
    """
    if role == "prefill" and config.prefill_capacity == "backlog":
        rps = backlog_capped(model, rps, isl, kv_hit_rate)
    return rps * mix_factor


def bucket_budgets(config: PlannerConfig, mix: LengthMix, capacity_of) -> list[tuple[float, float]]:
    """The wait each length bucket's prompts can afford before the TTFT: ``(share, seconds)``.

    ``capacity_of(isl, osl)`` is the prefill engine's operating point at a
    bucket's mean lengths; its budget is the TTFT left after that pass.
    Per bucket matters where the mean prompt cannot meet the TTFT on its
    own (long-document traffic at a tight target): the short prompts
    still can, if they do not queue.
    """
    budgets = []
    for share, isl, osl in mix.groups():
        cap = capacity_of(isl, osl)
        if cap is not None and cap.ttft_ms is not None:
            budgets.append((share, (config.ttft_ms - cap.ttft_ms) / 1000.0))
    return budgets


def slot_budgets(config: PlannerConfig, cap, osl_classes) -> list[tuple[float, float]]:
    """The wait for a decode slot each OSL class can afford: ``(share, seconds)``; [] if the ITL binds.

    A request's ITL is its decode time over ``osl - 1`` tokens, so a wait
    before its first decode step costs ``wait / (osl - 1)`` of ITL: the
    target leaves ``(itl - itl at the operating point) · (osl - 1)``. Only
    where the operating point is the engine's batch limit (``at_limit``);
    where the ITL target sets it, a request over the batch does not wait,
    it joins and slows every stream, and the headroom stays.
    """
    if cap.itl_ms is None or not cap.at_limit or not cap.meets_sla:
        return []
    spare_s = (config.itl_ms - cap.itl_ms) / 1000.0
    return [(share, spare_s * (osl - 1.0)) for share, osl in osl_classes]


def burst_rest(config: PlannerConfig, burst_rps: float, window_num_req: float) -> tuple[float, float] | None:
    """``decode_demand: weighted``: the share of the window's requests outside its busiest burst, and their rate.

    The window holds ``window_num_req`` requests (its quantile), the burst
    ``burst_rps`` for ``burst_seconds`` of them; the rest arrive evenly over
    the window's other seconds. None where the burst holds the whole window
    (a spike, or no burst sub-window): then it is sized for alone.
    """
    interval, burst_s = config.throughput_adjustment_interval_seconds, config.burst_seconds
    in_burst = burst_rps * burst_s
    if not 0 < burst_s < interval or in_burst >= window_num_req:
        return None
    return 1.0 - in_burst / window_num_req, (window_num_req - in_burst) / (interval - burst_s)


def cap_change(desired: int, current: int, max_step: int, minimum: int) -> int:
    """Move at most ``max_step`` from ``current``; recovering the floor may exceed it."""
    capped = min(max(desired, current - max_step), current + max_step)
    return max(capped, minimum) if desired >= minimum else capped


def floor_margin(cfg: PlannerConfig, utilization: float | None) -> float:
    """The multiple of the sized burst prefill's queueing floor sizes for (``floor_headroom``).

    ``target_utilization`` is headroom for two things, the queue an engine
    builds near its rate and the forecast's error; ``calibrated_utilization``
    for the queue alone, once the quantile's misses are held at 1 - q
    (``_sizing_utilization`` in models/planner.py). So ``calibrated / utilization`` is the share
    of the rate count's headroom that is for the forecast's error. The
    queueing floor models the queue and had none of it: a new deployment's
    first tick sized it for the largest burst seen, which covers half the
    windows, and on Azure code it released two of the warm fleet's 13
    engines a minute before a busier one (docs/sizing.md). 1 once the
    quantile is conformal, without ``calibrated_utilization``, or with
    ``floor_headroom: none``.
    """
    if cfg.floor_headroom == "none" or utilization is None or cfg.calibrated_utilization is None:
        return 1.0
    return max(1.0, cfg.calibrated_utilization / utilization)


def propose_throughput(
    config: PlannerConfig,
    current: Mapping[Role, int],
    minimums: Mapping[Role, int],
    forecast: tuple[float, float, float],
    kv_hit_rate: float,
    accept_length: float,
    perf: Mapping[Role, object],
    *,
    sized_num_req: float | Mapping[Role, float] | None = None,
    horizon_windows: int | None = None,
    quantile_calibrated: bool | None = None,
    quantile_exceeded: tuple[int, int] | None = None,
    mix_factor: Mapping[Role, float] | None = None,
    arrival_dispersion: Dispersion = 1.0,
    queue_budgets: Budgets | None = None,
    osl_classes: list[tuple[float, float]] | None = None,
    utilization: float | None = None,
    window_num_req: float | None = None,
    decode_num_req: float | None = None,
) -> ThroughputProposal:
    """Size every role for the forecast window.

    ``sized_num_req`` (the upper quantile over ``horizon_windows`` windows)
    is the count the fleet is sized for when given, one for every role or
    one per role (``quantile_basis: tokens``: each role's tokens in requests
    of the forecast lengths; ``sized_rps`` reports the largest); the point forecast
    is still reported, and ``quantile_calibrated`` (whether that quantile
    was conformal) and ``quantile_exceeded`` (how its recent ones fared) with it. ``mix_factor`` scales each role's capacity.
    ``arrival_dispersion`` (1 for Poisson) stretches the queueing floor's waits.
    ``queue_budgets`` (``bucket_budgets`` of the last window's mix) replaces
    the queueing floor's one budget, the mean prompt's. ``osl_classes``
    (``(share, mean OSL)`` per bucket of the mix; the forecast's mean OSL
    without one) gives decode's slot-wait budgets. ``utilization`` is the
    share of each engine's rate sized for (``config.target_utilization``
    when not given). ``window_num_req`` (the window count's quantile, where
    ``sized_num_req`` is the busiest burst's) is what prefill's rate count
    sizes for when its queueing floor applies: the floor, which models
    waiting, sizes for the burst, and the rate count for the window's work.
    ``decode_num_req`` (the window's quantile of decode's work, with
    ``decode_demand`` other than ``burst``) is, with ``window``, what decode's
    counts size for in place of its ``sized_num_req``; with ``weighted``, what
    the slot-wait count takes the rest of the window's requests from
    (``burst_rest``), the rate count keeping the burst. ``sized_rps`` reports
    the burst's quantile either way, as the forecast check and
    ``quantile_exceeded`` score it. Prefill's queueing floor sizes for that
    rate times ``floor_margin(config, utilization)``: the headroom for the
    forecast's error while its quantile is not conformal (``floor_headroom``).
    """
    num_req, isl, osl = forecast
    interval = config.throughput_adjustment_interval_seconds
    if sized_num_req is None or isinstance(sized_num_req, Mapping):
        sized_of = dict(sized_num_req or {})
    else:
        sized_of = dict.fromkeys(config.roles, sized_num_req)
    sized = max(sized_of.values(), default=num_req)
    share = config.target_utilization if utilization is None else utilization
    floored = config.prefill_sizing == "queueing" and "prefill" in config.roles
    margin = floor_margin(config, utilization)
    predicted = PredictedLoad(
        num_req=num_req, isl=isl, osl=osl, rps=num_req / interval,
        kv_hit_rate=kv_hit_rate, accept_length=accept_length,
        sized_rps=None if sized_num_req is None else sized / interval,  # the most any role sized for
        window_sized_rps=None if window_num_req is None or not floored else window_num_req / interval,
        horizon_windows=horizon_windows, quantile_calibrated=quantile_calibrated,
        quantile_exceeded=quantile_exceeded,
        arrival_dispersion=dispersion_points(arrival_dispersion) if floored else None,
        floor_margin=margin if floored else None,
    )
    factors = mix_factor or {}
    capacity: dict[Role, float] = {}
    targets: dict[Role, int] = {}
    by_rate: dict[Role, int] = {}
    by_queueing: dict[Role, int | None] = {}
    needed: dict[Role, int] = {}
    shares: dict[Role, float] = {}
    window_rate = False  # whether prefill's rate count sized for the window's count
    for role in config.roles:
        model = perf[role]
        window_demand = role == "decode" and decode_num_req is not None
        demand_rps = (decode_num_req if window_demand and config.decode_demand == "window"
                      else sized_of.get(role, num_req)) / interval
        if demand_rps > 0:
            if not model.ready:
                return ThroughputProposal("model_not_ready", None, predicted, capacity)
            cap = engine_capacity(model, config, isl, osl, kv_hit_rate, accept_length)
            if cap is None or cap.rps <= 0:
                return ThroughputProposal("model_not_ready", None, predicted, capacity)
            capacity[role] = cap.rps * factors.get(role, 1.0)
            # Sizing at 100% of the SLA-bound rate leaves no room for bursts
            # within the window; target_utilization < 1 keeps headroom.
            shares[role] = rate_share(config, role, share, cap.batch)
            queue_floor = role == "prefill" and floored and cap.ttft_ms is not None
            waiting = None
            if queue_floor:
                # a floor: where one prompt's pass is a large part of the TTFT,
                # random arrivals need more engines than any fixed utilisation gives
                budgets = queue_budgets if queue_budgets else (config.ttft_ms - cap.ttft_ms) / 1000.0
                waiting = by_queueing[role] = queueing_replicas(
                    demand_rps * margin, capacity[role], budgets, config.queueing_sla_share, minimums[role],
                    arrival_dispersion=arrival_dispersion,
                )
            # the floor sizes for the burst, the rate count for the window's work; a floor with no
            # answer (no prompt can meet the TTFT by waiting less) leaves the burst to the rate count
            by_window = waiting is not None and window_num_req is not None
            window_rate = window_rate or by_window
            rate_rps = window_num_req / interval if by_window else demand_rps
            rate_cap = rate_count_capacity(config, role, model, cap.rps, factors.get(role, 1.0), isl, kv_hit_rate)
            desired = by_rate[role] = replicas_for(rate_rps, rate_cap * shares[role], minimums[role])
            if waiting is not None:
                desired = max(desired, waiting)
            elif role == "decode" and config.decode_sizing == "queueing":
                budgets = slot_budgets(config, cap, osl_classes or [(1.0, osl)])
                rest = (burst_rest(config, demand_rps, decode_num_req)
                        if window_demand and config.decode_demand == "weighted" else None)
                slots = slot_replicas(  # None without a budget: the ITL sets the batch
                    demand_rps, capacity[role], cap.batch, budgets, config.queueing_sla_share,
                    minimums[role], arrival_dispersion=arrival_dispersion, rest=rest,
                )
                by_queueing[role] = slots
                desired = desired if slots is None else slots
        else:
            desired = minimums[role]
        needed[role] = desired
        targets[role] = cap_change(
            desired, current[role], config.max_throughput_scaling_replicas, minimums[role]
        )
    if predicted.window_sized_rps is not None and not window_rate:
        predicted = predicted.model_copy(update={"window_sized_rps": None})  # the rate count took the burst
    return ThroughputProposal("scale", targets, predicted, capacity, by_rate, by_queueing, needed, shares)
