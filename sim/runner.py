"""The closed loop: a workload replayed against a simulated fleet and a controller.

One run, on one virtual clock:

1. Requests arrive from the workload and flow through the fleet
   (:mod:`fleetplan.sim.fleet`).
2. Everything that happens becomes an event in the core's schemas
   (:mod:`fleetplan.sim.emitter`): a request record when a request ends,
   inventory events when a worker starts, becomes ready, drains or is gone,
   sampled FPMs, clock heartbeats every ``heartbeat_s`` and acks from the
   connector. Each is written to the run's log and handed to the controller
   in time order.
3. The controller decides. The planner controller feeds every event through
   the planning core (``Fleet.feed``) and applies the decisions its ticks
   return; a policy controller calls ``decide(view)`` on its own cadence.
4. The simulated connector applies targets (startup time, draining) and
   acks them, which flows back in as events.

**FPM sampling.** A real engine emits an FPM per iteration, tens per second;
the simulator emits one per engine every ``fpm_interval_s`` (default 1 s)
of virtual time, describing the iteration in flight at that instant and
stamped with that instant, plus one idle heartbeat (``wall_time = 0``) when
an engine goes idle and one when it becomes ready, so the planner's
coverage check sees every ready engine at once (Dynamo's FPM capture has
the same "sampled" mode). The load loop reads the latest FPM per engine
every 5 s and the regressions keep 64 samples, so a sample a second is
plenty, and it is what makes ≥ 1,000× real time possible (docs/simulate.md).

The log (inputs, decisions, acks) is what ``fleetplan plan`` reproduces:
it folds the same inputs in the same order through the same core.

**Live runs.** Given a :class:`~fleetplan.sim.realtime.LiveRun`, the loop
also publishes every event it emits (``simulate --publish``: FPMs and
request records to a bridge) and holds each step of the virtual clock to
the wall clock (``--realtime``). Neither changes what is simulated or
logged: a live run's log is the same as an offline run's.
"""

from __future__ import annotations

import math
import time as wallclock
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

from fleetplan.models.config import PlannerConfig, check_gpu_budget
from fleetplan.models.perf import EngineLimits, ProfileData
from fleetplan.models.predictor_swap import rebuild_forecaster, seed_control, seed_history
from fleetplan.schemas.events import Decision
from fleetplan.sim import emitter
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.connector import SimConnector
from fleetplan.sim.engines import Engine, SimRequest
from fleetplan.sim.fleet import FleetListener, KvTransfer, SimFleet
from fleetplan.sim.metrics import ReplicaTimeline, RequestLog, Summary, summarize
from fleetplan.sim.policy import PolicyContext, PolicyView, Traffic, check_targets, policy_interval
from fleetplan.sim.realtime import LiveRun
from fleetplan.sim.router import make_router
from fleetplan.sim.startup import StartupTime, parse_startup
from fleetplan.sim.timing import EngineTiming, engine_timing
from fleetplan.sim.workload import Workload

STALL_S = 3600.0
"""After the trace, a run whose requests in flight stop finishing for this long (virtual
seconds) is stalled: a policy left a role with no engine and nothing will serve them.
Startups take minutes and a drain less, so an hour without a finished request is no
slow fleet."""

KV_BYTES_PER_TOKEN = {
    # 2 (K and V) · layers · KV heads · head dim · 2 bytes (bf16 KV cache)
    "Llama-3.1-8B": 2 * 32 * 8 * 128 * 2,
    "Llama-3.3-70B": 2 * 80 * 8 * 128 * 2,
}


