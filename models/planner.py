"""The planning core: ``apply(state, event)`` and ``tick(state, t)``.

Pure Python, no I/O, no clock: the live Kafka worker, the simulator and the
audit all call exactly these two functions, so the same events give the
same decisions everywhere (design principle 1).

``apply`` folds one input event into a deployment's state. ``tick`` runs the
loops that are due at event time ``t`` — the throughput loop every
``throughput_adjustment_interval_seconds``, the load loop every
``load_adjustment_interval_seconds`` — reconciles their proposals (the
throughput result is a floor the load loop scales above), passes the result
through replica bounds and the GPU budget, and emits a decision when the
targets change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fleetplan.models.apply import apply_event, engines_beyond_decided, forget_silent_engines
from fleetplan.models.config import PlannerConfig
from fleetplan.models.constraints import clamp_to_bounds, engine_gpus, fit_gpu_budget
from fleetplan.models.forecast import TrafficObservation
from fleetplan.models.load import (
    EngineLoads,
    LoadSignal,
    agg_signal,
    decode_signal,
    prefill_signal,
    threshold_signal,
)
from fleetplan.models.measured_floor import (
    engines_measured,
    hold_measured_floor,
    measured_floor,
    measures_floor,
    window_began,
)
from fleetplan.models.perf_models import make_perf_models
from fleetplan.models.predictor_swap import build_forecaster, remember_window
from fleetplan.models.quantiles import role_work
from fleetplan.models.startup import (
    measured_startup_seconds,
    record_scale_up,
    startup_horizon_windows,
)
from fleetplan.models.state import DeploymentState, PendingDecision, TrafficWindow
from fleetplan.models.throughput import ThroughputProposal, propose_throughput
from fleetplan.models.window_sizing import queueing_dispersion, size_mix
from fleetplan.schemas.events import (
    Decision,
    ForwardPassMetrics,
    PredictedLoad,
    Role,
    RoleEstimate,
)

PARTIAL_WINDOW_SHARE = 0.1
"""A first throughput window whose traffic began later than this share of it is partial."""
POINT_COVERAGE = 0.5
"""The share of windows a point forecast covers (a median at best): what ``target_utilization``'s headroom is for."""


@dataclass(frozen=True)
class TickReport:
    """Diagnostics of one tick, emitted whether or not a decision was made."""

    deployment: str
    time: float
    throughput_reason: str
    load_reason: str
    load_reasons: dict[Role, str]
    ready: dict[Role, int]
    baseline: dict[Role, int]
    targets: dict[Role, int]
    lower_bound: dict[Role, int]
    estimates: dict[Role, RoleEstimate]
    predicted: PredictedLoad | None
    observed: TrafficObservation | None
    decision: Decision | None
    advisory: bool
    pending_decision_id: int | None
    late_events: int
    rejected_controls: int = 0

    def to_dict(self) -> dict:
        return {
            "deployment": self.deployment, "time": self.time,
            "throughput_reason": self.throughput_reason, "load_reason": self.load_reason,
            "load_reasons": dict(self.load_reasons), "ready": dict(self.ready),
            "baseline": dict(self.baseline), "targets": dict(self.targets),
            "lower_bound": dict(self.lower_bound),
            "estimates": {r: e.model_dump(mode="json") for r, e in self.estimates.items()},
            "predicted": None if self.predicted is None else self.predicted.model_dump(mode="json"),
            "observed": None if self.observed is None else self.observed.__dict__.copy(),
            "decision_id": None if self.decision is None else self.decision.decision_id,
            "advisory": self.advisory, "pending_decision_id": self.pending_decision_id,
            "late_events": self.late_events, "rejected_controls": self.rejected_controls,
        }


@dataclass
class _Scratch:
    """Per-tick intermediate results, gathered into the report at the end."""

    throughput_reason: str = "not_due"
    load_reason: str = "not_due"
    load_reasons: dict[Role, str] = field(default_factory=dict)
    throughput_targets: dict[Role, int] | None = None
    load_targets: dict[Role, int] | None = None
    predicted: PredictedLoad | None = None
    observed: TrafficObservation | None = None
    proposal: ThroughputProposal | None = None  # the throughput loop's sizing, for the estimates
    signals: dict[Role, LoadSignal] = field(default_factory=dict)
    measured_floor: dict[Role, int] | None = None  # load-only: the measured traffic's, once a tick


