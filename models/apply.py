"""How each input event changes a deployment's state: ``Planner.apply``'s handlers.

One handler per event type, each folding its event into the state in
place and nothing else: no tick runs here, no decision is made, so the
fold of a topic can run ahead of the ticks (models/fold_ahead.py) and
the state after a sequence of events depends on that sequence alone.
Events the core reads but does not fold (ticks, its own decisions, dead
letters) map to ``None``.
"""

from __future__ import annotations

from fleetplan.models.config import (
    ConfigError,
    check_gpu_budget,
    check_kv_capacity,
    check_profile_budget,
)
from fleetplan.models.constraints import engine_gpus
from fleetplan.models.measured_floor import measures_floor
from fleetplan.models.mix import LengthMix
from fleetplan.models.perf import FpmColumns
from fleetplan.models.perf_models import make_perf_models
from fleetplan.models.predictor_swap import (
    keep_last,
    predictor_changed,
    rebuild_forecaster,
    seed_history,
    seed_problem,
    window_of,
)
from fleetplan.models.predictors import PredictorUnavailable
from fleetplan.models.startup import ack_startup_sample, startup_sample
from fleetplan.models.state import (
    DeploymentState,
    Worker,
    add_finished_sums,
    count_subwindow,
)
from fleetplan.schemas.events import (
    Ack,
    ClockEvent,
    ControlEvent,
    DeadLetter,
    Decision,
    ForwardPassMetrics,
    FpmBatch,
    InventoryEvent,
    RequestArrival,
    RequestRecord,
    ResetPerf,
    Role,
    SeedTraffic,
    SetAdvisory,
    SetConfig,
    SetMinEndpoints,
)
from fleetplan.schemas.fpm_wire import WireFpmBatch


def apply_event(state: DeploymentState, event, *, profile=None) -> None:
    """Fold one input event into ``state`` (in place); an unknown type changes nothing.

    ``profile`` is the engine profile the planner seeds perf models from,
    which a ``reset_perf`` control seeds them from again, and whose KV cache
    a change of config is checked against (``check_kv_capacity``).
    """
    if isinstance(event, ControlEvent):
        _apply_control(state, event, profile)
        return
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event)


def _admit_fpm(state: DeploymentState, fpm) -> bool:
    """Whether the perf model of the FPM's role takes it; discovers its engine."""
    role = fpm.role
    if state.perf.get(role) is None:
        return False  # a role this mode does not plan (e.g. prefill FPMs in agg mode)
    worker = state.workers.get(fpm.worker_id)
    gone_at = state.gone_workers.get(fpm.worker_id)
    if worker is None and gone_at is not None and fpm.time >= gone_at:
        return False  # a gone engine's last passes: not a discovery (see GONE_MEMORY_SECONDS)
    if worker is None:
        # Discovery: an engine that reports metrics exists, even before inventory says so.
        gpus = state.config.gpus_per_engine(role) or 1
        state.workers[fpm.worker_id] = Worker(role, "ready", gpus, fpm.time, discovered=True)
    return True


GONE_AFTER_SILENCE_SECONDS = 30.0
"""Silence after which an engine beyond its role's decided count is taken for gone."""

GONE_MEMORY_SECONDS = 600.0
"""How long an engine inventory said is gone stays gone to its own FPMs.

An inventory ``gone`` forgets the engine, and an FPM it sent at or after
that time (its last passes, the FPM topic behind the inventory's) found no
worker and discovered it again: a ready engine known only from its FPMs,
counted in the role's ready engines and the load loop's N, for
``discovered_engine_ttl_seconds`` (a day), since with inventory written
nothing prunes such engines. Its FPMs dated at or after the ``gone`` are
refused for this long after it; an inventory ``starting`` or ``ready`` of
the same id (a restart) ends it at once.
"""