@dataclass(frozen=True)
class SimOptions:
    router: str = "least-loaded"
    startup: str = "120"
    fpm_interval_s: float = 1.0
    heartbeat_s: float = 1.0
    seed: int = 0
    timing: str = "interp"
    kv_bytes_per_token: int | None = None
    kv_bandwidth_gbs: float = 64.0
    prefix_block_tokens: int = 512
    deployment: str = "sim"
    window_s: float = 60.0
    agg_scheduler: str = "chunked"  # or "prefill-first" (vLLM before chunked prefill)
    # False: no inventory events, as in fleetplan's live stack, where nothing writes them; the
    # planner then knows its engines from their FPMs and times startups by the acks
    inventory: bool = True

    def __post_init__(self) -> None:
        # anything but "prefill-first" would silently run the chunked scheduler
        if self.agg_scheduler not in AGG_SCHEDULERS:
            raise ValueError(f"agg_scheduler: one of {', '.join(AGG_SCHEDULERS)}, got {self.agg_scheduler!r}")


AGG_SCHEDULERS = ("chunked", "prefill-first")


@dataclass
class FleetSetup:
    """Everything about the fleet that does not change between runs."""

    config: PlannerConfig
    profile: ProfileData
    options: SimOptions
    timing: EngineTiming
    limits: EngineLimits
    gpus: dict[str, int]
    roles: tuple[str, ...]
    transfer: KvTransfer

    def startup(self) -> StartupTime:
        return parse_startup(self.options.startup, seed=self.options.seed)


def make_setup(config: PlannerConfig, profile: ProfileData, options: SimOptions) -> FleetSetup:
    if config.mode not in ("disagg", "agg"):
        raise ValueError(f"mode: simulate runs disagg or agg fleets, got {config.mode!r}")
    max_kv = config.max_kv_tokens or profile.max_kv_tokens
    if max_kv is None:
        raise ValueError("max_kv_tokens: set it in the config (the profile has no decode KV size)")
    limits = EngineLimits(
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_kv_tokens=int(max_kv),
        max_context_length=config.context_length,
    )
    timing = engine_timing(profile, options.timing, limits)
    per_engine = profile.engine_gpus or profile.tp or 1
    roles = ("prefill", "decode") if config.mode == "disagg" else ("agg",)
    gpus = {r: config.gpus_per_engine(r) or per_engine for r in roles}
    check_gpu_budget(config, gpus)  # now that the profile says an engine's GPUs: else a role gets none, forever
    kv_bytes = options.kv_bytes_per_token
    if kv_bytes is None:
        kv_bytes = next(
            (v for k, v in KV_BYTES_PER_TOKEN.items() if profile.model and k in profile.model),
            KV_BYTES_PER_TOKEN["Llama-3.1-8B"],
        )
    transfer = KvTransfer(kv_bytes, options.kv_bandwidth_gbs * 1e9)
    parse_startup(options.startup)  # fail early on a bad spec
    return FleetSetup(config, profile, options, timing, limits, gpus, roles, transfer)


@dataclass
class RunResult:
    policy: str
    summary: Summary
    requests: RequestLog
    timeline: ReplicaTimeline
    end_s: float
    ticks: list[dict] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    events: int = 0   # events fed to the controller
    logged: int = 0   # lines written to the log (events and decisions)
    late_events: int = 0
    wall_s: float = 0.0
    iterations: int = 0
    fpms: int = 0
    retune: list[dict] | None = None  # the retune loop's decisions (sim/retune.py), when it ran
    stranded: int = 0  # requests a stalled run ended with, unserved: counted missed, never logged


# --- controllers ------------------------------------------------------------------