class Planner:
    """The pure planning core for deployments that share one base config.

    ``profile`` (a :class:`fleetplan.models.perf.ProfileData`) seeds the perf
    models of every new deployment; ``warmup`` (traffic observations bucketed
    at the throughput interval) warms every new deployment's forecaster, with
    ``warmup_peaks`` (their busiest bursts, ``bucket_peaks``) where known.
    """

    def __init__(
        self, config: PlannerConfig, profile=None,
        warmup: list[TrafficObservation] | None = None,
        warmup_peaks: list[float | None] | None = None,
    ) -> None:
        self.config = config
        self.profile = profile
        self.warmup = list(warmup or [])
        self.warmup_peaks = [None] * len(self.warmup) if warmup_peaks is None else list(warmup_peaks)
        if len(self.warmup_peaks) != len(self.warmup):
            raise ValueError(f"{len(self.warmup_peaks)} warm-up peaks for {len(self.warmup)} windows")

    # --- state -------------------------------------------------------------

    def new_state(self, deployment: str) -> DeploymentState:
        cfg = self.config
        forecaster = build_forecaster(cfg)
        history: list[list] = []
        if self.warmup:
            forecaster.warm(self.warmup, self.warmup_peaks)
            for obs, peak in zip(self.warmup, self.warmup_peaks, strict=True):  # and a predictor swapped in later
                remember_window(history, obs, peak, cfg.predictor_history_windows)
        return DeploymentState(
            deployment=deployment, config=cfg,
            perf=make_perf_models(cfg, self.profile), forecaster=forecaster, traffic_history=history,
        )

    # --- apply -------------------------------------------------------------

    def apply(self, state: DeploymentState, event) -> DeploymentState:
        """Fold one input event into the state (in place; returns it): models/apply.py."""
        apply_event(state, event, profile=self.profile)
        if state.last_input is None or event.time > state.last_input:
            state.last_input = event.time
        return state

    def skip_silence(self, state: DeploymentState, through: float) -> None:
        """Ticks up to ``through`` were skipped, the deployment silent (models/sequencer.py).

        The traffic window starts again on the last throughput tick skipped, so the first
        window after the silence is an interval long, as after any tick: started where the
        last fired tick left it, it was the whole silence, and its rate a day's average.
        """
        interval = state.config.throughput_adjustment_interval_seconds
        _start_window(state, float(math.floor(through / interval) * interval))

    # --- tick --------------------------------------------------------------

    def tick(self, state: DeploymentState, now: float) -> TickReport:
        """Run the loops due at event time ``now`` and decide."""
        cfg = state.config
        roles = cfg.roles
        scratch = _Scratch()
        if state.pending is not None and now - state.pending.time >= cfg.ack_timeout_seconds:
            # the connector never answered: proceed (Dynamo: 1800 s), but remember the decision, so
            # that an ack of it arriving later still moves the baseline to where the fleet went
            state.timed_out, state.pending = state.pending, None
        forget_silent_engines(state, now)

        ready = _count_workers(state, roles, "ready")
        starting = _count_workers(state, roles, "starting")
        actual = {r: ready[r] + starting[r] for r in roles}
        baseline = dict(state.desired) if state.desired is not None else actual
        minimums = {r: state.min_overrides.get(r, cfg.min_endpoints(r)) for r in roles}
        maximums = {r: cfg.max_endpoints(r) for r in roles}
        in_progress = state.pending is not None or _starting_within(state, now, cfg.ack_timeout_seconds)
        kv_hit = state.last_kv_hit_rate or 0.0
        accept = state.last_accept_length or 1.0

        interval_t = cfg.throughput_adjustment_interval_seconds
        interval_l = cfg.load_adjustment_interval_seconds
        if not cfg.throughput_enabled:
            scratch.throughput_reason = "disabled"
            if _due(now, interval_t):
                began = window_began(state)
                # a first window cut short by the tick is not a rate (traffic that began
                # 50 ms before it: 10 requests read as 200 a second), as in the throughput loop
                if measures_floor(cfg) and began is not None and now - began >= PARTIAL_WINDOW_SHARE * interval_t:
                    closed = engines_measured(state, now - began, baseline, minimums, kv_hit, accept)
                    state.measured_floors = [*state.measured_floors, closed][-cfg.floor_memory_windows:]
                # the load loop's estimates read them too: without this the loop alone kept
                # accept 1 and no cache hits for good (a 7-ms ITL at accept 3 read as 22 ms)
                kv_hit, accept = _remember_cache_and_speculation(
                    state, state.window.observation(interval_t), kv_hit, accept)
                # a new window each interval keeps a load-only deployment's state bounded
                # (the window counts every second)
                _start_window(state, now)
        elif _due(now, interval_t):
            self._throughput_loop(state, now, baseline, minimums, kv_hit, accept, scratch)
        if not cfg.load_enabled:
            scratch.load_reason = "disabled"
        elif _due(now, interval_l):
            self._load_loop(state, now, baseline, minimums, in_progress, kv_hit, accept, scratch)

        reconciled, reason_t, reason_l = self._reconcile(state, baseline, scratch)
        proposed, bound_reason = clamp_to_bounds(reconciled, minimums, maximums)
        if bound_reason and scratch.load_targets is not None:
            # also where the clamp undid the whole move: a release held at the floor is no scale_down
            reason_l = bound_reason
            for role in roles:
                if proposed[role] != reconciled[role] and role in scratch.load_reasons:
                    scratch.load_reasons[role] = (
                        "reconcile_clamped_to_floor" if proposed[role] > reconciled[role]
                        else "reconcile_clamped_to_ceiling")
        gpus = engine_gpus(cfg, state.workers, None if self.profile is None else self.profile.engine_gpus)
        bounded = proposed
        proposed, budget_reason = fit_gpu_budget(
            baseline, proposed, gpus, cfg.max_gpu_budget, cfg.min_gpu_budget, minimums, maximums
        )
        if budget_reason:
            if scratch.load_targets is not None:
                reason_l = budget_reason
                # a role the budget moved says so, as one the bounds moved does (a scale-up
                # the budget held kept saying scale_up)
                for role in roles:
                    if proposed[role] != bounded[role] and role in scratch.load_reasons:
                        scratch.load_reasons[role] = budget_reason
            if scratch.throughput_targets is not None:
                reason_t = budget_reason
        for role in roles:
            if proposed[role] < baseline[role]:
                # the next release needs a run of its own; one the floors or the budget undid
                # did not happen, and its run goes on (restarted, it held the release a whole
                # wait more once the floor came down, though the verdicts never broke)
                state.down_since.pop(role, None)

        decision = None
        if proposed != baseline:
            if state.pending is not None:
                if scratch.throughput_targets is not None and not cfg.load_enabled:
                    reason_t = "scaling_in_progress"
            else:
                decision = self._decide(state, now, baseline, proposed, reason_t, reason_l, scratch)
        elif scratch.throughput_targets is not None and reason_t == "scale":
            # the counts asked for a change the hold kept (the proposal's targets are before it)
            reason_t = "held_until_scored" if scratch.throughput_targets != scratch.proposal.targets else "no_change"

        estimates = self._estimates(state, scratch)
        return TickReport(
            deployment=state.deployment, time=now,
            throughput_reason=reason_t, load_reason=reason_l,
            load_reasons=dict(scratch.load_reasons), ready=ready, baseline=baseline,
            targets=proposed, lower_bound=dict(state.lower_bound), estimates=estimates,
            predicted=scratch.predicted, observed=scratch.observed, decision=decision,
            advisory=state.advisory,
            pending_decision_id=None if state.pending is None else state.pending.decision_id,
            late_events=state.late_events, rejected_controls=state.rejected_controls,
        )

    # --- the two loops -------------------------------------------------------

    def _throughput_loop(self, state, now, baseline, minimums, kv_hit, accept, scratch) -> None:
        cfg = state.config
        interval = cfg.throughput_adjustment_interval_seconds
        start = state.window_start
        if start is None:
            start = now - interval
        first = state.first_traffic
        if first is not None and first - start > PARTIAL_WINDOW_SHARE * interval:
            # traffic that began well into its first window (a deployment started between
            # ticks, or launched on a fleet that ticked idle before it) makes it partial, and it
            # is not sized: what finished in it are the short answers (30 s of the compose demo
            # read a mean OSL 5 % short, decode's capacity as many high, and its slot count cut
            # 3 engines to 2), and one request a millisecond before the tick would read as 1,000
            # a second. It is carried into the next window, which then runs from the first
            # request: the first window sized holds an interval of traffic at least, as Dynamo's
            # first adjustment, one interval after the planner starts. Only that window can
            # begin before the first request; after idle ticks it was read as a whole interval
            # (60 s of 10 rps as 3.3 rps)
            state.window_start = first
            scratch.throughput_reason = "no_traffic_data"
            return
        # the window's own length: after a set_config shortened the interval, the window
        # began on the old grid and is longer than the new interval (capping it there read
        # 180 s of requests as 20 s of them, a 9x rate)
        duration = max(now - start, 1e-9)
        obs = state.window.observation(
            duration, by_arrival=state.seen_arrivals, last_osl=state.forecaster.forecaster.last_osl,
        )
        peak = state.window.peak_count(interval, cfg.burst_seconds, by_arrival=state.seen_arrivals)
        mix = state.window.length_mix
        dispersion = state.window.arrival_dispersion(start, duration)
        if dispersion is not None:
            state.arrival_dispersion = dispersion
            if cfg.queueing_arrivals == "timescales":
                state.dispersion_curve = state.window.dispersion_curve(start, duration) or []
        _start_window(state, now)
        if not state.seen_traffic:
            scratch.throughput_reason = "no_traffic_data"
            return
        # A window of another length than the interval (the first, carried from the tick before
        # it, or one a set_config resized) is scaled to a full one so the count is a rate. One
        # shorter is dated as the whole window ending now that it stands for: dated from its
        # first request, it ran past the next window's start (a seed of the kept windows left
        # it out) and could take the next window's place in the daily cycle
        full = TrafficObservation(
            duration_s=interval, num_req=obs.num_req * interval / duration, isl=obs.isl,
            osl=obs.osl, kv_hit_rate=obs.kv_hit_rate, accept_length=obs.accept_length,
            start_s=min(start, now - interval),
        )
        scratch.observed = full
        kv_hit, accept = _remember_cache_and_speculation(state, obs, kv_hit, accept)
        budgets, osl_classes = size_mix(state, mix, kv_hit, accept)
        # a partial first window has partial sub-windows too: its peak is not a peak
        peak = peak if duration >= interval else None
        state.forecaster.observe(full, peak=peak)
        remember_window(state.traffic_history, full, peak, cfg.predictor_history_windows,
                        asked=state.forecaster.last_asked)
        forecast = state.forecaster.forecast()
        if forecast[0] > 0 and state.forecaster.forecaster.last_osl is None:
            # requests arrived and none has finished yet (answers longer than the window, at a
            # cold start): no OSL is known, and sized at 0 (one token) a warm fleet's decode went
            # to its minimum under 1,790 decoding requests. The windows are fed (their counts
            # are measured); the sizing holds, as before traffic, until a request finishes
            scratch.throughput_reason = "no_traffic_data"
            return
        sized = horizon = utilization = calibrated = window = exceeded = decode = coverage = None
        if cfg.throughput_sizing == "startup_quantile":
            horizon = startup_horizon_windows(state)
            # never below the point forecast (an uncalibrated quantile is the point)
            work, window_work = work_series(cfg), window_series(cfg)
            of = {w: state.forecaster.quantile(cfg.sizing_quantile, horizon, of=f"peak{w}")
                  for w in dict.fromkeys(w for role in cfg.roles for w in work[role])}
            sized = {role: max(forecast[0], *(of[w] for w in work[role])) for role in cfg.roles}
            coverage = state.forecaster.coverage(cfg.sizing_quantile, horizon)
            calibrated = coverage >= cfg.sizing_quantile  # conformal: it covers q by construction
            # how the last ones fared, of the series sized_rps reports: the largest (the first if even)
            exceeded = state.forecaster.exceedances(cfg.sizing_quantile, horizon, of=f"peak{max(of, key=of.get)}")
            utilization = _sizing_utilization(cfg, coverage)

            def window_of(role: str) -> float:
                # each series has its own adaptive level: the window's is held under its burst's
                series = window_work[role]
                return min(max(forecast[0], *(of[w] for w in series)), max(forecast[0], *(
                    state.forecaster.quantile(cfg.sizing_quantile, horizon, of=f"window{w}") for w in series)))

            if _bursts_to_queueing(cfg):
                window = window_of("prefill")  # only prefill's rate count takes it (propose_throughput)
            if cfg.decode_demand != "burst" and "decode" in sized:
                # decode's counts only: sized_rps reports the burst, which the forecast check
                # and quantile_exceeded score (with quantile_basis: tokens it may be decode's)
                decode = window_of("decode")
        factors = state.mix_factor if cfg.capacity_mix == "buckets" else None
        proposal = propose_throughput(
            cfg, baseline, minimums, forecast, kv_hit, accept, state.perf,
            sized_num_req=sized, horizon_windows=horizon, quantile_calibrated=calibrated,
            quantile_exceeded=exceeded, mix_factor=factors,
            arrival_dispersion=queueing_dispersion(cfg, state.arrival_dispersion, state.dispersion_curve),
            queue_budgets=budgets, osl_classes=osl_classes, utilization=utilization, window_num_req=window,
            decode_num_req=decode,
        )
        scratch.predicted = proposal.predicted
        scratch.proposal = proposal
        if proposal.targets is None:
            scratch.throughput_reason = proposal.reason
            return
        targets = _hold_until_scored(cfg, proposal.targets, baseline, coverage)
        if cfg.load_enabled:
            state.lower_bound = targets
            scratch.throughput_reason = "set_lower_bound"
        else:
            scratch.throughput_targets = targets
            scratch.throughput_reason = "scale"

    def _load_loop(self, state, now, baseline, minimums, in_progress, kv_hit, accept, scratch) -> None:
        cfg = state.config
        if in_progress:
            # the fleet is changing: a scale-down run needs verdicts on a settled fleet
            state.down_since.clear()
            scratch.load_reason = "scaling_in_progress"
            return
        targets: dict[Role, int] = {}
        # engines beyond a role's decided count (without inventory: a release's, draining or
        # silent until taken for gone) make the snapshots another fleet's than the one decided;
        # counted, two engines that could not consolidate looked like three that could
        over = {state.workers[worker].role for _, worker in engines_beyond_decided(state)}
        for role in cfg.roles:
            engines, coverage = _engines_of(state, role)
            if not engines:
                scratch.load_reasons[role] = "no_fpm_data"
                if measures_floor(cfg):
                    # no engine to take a snapshot of, but the traffic still needs some: a role
                    # at 0 engines would otherwise never come back
                    held = hold_measured_floor(cfg, LoadSignal(0, "no_fpm_data"), role, baseline,
                                                self._measured_floor(state, now, baseline, minimums, kv_hit, accept, scratch))
                    if held.step > 0:
                        scratch.signals[role] = held
                        scratch.load_reasons[role] = held.reason
                        targets[role] = baseline[role] + held.step
                continue
            if not coverage or role in over:
                scratch.load_reasons[role] = "worker_count_mismatch"
                continue
            signal = self._signal(state, role, engines, kv_hit, accept)
            scratch.signals[role] = signal
            scratch.load_reasons[role] = signal.reason
            if measures_floor(cfg):
                signal = hold_measured_floor(
                    cfg, signal, role, baseline, self._measured_floor(state, now, baseline, minimums, kv_hit, accept, scratch),
                )
                scratch.signals[role] = signal
                scratch.load_reasons[role] = signal.reason
            if signal.step >= 0:
                state.down_since.pop(role, None)
            elif now - state.down_since.setdefault(role, now) < _stabilization_seconds(state):
                scratch.load_reasons[role] = "scale_down_stabilizing"
                continue
            if signal.step < 0 and cfg.hold_scale_down_until_floor and cfg.throughput_enabled \
                    and role not in state.lower_bound:
                # Before the first throughput floor, an idle start would shed
                # capacity the predicted load is about to need.
                scratch.load_reasons[role] = "scale_down_capped_by_throughput"
                continue
            if signal.step:
                targets[role] = max(baseline[role] + signal.step, 0)
        reasons = list(scratch.load_reasons.values())
        for code in ("scale_up", "scale_up_to_measured_rate", "scale_down"):
            if code in reasons:
                scratch.load_reason = code
                break
        else:
            scratch.load_reason = reasons[0] if reasons else "no_fpm_data"
        scratch.load_targets = {r: targets.get(r, baseline[r]) for r in cfg.roles}

    def _measured_floor(self, state, now, baseline, minimums, kv_hit, accept, scratch) -> dict[Role, int]:
        """The measured traffic's floor (models/measured_floor.py), sized once a tick."""
        if scratch.measured_floor is None:
            scratch.measured_floor = measured_floor(state, now, baseline, minimums, kv_hit, accept)
        return scratch.measured_floor

    def _signal(self, state, role, engines, kv_hit, accept) -> LoadSignal:
        cfg = state.config
        model = state.perf[role]
        if not cfg.sla_mode:
            limits = model.limits
            return threshold_signal(
                cfg, role, engines, cfg.context_length or limits.max_context_length,
                cfg.max_kv_tokens or limits.max_kv_tokens,
            )
        if not model.ready:
            return LoadSignal(0, "insufficient_data")
        loads = EngineLoads.of(engines)
        if role == "prefill":
            return prefill_signal(cfg, model, loads, kv_hit)
        if role == "decode":
            return decode_signal(cfg, model, loads, accept)
        return agg_signal(cfg, model, loads, kv_hit, accept)

    def _reconcile(self, state, baseline, scratch) -> tuple[dict[Role, int], str, str]:
        """Combine the loops: the throughput result is a floor under the load loop."""
        cfg = state.config
        reason_t, reason_l = scratch.throughput_reason, scratch.load_reason
        if not cfg.load_enabled:
            return dict(scratch.throughput_targets or baseline), reason_t, reason_l
        proposed = dict(scratch.load_targets or baseline)
        capped = raised = False
        for role, floor in state.lower_bound.items():
            if role in proposed and proposed[role] < floor:
                if scratch.load_reasons.get(role) == "scale_down":
                    scratch.load_reasons[role] = "scale_down_capped_by_throughput"
                    capped = True
                elif floor > baseline[role] and (role in scratch.load_reasons or state.pending is None):
                    # the floor grows the role past the loop's verdict (a floor set while a
                    # decision was in flight, applied at a later tick whose throughput loop is
                    # not due): Dynamo's scale_up; the decision said no_change / not_due. Also
                    # where the loop held for engines still starting: the floor goes through
                    # the hold, and its decision said scaling_in_progress (a pending decision
                    # makes none, and the tick keeps saying why)
                    scratch.load_reasons[role] = "scale_up"
                    raised = True
                proposed[role] = floor
        # a role still scaling up names the decision (Dynamo's priority: scale_up over capped)
        if raised:
            reason_l = "scale_up"
        elif capped and reason_l not in ("scale_up", "scale_up_to_measured_rate"):
            reason_l = "scale_down_capped_by_throughput"
        return proposed, reason_t, reason_l

    def _decide(self, state, now, baseline, targets, reason_t, reason_l, scratch) -> Decision | None:
        advisory = state.advisory
        if advisory and state.advised == targets:
            return None
        decision = Decision(
            deployment=state.deployment, time=now, decision_id=state.next_decision_id,
            targets=targets, previous=baseline, throughput_reason=reason_t,
            load_reason=reason_l, predicted=scratch.predicted,
            estimates=self._estimates(state, scratch), config_version=state.config_version,
            advisory=advisory,
        )
        state.next_decision_id += 1
        if any(targets[r] > baseline[r] for r in targets):
            record_scale_up(state, decision.decision_id, now)
        if advisory:
            # Advisory decisions are recorded, not executed: the fleet keeps its
            # counts, so only a change of advice is worth a new decision.
            state.advised = dict(targets)
        else:
            state.pending = PendingDecision(decision.decision_id, now, dict(targets))
        return decision

    def _estimates(self, state, scratch) -> dict[Role, RoleEstimate]:
        out: dict[Role, RoleEstimate] = {}
        sizing = scratch.proposal or ThroughputProposal("not_due")
        for role in state.config.roles:
            sig = scratch.signals.get(role)
            out[role] = RoleEstimate(
                ttft_ms=None if sig is None else sig.ttft_ms,
                itl_ms=None if sig is None else sig.itl_ms,
                engine_capacity_rps=sizing.capacity_rps.get(role),
                throughput_lower_bound=state.lower_bound.get(role),
                rate_replicas=sizing.rate_replicas.get(role),
                queueing_replicas=sizing.queueing_replicas.get(role),
                measured_floor=(scratch.measured_floor or {}).get(role),
                utilization=sizing.utilization.get(role),
            )
        return out