def forget_silent_engines(state: DeploymentState, now: float) -> None:
    """Drop the engines known only from their FPMs that have left the fleet.

    Without inventory events (the bridge relays none) nothing says an engine
    left, so one that was scaled away stayed counted as ready, with its last
    FPM, for good: a fleet that replaces its engines grew the deployment's
    stored state without bound, and the load loop averaged the last FPMs of
    engines long gone. Two rules, judged in event time at the tick:

    - any such engine silent for ``discovered_engine_ttl_seconds`` (0:
      never) is dropped. An engine that is only idle sends one idle
      heartbeat and then nothing (Dynamo's convention), so the default is a
      day; it is found again by its next FPM;
    - where a role has more such engines than the last applied decision
      asked for, the excess that is silent longest, and silent for
      ``GONE_AFTER_SILENCE_SECONDS`` at least, is dropped: a scale-down's
      engines stop their FPMs, a serving engine sends one each forward pass.
      One idle but alive may go instead, and is found again by its next FPM,
      when a gone one is the silent longest. A decision still pending counts
      where it asks for more: a scale-up's engines serve one by one before
      its ack, and are no scale-down's leftovers. Not where inventory is
      written: its ``gone`` events say who left.
    """
    for worker_id, gone_at in list(state.gone_workers.items()):
        if now - gone_at > GONE_MEMORY_SECONDS:
            del state.gone_workers[worker_id]
    last = _last_heard(state)
    ttl = state.config.discovered_engine_ttl_seconds
    if ttl > 0:
        for worker_id, worker in list(state.workers.items()):
            if worker.discovered and now - last.get(worker_id, worker.since) > ttl:
                _forget(state, worker_id)
    for seen, worker_id in engines_beyond_decided(state, last):
        if now - seen >= GONE_AFTER_SILENCE_SECONDS:
            _forget(state, worker_id)


def engines_beyond_decided(state: DeploymentState, last: dict[str, float] | None = None) -> list[tuple[float, str]]:
    """``(last heard, worker)`` of the engines known only from their FPMs that each role
    has beyond its decided count, silent longest first; none where inventory is written
    or nothing was decided yet.

    These are, as a rule, a scale-down's engines, draining or gone:
    :func:`forget_silent_engines` drops them once silent for
    ``GONE_AFTER_SILENCE_SECONDS``, and until then the load loop holds
    (``worker_count_mismatch``), as Dynamo's does while the engines that report
    FPMs are not the deployment's count. ``last``: each worker's latest FPM
    time, when the caller has it (:func:`_last_heard`).
    """
    if state.inventory_seen or state.desired is None:
        return []
    if last is None:
        last = _last_heard(state)
    asked = dict(state.desired)
    if state.pending is not None:
        for role, count in state.pending.targets.items():
            asked[role] = max(count, asked.get(role, 0))
    beyond: list[tuple[float, str]] = []
    for role, count in asked.items():
        silent = sorted((last.get(w, v.since), w) for w, v in state.workers.items()
                        if v.role == role and v.discovered and v.state == "ready")
        beyond.extend(silent[:max(0, len(silent) - count)])
    return beyond


def _last_heard(state: DeploymentState) -> dict[str, float]:
    """Each worker's latest FPM time, over its attention-DP ranks."""
    last: dict[str, float] = {}
    for key, fpm in state.latest_fpm.items():
        worker = key.rsplit("/", 1)[0]
        last[worker] = max(fpm.time, last.get(worker, fpm.time))
    return last


def _forget(state: DeploymentState, worker_id: str) -> None:
    state.workers.pop(worker_id, None)
    prefix = f"{worker_id}/"
    for key in [k for k in state.latest_fpm if k.startswith(prefix)]:
        del state.latest_fpm[key]


def _apply_fpm(state: DeploymentState, fpm: ForwardPassMetrics) -> None:
    if _admit_fpm(state, fpm):
        state.latest_fpm[f"{fpm.worker_id}/{fpm.dp_rank}"] = fpm
        state.perf[fpm.role].observe(fpm)