class PlannerController:
    """The planning core in the loop: every event through ``Fleet.feed``.

    ``retune`` (a :class:`fleetplan.sim.retune.Retuner`) sees every tick and
    finished request, and the config changes it decides are fed back as
    control events, so the run's log still folds to the same decisions.
    ``forecaster_state`` starts the deployment's forecaster from a saved
    state instead of empty (a retune candidate replay continues the run's
    forecaster from its window start). ``seed`` (``sim/warm.py``'s rows of
    the traffic before the run) goes to the log and the core as a
    ``seed_traffic`` control at the run's start, so the run is the one of a
    deployment that has been running and its log still folds to the same
    decisions.
    """

    needs_events = True

    def __init__(
        self, planner, retune=None, forecaster_state: dict | None = None, seed: list[list] | None = None,
    ) -> None:
        from fleetplan.models.fleet import Fleet, LateEvent

        self.core = Fleet(planner)
        self._late_type = LateEvent
        self.late = 0
        self.ticks: list[dict] = []
        self.decisions: list[Decision] = []
        self.name = "planner"
        self.retune = retune
        self._forecaster_state = forecaster_state
        self._seed = seed

    def initial(self) -> dict[str, int] | None:
        return None

    def start(self, loop: ClosedLoop) -> None:
        self.loop = loop
        if self._forecaster_state is not None:
            from fleetplan.models.quantiles import QuantileForecaster

            state = self.core.state(loop.deployment)
            state.forecaster = QuantileForecaster.from_state(self._forecaster_state)
        seed = None
        if self._seed:
            seed = seed_control(loop.deployment, loop.start_s, self._seed, issued_by="warm-up")
            loop.emit(seed)  # applied at the first tick; what it leaves is where the run starts
        if self.retune is not None:
            # the retune's first window starts where the run does: from what the seed will leave
            forecaster = (self.core.state(loop.deployment).forecaster if seed is None
                          else rebuild_forecaster(self.core.planner.config, seed_history(seed.body.windows)))
            self.retune.start(loop.initial, forecaster.to_state(), end_s=loop.workload.duration_s)

    def observe(self, event) -> None:
        self._handle(self.core.feed(event), apply=True)

    def request_done(self, req: SimRequest) -> None:
        if self.retune is not None:
            self.retune.request_done(req)

    def finish(self) -> None:
        self._handle(self.core.finish(), apply=False)
        if self.retune is not None:
            self.retune.finish()  # the ticks above apply nothing: a decision in flight never lands

    def _handle(self, outputs, apply: bool) -> None:
        changes = None
        for item in outputs:
            if isinstance(item, self._late_type):
                self.late += 1
                continue
            self.ticks.append(tick_row(item))
            if apply and self.retune is not None:
                state = self.core.states[item.deployment]
                changes = self.retune.tick(
                    item.time, item.ready, state.forecaster.to_state, lambda state=state: state.traffic_history,
                ) or changes
            decision = item.decision
            if decision is None:
                continue
            self.decisions.append(decision)
            self.loop.log.write(decision)
            if apply and not decision.advisory:
                self.loop.apply(decision.decision_id, decision.targets)
        if changes:
            # after the tick that landed the retune decision: in force from the next tick
            self.loop.emit(emitter.retune_event(self.loop.deployment, self.loop.clock.now, changes))


# A role's estimate fields and the tick row's column each lands in.
_ESTIMATE_COLUMNS = (
    ("ttft_ms", "est_ttft_ms"),
    ("itl_ms", "est_itl_ms"),
    ("engine_capacity_rps", "capacity_rps"),
    ("rate_replicas", "rate_replicas"),
    ("queueing_replicas", "queueing_replicas"),
    ("measured_floor", "measured_floor"),
    ("utilization", "utilization"),
)


def tick_row(report) -> dict:
    """A tick report as the run's report plots it (time in the run's seconds)."""
    row = {
        "t": report.time, "targets": dict(report.targets), "ready": dict(report.ready),
        "throughput_reason": report.throughput_reason, "load_reason": report.load_reason,
        "decision_id": None if report.decision is None else report.decision.decision_id,
    }
    if report.predicted is not None:
        row["predicted_rps"] = report.predicted.rps
        row["predicted_isl"] = report.predicted.isl
        row["predicted_osl"] = report.predicted.osl
        for name in ("sized_rps", "window_sized_rps", "horizon_windows", "quantile_calibrated", "quantile_exceeded"):
            if getattr(report.predicted, name) is not None:
                row[name] = getattr(report.predicted, name)
    if report.observed is not None:
        row["observed_rps"] = report.observed.num_req / report.observed.duration_s
    for role, est in report.estimates.items():
        for name, column in _ESTIMATE_COLUMNS:
            if getattr(est, name) is not None:
                row[f"{role}_{column}"] = getattr(est, name)
    return row