# --- helpers ----------------------------------------------------------------


def _start_window(state: DeploymentState, now: float) -> None:
    """A fresh traffic window from ``now`` on."""
    state.window = TrafficWindow()
    state.window_start = now


def _remember_cache_and_speculation(
    state: DeploymentState, obs: TrafficObservation, kv_hit: float, accept: float,
) -> tuple[float, float]:
    """Keep a closed window's KV hit rate and accept length, and return the ones in force.

    Last-value semantics, as Dynamo's: a window that measured neither keeps the
    last that did. Both loops read them (the throughput loop's capacity, the
    load loop's TTFT and ITL), so they are kept whichever loop closes the window.
    """
    if obs.kv_hit_rate is not None:
        state.last_kv_hit_rate = kv_hit = obs.kv_hit_rate
    if obs.accept_length is not None:
        state.last_accept_length = accept = obs.accept_length
    return kv_hit, accept


def _stabilization_seconds(state: DeploymentState) -> float:
    """How long a role's engines must look spare, tick after tick, before one is released.

    A released engine takes a startup to get back, so with ``null`` the loop
    waits one startup (measured, else configured): a lull shorter than that
    keeps its engines. Kubernetes' HPA holds scale-downs for the same reason
    (its scale-down stabilization window, 300 s by default); Dynamo releases
    on the first verdict (``load_scale_down_stabilization_seconds: 0``).
    """
    configured = state.config.load_scale_down_stabilization_seconds
    return measured_startup_seconds(state) if configured is None else configured