def _apply_fpm_batch(state: DeploymentState, batch: FpmBatch | WireFpmBatch) -> None:
    """The hot path: one vectorised regression update per role for the whole batch.

    Equivalent to applying the FPMs one by one in batch order (the perf
    model's batched observe keeps the same state as observing each; whether
    an FPM is admitted does not depend on the FPMs before it in the batch,
    as discovery adds ready engines, never gone ones). An engine's latest FPM
    is stored once, the last of the batch, so a :class:`WireFpmBatch` (the
    worker's fast decode) becomes pydantic models only for the FPMs kept.
    """
    by_role: dict[Role, list] = {}
    latest: dict[tuple[str, int], object] = {}
    for fpm in batch.fpms:
        if _admit_fpm(state, fpm):
            latest[fpm.worker_id, fpm.dp_rank] = fpm
            by_role.setdefault(fpm.role, []).append(fpm)
    kept = state.latest_fpm  # new engines in order of first appearance, as one by one
    for (worker_id, rank), fpm in latest.items():
        kept[f"{worker_id}/{rank}"] = fpm if isinstance(fpm, ForwardPassMetrics) else fpm.to_model()
    for role, fpms in by_role.items():
        state.perf[role].observe_batch(FpmColumns.from_fpms(fpms))


def _note_traffic(state: DeploymentState, arrival_s: float) -> None:
    """The deployment has traffic; the first request's arrival dates its first window.

    The earliest arrival, not the first folded: finished requests fold in the order they
    end, and a short request that ended first dated the traffic after a long one that had
    arrived before it (a seed ending between the two was taken as the deployment's past).
    """
    if state.first_traffic is None or arrival_s < state.first_traffic:
        state.first_traffic = arrival_s
    state.seen_traffic = True


def _apply_request(state: DeploymentState, req: RequestRecord) -> None:
    _note_traffic(state, req.arrival_s)
    w = state.window
    add_finished_sums(w, req)
    if req.ttft_ms is not None:
        w.sum_ttft_ms += req.ttft_ms
        w.n_ttft += 1
    if req.avg_itl_ms is not None:
        w.sum_itl_ms += req.avg_itl_ms
        w.n_itl += 1
    LengthMix(w.mix).add(req.input_tokens, req.output_tokens)
    count_subwindow(w.burst_finished, req.time, w.burst_width(state.config.burst_seconds))


def _apply_arrival(state: DeploymentState, ev: RequestArrival) -> None:
    """Count demand when it arrives; from the first arrival on, arrivals are the count."""
    _note_traffic(state, ev.time)
    state.window.add_arrival(ev.time, ev.input_tokens, state.config.burst_seconds)
    state.seen_arrivals = True


def _apply_inventory(state: DeploymentState, ev: InventoryEvent) -> None:
    if ev.role not in state.config.roles:
        return
    state.inventory_seen = True  # its ready events time the startups from now on, not the acks
    if ev.state == "gone":
        _forget(state, ev.worker_id)
        state.gone_workers[ev.worker_id] = ev.time
        return
    state.gone_workers.pop(ev.worker_id, None)  # back (a restart under the same id)
    previous = state.workers.get(ev.worker_id)
    if ev.state == "ready" and (previous is None or previous.state == "starting"):
        startup_sample(state, ev, previous)
    # an event sent again (a producer's retry) says nothing new: the state began with the first,
    # which times the startup and the ack timeout of an engine stuck starting
    again = previous is not None and previous.state == ev.state
    state.workers[ev.worker_id] = Worker(ev.role, ev.state, ev.gpus, previous.since if again else ev.time)