class PolicyController:
    """A policy (baseline or ``MODULE:CLASS``) on its own cadence."""

    def __init__(self, policy, name: str, roles: tuple[str, ...]) -> None:
        self.policy = policy
        self.name = name
        self.roles = roles
        self.interval_s = policy_interval(policy)
        self.needs_events = bool(getattr(policy, "needs_fpm", True))
        self.late = 0
        self.ticks: list[dict] = []
        self.decisions: list[Decision] = []
        self._latest: dict[str, object] = {}
        self._n = 0
        self._isl = 0
        self._osl = 0
        self._window_start = 0.0
        self._next_id = 0

    def initial(self) -> dict[str, int] | None:
        initial = getattr(self.policy, "initial", None)
        return initial() if callable(initial) else None

    def start(self, loop: ClosedLoop) -> None:
        self.loop = loop
        bind = getattr(self.policy, "bind", None)
        if callable(bind):
            setup = loop.setup
            bind(PolicyContext(
                roles=self.roles, config=setup.config, profile=setup.profile,
                startup_s=setup.startup().upper(), gpus_per_engine=dict(setup.gpus),
                deployment=loop.deployment,
            ))
        loop.clock.at(self.interval_s, self._tick)

    def observe(self, event) -> None:
        kind = event.type
        if kind == "fpm":
            self._latest[f"{event.worker_id}/{event.dp_rank}"] = event
        elif kind == "inventory" and event.state in ("draining", "gone"):
            self._latest.pop(f"{event.worker_id}/0", None)

    def request_done(self, req: SimRequest) -> None:
        self._n += 1
        self._isl += req.isl
        self._osl += req.osl

    def finish(self) -> None:
        pass

    def _tick(self) -> None:
        loop = self.loop
        now = loop.clock.now
        counts = loop.fleet.counts()
        n = self._n
        traffic = Traffic(now - self._window_start, n, self._isl / n if n else 0.0, self._osl / n if n else 0.0)
        self._n = self._isl = self._osl = 0
        self._window_start = now
        view = PolicyView(
            time=now, traffic=traffic, latest_fpm=dict(self._latest),
            ready={r: c["ready"] for r, c in counts.items()},
            expected={r: c["ready"] + c["starting"] for r, c in counts.items()},
        )
        targets = check_targets(self.policy, self.policy.decide(view), self.roles)
        if targets:
            full = {r: targets.get(r, view.expected[r]) for r in self.roles}
            if full != dict(view.expected):
                self._decide(now, full, dict(view.expected))
        if loop.active():
            loop.clock.at(now + self.interval_s, self._tick)

    def _decide(self, now: float, targets: dict[str, int], previous: dict[str, int]) -> None:
        loop = self.loop
        decision_id = self._next_id
        self._next_id += 1
        if loop.log.out is not None:
            decision = Decision.model_validate({
                "deployment": loop.deployment, "time": now, "decision_id": decision_id,
                "targets": targets, "previous": previous,
                "throughput_reason": "scale", "load_reason": "disabled",
            })
            self.decisions.append(decision)
            loop.log.write(decision)
        self.ticks.append({"t": now, "targets": dict(targets), "decision_id": decision_id})
        loop.apply(decision_id, targets)


# --- the loop ---------------------------------------------------------------------