def _bursts_to_queueing(cfg: PlannerConfig) -> bool:
    """Whether prefill's rate count sizes for the window's count, its queueing floor for the burst.

    The busiest ``burst_window_seconds`` sub-window is a burst, and how long
    prompts wait in one is what the queueing floor models (with the
    arrivals' measured dispersion). The rate count is the engines the
    window's work needs at ``utilization``, whose headroom is already there
    for rate swings within the window; sizing it for the burst too counts
    that swing twice, which on smooth traffic buys an engine nothing needs.
    Needs the floor and a burst window shorter than the throughput window
    (one as long is the window itself); decode has no such split (its slot
    model takes the burst).
    """
    return (cfg.burst_sizing == "queueing"
            and 0 < cfg.burst_seconds < cfg.throughput_adjustment_interval_seconds
            and cfg.prefill_sizing == "queueing" and "prefill" in cfg.roles)


def work_series(cfg: PlannerConfig) -> dict[str, tuple[str, ...]]:
    """Per role, the suffixes of the burst quantile series its count is sized on (the larger wins).

    ``quantile_basis: requests``: the request count for every role.
    ``tokens``: prefill's prompt tokens, decode's answer tokens, and both for
    an aggregated engine, which does both kinds of work.
    ``floor_tokens``: the request count, and for prefill, where its queueing
    floor takes the burst and its rate count the window
    (``_bursts_to_queueing``), its prompt tokens too: the floor has no
    headroom of its own to carry prompts longer than forecast, while the
    rate count's ``utilization`` already carries a few percent of them.
    """
    if cfg.quantile_basis == "tokens":
        return {role: tuple(f":{w}" for w in role_work(role)) for role in cfg.roles}
    work = {role: ("",) for role in cfg.roles}
    if cfg.quantile_basis == "floor_tokens" and _bursts_to_queueing(cfg):
        work["prefill"] = ("", ":prompt")
    return work