def _apply_control(state: DeploymentState, ev: ControlEvent, profile=None) -> None:
    body = ev.body
    if isinstance(body, SetMinEndpoints):
        if any(_above_ceiling(state.config, role, n) for role, n in body.minimums.items()):
            # a config file with the same contradiction is refused at load; so is this, in
            # event-time order (it was clamped to the ceiling without a word)
            state.rejected_controls += 1
            return
        state.min_overrides.update(body.minimums)
    elif isinstance(body, SetAdvisory):
        state.advisory_override = body.advisory
    elif isinstance(body, SetConfig | ResetPerf):
        if not _change_config(state, body, profile):
            return
    elif isinstance(body, SeedTraffic):
        history = seed_history(body.windows)
        if seed_problem(state.config, state.forecaster, history, state.first_traffic) is not None:
            state.rejected_controls += 1  # judged against the state as folded, like set_config's
            return
        state.forecaster = rebuild_forecaster(state.config, history)
        _keep_seeded_cache_and_speculation(state, history)
        # kept for a predictor swapped in later, as live windows are
        keep_last(history, state.config.predictor_history_windows)
        state.traffic_history = history
    state.config_version += 1


def _keep_seeded_cache_and_speculation(state: DeploymentState, history: list[list]) -> None:
    """The last KV hit rate and accept length the seed's windows measured, as the throughput
    loop keeps a window's for both loops' sizing (without them the seeded planner sized with
    no cache hits and no speculation until a live window measured)."""
    for row in history:
        obs, _ = window_of(row)
        if obs.kv_hit_rate is not None:
            state.last_kv_hit_rate = obs.kv_hit_rate
        if obs.accept_length is not None:
            state.last_accept_length = obs.accept_length


def _change_config(state: DeploymentState, body: SetConfig | ResetPerf, profile) -> bool:
    """Apply a ``set_config`` or ``reset_perf``; False (counted, nothing changed) where it cannot.

    ``reset_perf`` is for engines that changed under the planner (new
    limits, a new engine version): it rebuilds the perf models from the
    profile and the new config, and drops what was measured with the old
    ones (each closed window's engines, the last window's mix correction,
    the load loop's scale-down runs), as a new deployment would start. The
    fleet (engines known, the decision in flight, the decision ids) and the
    traffic (its windows, the forecaster and its calibration, the measured
    startups) describe the world, not the engines' speed, and are kept.
    """
    try:
        config = state.config.with_changes(body.changes, command=body.command)
        # a switch to a threshold target (or a reset_perf dropping max_kv_tokens) is held to the
        # KV-capacity rule a config file meets when the planner is built: without it decode never scaled
        check_kv_capacity(config, None if profile is None else profile.max_kv_tokens)
        # and the budget to one of the profile's engines of each role, as at start too, and to one
        # of each role's engines as the tick prices them: the inventory's may be larger than the
        # profile's (2-GPU engines under a budget of 3 checked against the 1-GPU profile, and the
        # budget, which wins over the floors, cut prefill to 0)
        profile_gpus = None if profile is None else profile.engine_gpus
        check_profile_budget(config, profile_gpus)
        _check_budget_as_priced(config, state, profile_gpus)
        # a ceiling under a set_min_endpoints floor is the contradiction refused the other way
        # round (until 2026-12-05 it was taken, and the clamp cut the role below its floor)
        minimums = _minimums_kept(config, body.changes or {}, state.min_overrides)
        _check_minimums_under_ceilings(config, minimums)
        # a swap warms the new predictor on the windows the new bound keeps (0: none), also when
        # the bound changes with it: trimmed only as the next window closed, it had replayed them all
        history = list(state.traffic_history)
        keep_last(history, config.predictor_history_windows)
        forecaster = (rebuild_forecaster(config, history, asked=state.forecaster.asked)
                      if predictor_changed(state.config, config) else state.forecaster)
    except (ConfigError, PredictorUnavailable):
        # intake refuses what is wrong on its own (models/config_changes.py); what is wrong
        # against the config as folded (a floor above a ceiling set earlier) lands here, in
        # event-time order: it is counted and changes nothing
        state.rejected_controls += 1
        return False
    state.forecaster = forecaster
    state.traffic_history = history
    state.config = config
    state.min_overrides = minimums
    if "advisory" in (body.changes or {}):
        # the later word is the mode, as for a floor: an earlier set_advisory's shadowed the
        # change for good, the config said false and every decision stayed advisory
        state.advisory_override = None
    if not config.throughput_enabled:
        state.lower_bound = {}  # a floor from a loop that no longer runs must not hold the fleet
    if not measures_floor(config):
        # the windows closed while nothing is measured add no floor, so the ones before would
        # hold the fleet when measuring comes back, however long ago they closed
        state.measured_floors = []
    # a shorter memory forgets the older windows' floors from its tick on: trimmed only as the
    # next window closed, a busy window 900 s back held the idle fleet for another window
    del state.measured_floors[:-config.floor_memory_windows]
    if not config.load_enabled:
        state.down_since.clear()  # a scale-down run starts over when the loop comes back
    if isinstance(body, ResetPerf):
        state.perf = make_perf_models(config, profile)
        state.measured_floors.clear()
        state.mix_factor.clear()
        state.down_since.clear()
    return True