class ClosedLoop(FleetListener):
    def __init__(
        self,
        workload: Workload,
        setup: FleetSetup,
        controller,
        initial: Mapping[str, int],
        log: IO[bytes] | None = None,
        progress: Callable[[float], None] | None = None,
        live: LiveRun | None = None,
        start_s: float = 0.0,
    ) -> None:
        self.workload = workload
        self.setup = setup
        self.controller = controller
        self.options = setup.options
        self.deployment = setup.options.deployment
        # a retune candidate replays one window of a run at that window's own time
        self.start_s = float(start_s)
        self.clock = VirtualClock(self.start_s)
        self.fleet = SimFleet(
            self.clock, setup.config.mode, setup.timing, setup.limits, setup.gpus,
            make_router(setup.options.router), setup.startup(), setup.transfer, self,
            setup.options.prefix_block_tokens, setup.options.agg_scheduler == "prefill-first",
        )
        self.connector = SimConnector(self.fleet, self._acked)
        self.log = emitter.EventLog(log)
        self.requests = RequestLog()
        self.timeline = ReplicaTimeline(self.fleet.roles)
        self.initial = dict(initial)
        self.progress = progress
        self.live = live
        self.emit_events = controller.needs_events or log is not None or live is not None
        self._arrivals = iter(workload.requests())
        self._arrivals_left = True
        self._index = 0
        self.fpms = 0
        self.fed = 0
        self._last_progress = 0.0
        self._finished_seen = 0
        self._finished_at = 0.0  # when a request last finished: a fleet that stops finishing is stalled
        self.stranded = 0

    # -- driving ------------------------------------------------------------------

    def run(self) -> RunResult:
        started = wallclock.perf_counter()
        live = self.live
        if live is not None:
            live.start()  # virtual time 0 is now: before the initial fleet emits anything
        self.controller.start(self)
        for role in self.fleet.roles:
            for _ in range(self.initial.get(role, 0)):
                self.fleet.add_ready(role)
        self._record_counts()
        self._next_arrival()
        self.clock.at(self.start_s + self.options.heartbeat_s, self._heartbeat)
        self.clock.at(self.start_s + self.options.fpm_interval_s, self._sample)
        clock = self.clock
        while True:
            if live is not None and (due := clock.peek()) is not None:
                live.pace(due)  # hold virtual time to the wall clock (--realtime)
            if not clock.step():
                break
            if not self.active() and not self._arrivals_left:
                break
        if live is not None:
            live.finish()
        self._strand()
        end = max(clock.now, self.workload.duration_s)
        self.controller.finish()
        if self.progress is not None:
            self.progress(end)
        peak = self.timeline.peak()
        mean = self.timeline.mean_ready(end)
        summary = summarize(
            self.controller.name, self.requests, self.setup.config.ttft_ms, self.setup.config.itl_ms,
            end, self.fleet.gpu_seconds(end), peak, mean, self.connector.applied,
        )
        return RunResult(
            policy=self.controller.name, summary=summary, requests=self.requests,
            timeline=self.timeline, end_s=end, ticks=self.controller.ticks,
            decisions=self.controller.decisions, events=self.fed, logged=self.log.count,
            late_events=self.controller.late, wall_s=wallclock.perf_counter() - started,
            iterations=sum(e.iterations for e in self.fleet.engines), fpms=self.fpms,
            stranded=self.stranded,
        )

    def active(self) -> bool:
        """Work is left: arrivals to come, requests in flight, or trace time to cover.

        Requests in flight that no engine will ever serve (a policy left a role
        with no engine after the trace ended) do not count once nothing has
        finished for ``STALL_S``: the run ends and counts them as missed.
        """
        if self._arrivals_left or self.clock.now < self.workload.duration_s:
            return True
        return self.fleet.in_flight > 0 and not self._stalled()

    def _stalled(self) -> bool:
        """Nothing finished for ``STALL_S`` and every request in flight waits at the frontend
        for a role with no engine starting.

        A request an engine holds will finish (an engine always progresses), however long
        its answer: a 900,000-token one decodes for over an hour, and taken for a stall the
        run stopped with it neither finished nor stranded, missing from the summary. One
        waiting for a role whose engine is starting goes out once it is ready, though a
        startup may take up to a day: the run stopped and counted it missed.
        """
        if len(self.requests) != self._finished_seen:
            self._finished_seen, self._finished_at = len(self.requests), self.clock.now
        if self.clock.now - max(self._finished_at, self.workload.duration_s) <= STALL_S:
            return False
        fleet = self.fleet
        if fleet.in_flight != sum(len(waiting) for waiting in fleet.frontend.values()):
            return False
        return not any(waiting and fleet.count(role, "starting") for role, waiting in fleet.frontend.items())

    def _strand(self) -> None:
        """Count the requests a stalled run left waiting as missed: TTFT (or ITL) up to the end.

        One that never had its first token has no ITL (NaN, as a one-token answer): recorded as
        0 ms, it counted as a measured ITL and pulled the run's ITL percentiles down.
        """
        now = self.clock.now
        for waiting in self.fleet.frontend.values():
            for req in waiting:
                started = req.first_token >= 0
                first = req.first_token if started else now
                itl = (now - first) / (req.osl - 1) if started and req.osl > 1 else math.nan
                self.requests.record(req.arrival, first - req.arrival, itl, req.isl, req.osl, req.cached, now)
                self.stranded += 1
                self.fleet.in_flight -= 1
            waiting.clear()

    def apply(self, decision_id: int, targets: Mapping[str, int]) -> None:
        self.connector.apply(decision_id, targets)

    # -- periodic events ------------------------------------------------------------

    def _next_arrival(self) -> None:
        nxt = next(self._arrivals, None)
        if nxt is None:
            self._arrivals_left = False
            return
        self.clock.at(nxt.arrival_s, self._arrive, nxt)

    def _arrive(self, trace_req) -> None:
        req = SimRequest(self._index, self.clock.now, trace_req.input_tokens, trace_req.output_tokens, trace_req.hash_ids)
        self._index += 1
        if self.emit_events:
            self._emit(emitter.arrival_event(self.deployment, req))
        self.fleet.submit(req)
        self._next_arrival()

    def _heartbeat(self) -> None:
        now = self.clock.now
        if self.emit_events:
            self._emit(emitter.clock_event(self.deployment, now))
        if self.progress is not None and now - self._last_progress >= 60.0:
            self._last_progress = now
            self.progress(now)
        if self.active():
            self.clock.at(now + self.options.heartbeat_s, self._heartbeat)

    def _sample(self) -> None:
        now = self.clock.now
        if self.emit_events:
            for engine in self.fleet.engines:
                if engine.state in ("ready", "draining"):
                    self._emit_fpm(engine, now)
        if self.active():
            self.clock.at(now + self.options.fpm_interval_s, self._sample)

    def _emit_fpm(self, engine: Engine, now: float) -> None:
        sample = engine.sample(now)
        if sample is None:
            return
        self.fpms += 1
        self._emit(emitter.fpm_event(self.deployment, now, engine.role, engine.worker_id, sample))

    def emit(self, event) -> None:
        """An event from outside the fleet (a retune's config change): logged and fed like the others."""
        self._emit(event)

    def _emit(self, event) -> None:
        self.fed += 1
        self.log.write(event)
        if self.live is not None:
            self.live.write(event)
        self.controller.observe(event)

    # -- fleet callbacks ------------------------------------------------------------

    def worker_changed(self, engine: Engine, state: str, decision_id: int | None) -> None:
        now = self.clock.now
        if self.emit_events:
            if self.setup.options.inventory:
                self._emit(emitter.inventory_event(
                    self.deployment, now, engine.worker_id, engine.role, state, engine.gpus, decision_id,
                ))
            if state == "ready":
                self._emit_fpm(engine, now)  # coverage: the planner sees it at once
        self._record_counts()
        if state == "ready":
            self.connector.worker_ready(engine)

    def request_finished(self, req: SimRequest) -> None:
        self.requests.add(req)
        self.controller.request_done(req)
        if self.emit_events:
            self._emit(emitter.request_event(self.deployment, req))

    def _acked(self, decision_id: int, status: str, observed: dict[str, int]) -> None:
        if self.emit_events:
            self._emit(emitter.ack_event(self.deployment, self.clock.now, decision_id, status, observed))

    def _record_counts(self) -> None:
        self.timeline.record(self.clock.now, self.fleet.counts(), self.fleet.gpus_in_use())