def window_series(cfg: PlannerConfig) -> dict[str, tuple[str, ...]]:
    """Per role, the suffixes of the window quantile series its rate count (decode's counts, with
    ``decode_demand`` other than ``burst``) is sized on: the tokens' with ``quantile_basis: tokens``,
    the request count's otherwise (with ``floor_tokens`` the prompt tokens are the floor's alone)."""
    if cfg.quantile_basis == "tokens":
        return work_series(cfg)
    return {role: ("",) for role in cfg.roles}


def _hold_until_scored(
    cfg: PlannerConfig, targets: dict[Role, int], baseline: dict[Role, int], coverage: float | None,
) -> dict[Role, int]:
    """``targets`` with the scale-downs of the roles ``hold_until_scored`` names kept at ``baseline``
    while the sizing quantile has scored no forecast error (``coverage`` 0; None: no quantile).

    Until the windows of its first forecast (the startup horizon, 2 ticks
    at the defaults) have closed, the quantile is the last window's raw count
    and nothing says how far off the forecast runs. Prefill's rate count
    still has ``target_utilization``'s headroom under its floor; decode's
    slot count, which replaces that headroom, has none, so a first tick that
    releases a decode engine bets the ITL on a forecast with no track
    record: on Azure conv with its shape kept the next window's longer
    prompts cut each decode engine's rate by a tenth and minutes 4-7 met
    58-98 % (docs/sizing.md). The hold costs the engines that were spare
    for those ticks; it never adds one.
    """
    if cfg.hold_until_scored == "none" or coverage is None or coverage > 0:
        return dict(targets)
    held = cfg.roles if cfg.hold_until_scored == "all" else ("decode",)
    return {role: max(n, baseline[role]) if role in held else n for role, n in targets.items()}