def _check_budget_as_priced(config, state: DeploymentState, profile_gpus: int | None) -> None:
    """``check_gpu_budget`` with each role's engine priced as the tick will price it under ``config``.

    Only a change that breaks it is refused: a budget the inventory outgrew before the change
    (engines larger than the profile's reported after it was set) is not the change's doing,
    and a change of something else (``ttft_ms``) is not refused for it.
    """
    def problem(cfg) -> str | None:
        try:
            check_gpu_budget(cfg, engine_gpus(cfg, state.workers, profile_gpus))
        except ValueError as err:
            return str(err)
        return None

    new = problem(config)
    if new is not None and problem(state.config) is None:
        raise ConfigError(new)


def _minimums_kept(config, changes: dict, minimums: dict[Role, int]) -> dict[Role, int]:
    """The ``set_min_endpoints`` floors a config change leaves in force: not those of the roles
    whose floor field it names, as the later word sets the floor (an earlier control's floor
    shadowed a ``set_config`` of ``prefill_min_endpoint`` for good, the change counted but unused)."""
    def named(role: Role) -> bool:
        own = f"{role}_min_endpoint"
        return own in changes or ("min_endpoint" in changes and getattr(config, own, None) is None)

    return {role: n for role, n in minimums.items() if not named(role)}


def _check_minimums_under_ceilings(config, minimums: dict[Role, int]) -> None:
    """Refuse a config whose ceilings leave a run-time minimum above them, as a config file
    with that floor and ceiling is refused."""
    for role, minimum in minimums.items():
        if _above_ceiling(config, role, minimum):
            raise ConfigError(f"{role}: set_min_endpoints {minimum} is more than its ceiling "
                              f"({config.max_endpoints(role)})")


def _above_ceiling(config, role: Role, minimum: int) -> bool:
    ceiling = config.max_endpoints(role) if role in config.roles else None
    return ceiling is not None and minimum > ceiling


def _apply_ack(state: DeploymentState, ack: Ack) -> None:
    """The pending decision's answer, or a late one for the decision the ack timeout gave up on.

    Either way an ``applied`` ack says the fleet is at that decision's targets
    (a newer decision still pending moves it again when its own ack comes);
    an answer to the pending decision also closes the timed-out one, which
    the fleet is past. An ack for any other older or unknown decision
    changes nothing.
    """
    answered = next((d for d in (state.pending, state.timed_out)
                     if d is not None and d.decision_id == ack.decision_id), None)
    if answered is None:
        return
    if ack.status == "applied":
        reached, state.desired = state.desired, dict(answered.targets)
        ack_startup_sample(state, ack, answered.targets, reached)
    if answered is state.pending:
        state.pending = None
    state.timed_out = None


_HANDLERS = {
    ForwardPassMetrics: _apply_fpm,
    FpmBatch: _apply_fpm_batch,
    WireFpmBatch: _apply_fpm_batch,
    RequestRecord: _apply_request,
    RequestArrival: _apply_arrival,
    InventoryEvent: _apply_inventory,
    Ack: _apply_ack,
    ClockEvent: None,
    Decision: None,
    DeadLetter: None,
}