def _sizing_utilization(cfg: PlannerConfig, coverage: float) -> float:
    """The share of each engine's rate the throughput loop sizes for.

    ``target_utilization`` is headroom for everything the sized load does
    not cover: the engine's queueing near its peak rate, and the forecast's
    own error. It is the headroom of a point forecast, which covers about
    half the windows (``POINT_COVERAGE``). Once the sizing quantile is
    conformal (``coverage`` reaches ``sizing_quantile``), its misses are held
    at 1 - q, so only the queueing share is left and
    ``calibrated_utilization`` applies. Before that the quantile is the
    largest of the m errors seen, which covers a new window with probability
    m / (m + 1): with ``uncalibrated_headroom: coverage`` the share moves
    from ``target_utilization`` toward ``calibrated_utilization`` as that
    coverage goes from a point forecast's to q (2 errors seen: a third of the
    way for the P90; 8: 97 %), where ``calibrated_utilization`` is the
    larger; with ``full``, or a ``calibrated_utilization`` no larger, it
    stays at ``target_utilization`` until the quantile is conformal.
    """
    if cfg.calibrated_utilization is None:
        return cfg.target_utilization
    q = cfg.sizing_quantile
    if coverage >= q:
        return cfg.calibrated_utilization
    if cfg.uncalibrated_headroom == "full" or coverage <= POINT_COVERAGE:
        return cfg.target_utilization
    if cfg.calibrated_utilization <= cfg.target_utilization:
        return cfg.target_utilization  # a quantile that covers more never asks for more headroom
    share = (coverage - POINT_COVERAGE) / (q - POINT_COVERAGE)
    return cfg.target_utilization + (cfg.calibrated_utilization - cfg.target_utilization) * share


def _due(now: float, interval: int) -> bool:
    return now % interval == 0


def _count_workers(state: DeploymentState, roles, which: str) -> dict[Role, int]:
    counts = {r: 0 for r in roles}
    for w in state.workers.values():
        if w.state == which and w.role in counts:
            counts[w.role] += 1
    return counts


def _starting_within(state: DeploymentState, now: float, timeout: float) -> bool:
    """Whether a worker has been starting for less than ``timeout``: a scaling operation in flight.

    One starting for longer is stuck (a pod Pending with no GPU: Dynamo issue
    #14251) and stops holding the load loop, as an unacknowledged decision
    stops blocking after the same ``ack_timeout_seconds``; before 2026-12-05 it
    held the loop for good. Dynamo 1.6.1 (#14671) instead lets a decision cut
    pending replicas at once; a startup that is only slow keeps holding here.
    """
    return any(w.state == "starting" and now - w.since < timeout for w in state.workers.values())


def _engines_of(state: DeploymentState, role: Role) -> tuple[list[ForwardPassMetrics], bool]:
    """The latest FPM of each ready engine of ``role``, and whether all are covered."""
    ready = sorted(w for w, v in state.workers.items() if v.role == role and v.state == "ready")
    engines: list[ForwardPassMetrics] = []
    covered = True
    by_worker: dict[str, list[str]] = {}
    for key in state.latest_fpm:
        by_worker.setdefault(key.rsplit("/", 1)[0], []).append(key)
    for worker in ready:
        keys = by_worker.get(worker)
        if not keys:
            covered = False
            continue
        engines.extend(state.latest_fpm[k] for k in sorted(keys))
    return engines, covered


