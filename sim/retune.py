"""Replay-based retune: pick the planner's knobs from the traffic it just served.

A knob like ``target_utilization`` has no right value for every workload:
a smooth trace meets its SLA at 0.9, a bursty one needs 0.7, and the best
setting moves with the load (docs/forecasting.md measures it). Dynamo's
Planner answers with retune (experimental, simulation only): every
``interval_seconds`` it replays the window of traffic that just ended
against a grid of Planner settings and applies the best one. This module
is that loop for ``fleetplan simulate`` (docs/retune.md):

- **Windows.** Window k covers ``[kT, (k+1)T)``. Its sweep launches at the
  first tick at or after ``L_k = (k+1)T + grace``, and takes the requests
  that arrived in the window and had finished by ``L_k`` (a recorded
  trace has no row for a request still in flight).
- **Candidates.** The grid's Cartesian product, plus the startup point and
  the current point, deduplicated, current first. Each is a config change
  validated at start: a bad grid fails the run before it begins.
- **Replays.** Each candidate replays the window on a fresh simulated
  fleet that starts from the ready workers recorded at the window start,
  driven by a planner with the candidate's config whose forecaster is the
  run's own as it stood at the window start. Same seed for all: the
  candidates are compared on one sample path.
- **Score.** ``goodput_per_gpu`` (Dynamo's default): SLA-good output
  tokens per second of the window per GPU held. ``gpu_hours_at_goal``:
  the fewest GPU-hours among the candidates whose attainment reaches
  ``attainment_goal`` (the highest attainment if none does).
- **Decision.** The best candidate is applied only if it beats the current
  point by more than ``min_improvement_percentage`` and changes a field.
  It lands on the first tick at or after launch + ``max(decision_latency,
  tick)`` and is fed to the core as an operator ``set_config`` control
  event, so the run's event log still folds to the same decisions
  (``fleetplan plan``, ``fleetplan audit``).
- **The run's end.** A window whose decision would land after the
  workload ends is not replayed: the change could at most steer the
  drain. It is recorded as ``not run``, and a decision still in flight
  when the run ends as ``not landed``, so every window that came due is
  in ``decisions``.

- **Predictor pre-sweep** (``load_predictor`` candidates, Dynamo's):
  each candidate, fed the windows the core kept up to the window start,
  forecasts the window's closed windows one step ahead; the lowest
  ``window_loss`` wins, and every candidate but the current point replays
  with it. An applied predictor change reaches the core as ``set_config``,
  which rebuilds its forecaster (``fleetplan.models.predictor_swap``).

The load predictor is never a grid field; the loop intervals, the
engine's and the SLA's own fields, and what a deployment builds at start
cannot be searched (``FIXED_FIELDS``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetplan.models.config import (
    PREDICTOR_FIELDS,
    STARTUP_FIELDS,
    ConfigError,
    PlannerConfig,
    check_gpu_budget,
    number_problem,
)
from fleetplan.models.forecast import window_loss
from fleetplan.models.predictor_swap import rebuild_forecaster, window_of
from fleetplan.models.quantiles import asked_requests
from fleetplan.sim.metrics import sla_met
from fleetplan.sim.traces import TraceRequest
from fleetplan.sim.workload import Workload

__all__ = ["FIXED_FIELDS", "RetuneError", "RetuneSpec", "Retuner", "describe_changes", "load_retune"]

FIXED_FIELDS = frozenset({
    # the deployment and its SLA: what is served and what counts as good, not how it is planned
    "mode", "ttft_ms", "itl_ms", "max_num_batched_tokens", "max_num_seqs", "max_kv_tokens",
    "context_length", "prefill_engine_num_gpu", "decode_engine_num_gpu", "profile_results_dir",
    "profile_tp",
    # the tick grid the windows are cut on
    "throughput_adjustment_interval_seconds", "load_adjustment_interval_seconds",
    "enable_throughput_scaling", "enable_load_scaling", "grace_seconds", "ack_timeout_seconds",
    # the load predictor: never a grid dimension (the pre-sweep picks it, as in Dynamo)
    *PREDICTOR_FIELDS, "predictor_history_windows",
    # built into the state when a deployment starts: set_config refuses them
    *STARTUP_FIELDS,
})
"""PlannerConfig fields a retune grid may not search."""


def _ended_by(row: list, t: float) -> bool:
    """Whether a kept window (``remember_window``'s row) had ended by ``t``.

    A ``load_predictor_warmup_trace``'s windows have no start time: they are
    taken to end where the live ones begin, so they ended by any window's
    start (read as a number, their ``None`` stopped the run at its first sweep).
    """
    return row[0] is None or row[0] + row[1] <= t + 1e-9


class RetuneError(ValueError):
    """A retune spec that cannot run; the message names the field."""


class RetuneSpec(BaseModel):
    """The ``retune`` block: windows, the grid, and how candidates are scored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_seconds: float = Field(1800.0, gt=0, allow_inf_nan=False)
    grace_seconds: float = Field(60.0, ge=0, allow_inf_nan=False)
    decision_latency_seconds: float = Field(0.0, ge=0, allow_inf_nan=False)
    planner: dict[str, list[Any]] = Field(min_length=1)
    # predictor candidates for the pre-sweep: each a mapping of PREDICTOR_FIELDS (Dynamo's retune.load_predictor)
    load_predictor: list[dict[str, Any]] = Field(default_factory=list)
    objective: Literal["goodput_per_gpu", "gpu_hours_at_goal"] = "goodput_per_gpu"
    attainment_goal: float = Field(0.99, gt=0, le=1, allow_inf_nan=False)
    min_improvement_percentage: float = Field(1.0, ge=0, allow_inf_nan=False)
    max_candidates: int = Field(16, ge=1)
    advisory: bool = False


def load_retune(data: Any, *, source: str = "retune") -> RetuneSpec:
    """Validate a retune mapping (a YAML file's ``retune:`` block, or the block itself)."""
    if isinstance(data, dict) and set(data) == {"retune"}:
        data = data["retune"]
    if not isinstance(data, dict):
        raise RetuneError(f"{source}: expected a mapping of retune fields, got {type(data).__name__}")
    for key, value in data.items():
        # pydantic's lax mode takes YAML's true as 1, as the planner's config refuses to
        # (the grid's values and the predictor entries go through that config's check)
        info = RetuneSpec.model_fields.get(key)
        problem = None if info is None else number_problem(key, value, info.annotation)
        if problem is not None:
            raise RetuneError(f"{source}: {problem}")
    try:
        return RetuneSpec.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "retune"
        what = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        raise RetuneError(f"{source}: {where}: {what}") from None


def describe_changes(changes: dict[str, Any]) -> str:
    """A decision's config change as the run's table and report show it: ``field=value, ...``."""
    return ", ".join(f"{k}={v}" for k, v in changes.items())


@dataclass(frozen=True)
class Candidate:
    changes: dict[str, Any]  # every searched field's value
    config: PlannerConfig


@dataclass
class Score:
    """One candidate's replay of one window."""

    changes: dict[str, Any]
    score: float
    attainment: float
    gpu_hours: float
    good_tokens_per_s: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class _Window:
    index: int
    ready: dict[str, int]
    forecaster: dict  # the run's forecaster state at the window start
    predictor: dict[str, Any] = field(default_factory=dict)  # the searched predictor fields then


@dataclass
class _Pending:
    lands_at: float
    record: dict
    changes: dict[str, Any] | None


@dataclass
class Retuner:
    """The retune loop of one simulated run (:class:`fleetplan.sim.runner.PlannerController` drives it)."""

    spec: RetuneSpec
    setup: Any  # FleetSetup: the run's fleet, which every candidate replay copies
    profile: Any = None
    decisions: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        base: PlannerConfig = self.setup.config
        spec = self.spec
        tick = base.tick_interval_seconds
        window = spec.interval_seconds
        if not math.isclose(window / tick, round(window / tick)) or window < tick:
            raise RetuneError(f"retune.interval_seconds: must be a whole number of ticks ({tick} s), got {window:g}")
        if spec.grace_seconds + max(spec.decision_latency_seconds, tick) > window:
            raise RetuneError(
                "retune.grace_seconds + decision latency: must fit in interval_seconds, so one sweep "
                f"is in flight at a time ({spec.grace_seconds:g} + {max(spec.decision_latency_seconds, tick):g} "
                f"> {window:g})"
            )
        for name in spec.planner:
            if name not in PlannerConfig.model_fields:
                raise RetuneError(f"retune.planner.{name}: not a planner config field")
            if name in FIXED_FIELDS:
                raise RetuneError(
                    f"retune.planner.{name}: cannot be retuned (retune searches planning knobs, "
                    "not the deployment, its tick grid or its load predictor)"
                )
            if not spec.planner[name]:
                raise RetuneError(f"retune.planner.{name}: expected a non-empty list of values")
        names = list(spec.planner)
        points = [dict(zip(names, values, strict=True)) for values in itertools.product(*spec.planner.values())]
        if len(points) > spec.max_candidates:
            raise RetuneError(f"retune.planner: the grid has {len(points)} points, max_candidates is {spec.max_candidates}")
        self.predictors = self._predictor_candidates(base)
        self.predictor_names = sorted({n for p in spec.load_predictor for n in p})
        self.startup_point = {n: getattr(base, n) for n in names + self.predictor_names}
        self.grid = [self._candidate(p, f"retune.planner point {i} {p}") for i, p in enumerate(points)]
        self.current = dict(self.startup_point)
        self._windows: dict[int, _Window] = {}
        self._requests: list[tuple[float, float, int, TraceRequest]] = []  # (arrival, end, index, request)
        self._next_window = 0
        self._pending: _Pending | None = None
        self._end_s: float | None = None  # the workload's end, once the run starts

    def _predictor_candidates(self, base: PlannerConfig) -> list[dict[str, Any]]:
        """Each ``load_predictor`` entry as a full set of the searched predictor fields, checked once."""
        entries = self.spec.load_predictor
        if entries and not base.throughput_enabled:
            raise RetuneError("retune.load_predictor: the pre-sweep needs the throughput loop with the SLA target")
        names = sorted({n for p in entries for n in p})
        out = []
        for i, entry in enumerate(entries):
            for name in entry:
                if name not in PREDICTOR_FIELDS:
                    raise RetuneError(f"retune.load_predictor[{i}].{name}: not a predictor field "
                                      f"(one of {', '.join(sorted(PREDICTOR_FIELDS))})")
            try:
                config = base.with_changes(entry)
            except ConfigError as err:
                raise RetuneError(f"retune.load_predictor[{i}]: {err}") from None
            out.append({n: getattr(config, n) for n in names})
        return out

    def _candidate(self, point: dict[str, Any], where: str) -> Candidate:
        """A point as a config, refused as the run's own config would be.

        ``with_changes`` knows an engine's GPUs only from the config; the
        run's budget is also checked against the profile's (``make_setup``),
        and so is each point's: under a budget that cannot hold one engine
        of each role, a replay would leave a role with none.
        """
        try:
            config = self.setup.config.with_changes(point)
            check_gpu_budget(config, self.setup.gpus)
        except ValueError as err:  # ConfigError is one
            raise RetuneError(f"{where}: {err}") from None
        # the windows are cut on the run's tick: a threshold target switches the loops as their
        # own switches do, and applied, a longer tick skipped the windows starting between its ticks
        tick, new_tick = self.setup.config.tick_interval_seconds, config.tick_interval_seconds
        if new_tick != tick:
            raise RetuneError(f"{where}: it moves the planner's tick from {tick} s to {new_tick} s, "
                              "which the windows are cut on")
        return Candidate(dict(point), config)

    # --- fed by the run --------------------------------------------------------

    def start(self, initial: dict[str, int], forecaster_state: dict, end_s: float | None = None) -> None:
        """The run begins: window 0 starts from its initial fleet and forecaster (warmed, if the config says so).

        ``end_s`` is when the workload ends: a sweep whose decision would
        land after it is not replayed (``tick``).
        """
        self._windows[0] = _Window(0, dict(initial), forecaster_state, self._predictor_now())
        self._end_s = end_s

    def finish(self) -> None:
        """The run has ended: a decision still in flight is recorded, as never landed.

        Without this the sweep's replays were run and their outcome dropped,
        and ``decisions`` (the summary's ``retune``) missed a window.
        """
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.record.update(decided_at=None, outcome="not landed: the run ended", changes=None)
            self.decisions.append(pending.record)

    def _predictor_now(self) -> dict[str, Any]:
        return {n: self.current[n] for n in self.predictor_names}

    def request_done(self, req) -> None:
        self._requests.append((req.arrival, req.end, req.index, TraceRequest(
            req.arrival, req.isl, req.osl, tuple(req.hash_ids or ()),
        )))

    def tick(self, now: float, ready: dict[str, int], forecaster_state, history=list) -> dict[str, Any] | None:
        """Called after each tick of the run; returns the config changes to apply now, if any.

        ``forecaster_state`` is called (once, at a window start) for the
        forecaster's saved state; ``history`` (at a sweep) for the windows
        the core kept (``DeploymentState.traffic_history``), which the
        predictor pre-sweep scores and warms candidates on.
        """
        window = self.spec.interval_seconds
        k = now / window
        if math.isclose(k, round(k)) and round(k) not in self._windows:
            self._windows[round(k)] = _Window(round(k), dict(ready), forecaster_state(), self._predictor_now())
        landed = None
        if self._pending is not None and now >= self._pending.lands_at:
            pending, self._pending = self._pending, None
            pending.record["decided_at"] = now
            self.decisions.append(pending.record)
            if pending.changes is not None:
                self.current.update(pending.changes)
                landed = pending.changes
        if self._pending is None:
            due = [w for w in self._windows if w >= self._next_window and now >= (w + 1) * window + self.spec.grace_seconds]
            if due:
                newest = max(due)
                self._next_window = newest + 1
                if self._end_s is not None and self._lands_at(now) > self._end_s:
                    # its decision would come after the workload: replaying the candidates is wasted
                    self.decisions.append(self._not_run(self._windows[newest]))
                else:
                    self._pending = self._sweep(self._windows[newest], now, history())
                for old in [w for w in self._windows if w <= newest]:
                    del self._windows[old]
        return landed

    # --- the sweep -------------------------------------------------------------

    def _lands_at(self, launched_at: float) -> float:
        """The tick a sweep launched then lands on: the first at or after launch + max(D, tick).

        Rounded up to that tick, not left at launch + D: the end-of-run check
        judges a sweep by it, and with D between ticks (90 s at one-minute
        ticks) a decision landing after the run was replayed, then never landed.
        """
        tick = self.setup.config.tick_interval_seconds
        ticks = math.ceil(max(self.spec.decision_latency_seconds, tick) / tick - 1e-9)  # launch is a tick
        return launched_at + ticks * tick

    def _record(self, window: _Window, launched_at: float | None) -> tuple[dict[str, Any], list[TraceRequest]]:
        """A window's decision record, before any replay, and the requests it replays."""
        spec = self.spec
        start = window.index * spec.interval_seconds
        end = start + spec.interval_seconds
        requests = self.window_requests(start, end, end + spec.grace_seconds)
        self._requests = [r for r in self._requests if r[0] >= end]  # later windows need only these
        record: dict[str, Any] = {
            "window": [start, end], "launched_at": launched_at, "requests": len(requests),
            "start_fleet": dict(window.ready), "objective": spec.objective,
            "current": dict(self.current), "outcome": None, "changes": None, "candidates": [],
        }
        return record, requests

    def _not_run(self, window: _Window) -> dict[str, Any]:
        record, _ = self._record(window, None)
        record.update(decided_at=None, outcome="not run: it would land after the run ends")
        return record

    def _sweep(self, window: _Window, now: float, history: list[list]) -> _Pending:
        spec = self.spec
        record, requests = self._record(window, now)
        start, end = record["window"]
        lands_at = self._lands_at(now)
        missing = [r for r in self.setup.roles if window.ready.get(r, 0) < 1]
        if missing:
            record["outcome"] = f"failed: no ready {'/'.join(missing)} worker at the window start"
            return _Pending(lands_at, record, None)
        if not requests:
            record["outcome"] = "empty_window"
            return _Pending(lands_at, record, None)
        before = [w for w in history if _ended_by(w, start)]  # kept windows ended by the start
        winner = self._presweep(history, before, start, end, record) if self.predictors else {}
        candidates = self._candidates(winner)
        scores = [self._replay(c, window, requests, start, end, before) for c in candidates]
        record["candidates"] = [s.to_dict() for s in scores]
        best = max(range(len(scores)), key=lambda i: (self._rank(scores[i]), -i))  # ties: the earlier
        record["best"] = best
        changes = {n: v for n, v in candidates[best].changes.items() if v != self.current[n]}
        if best == 0 or not changes or not self._beats(scores[best], scores[0]):
            record["outcome"] = "kept"
            return _Pending(lands_at, record, None)
        record["changes"] = changes
        record["outcome"] = "advisory" if spec.advisory else "applied"
        return _Pending(lands_at, record, None if spec.advisory else changes)

    def window_requests(self, start: float, end: float, cutoff: float) -> list[TraceRequest]:
        """The requests that arrived in ``[start, end)`` and had finished by ``cutoff``, in
        arrival order: the same list whatever order they finished in."""
        kept = [(arrival, index, r) for arrival, done, index, r in self._requests
                if start <= arrival < end and done <= cutoff]
        return [r for _, _, r in sorted(kept, key=lambda x: (x[0], x[1]))]

    def _presweep(self, history: list[list], before: list[list], start: float, end: float,
                  record: dict) -> dict[str, Any]:
        """Dynamo's load-predictor pre-sweep: the candidate with the lowest one-step loss on the window.

        Each candidate is warmed on the windows the core kept that ended by
        the window start, then forecasts each closed window of the retune
        window one step ahead before seeing it (``window_loss``, the
        reference's weights). Ties go to the earlier candidate. With no
        window before it (the run's first) or none closed in it, the current
        predictor stays: every candidate would start empty, and the loss of
        its first forecast, of nothing, would decide (Dynamo fails a swap
        that has no warm-up traffic the same way).
        """
        scored = [w for w in history if w[0] is not None and w[0] >= start - 1e-9 and _ended_by(w, end)]
        losses = []
        for fields in self.predictors:
            forecaster = rebuild_forecaster(self.setup.config.with_changes(fields), before)
            total = 0.0
            for row in scored:
                obs, peak = window_of(row)
                total += window_loss(forecaster.forecast(), (obs.num_req, obs.isl, obs.osl))
                forecaster.observe(obs, peak=peak)
            losses.append(total / len(scored) if scored else None)
        best = None if not (scored and before) else min(range(len(losses)), key=lambda i: (losses[i], i))
        record["predictor_presweep"] = {
            "scored_windows": len(scored), "warm_windows": len(before),
            "losses": [{"predictor": dict(f), "loss": loss} for f, loss in zip(self.predictors, losses, strict=True)],
            "winner": best,
        }
        return self._predictor_now() if best is None else dict(self.predictors[best])

    def _candidates(self, winner: dict[str, Any] | None = None) -> list[Candidate]:
        """The current point, the startup point, then the grid; one per distinct config.

        Every candidate but the current point takes the pre-sweep winner's
        predictor (``winner``), as in Dynamo.
        """
        winner = winner or {}
        out: list[Candidate] = []
        seen: list[PlannerConfig] = []
        first = [self._candidate(self.current, "retune current point"),
                 self._candidate({**self.startup_point, **winner}, "retune startup point")]
        grid = self.grid if not winner else [
            self._candidate({**c.changes, **winner}, f"retune.planner point {c.changes}") for c in self.grid
        ]
        for cand in first + grid:
            if cand.config not in seen:
                seen.append(cand.config)
                out.append(cand)
        return out

    def _replay(self, cand: Candidate, window: _Window, requests: list[TraceRequest],
                start: float, end: float, before: list[list] = ()) -> Score:
        from fleetplan.models.planner import Planner
        from fleetplan.sim.runner import ClosedLoop, PlannerController

        setup = dataclasses.replace(self.setup, config=cand.config)
        workload = Workload(f"retune window [{start:g}, {end:g})", end, lambda: requests)
        forecaster = window.forecaster
        if any(getattr(cand.config, n) != v for n, v in window.predictor.items()):
            # another predictor: the one a swap at the window start would have built, which makes
            # the quantile requests of that tick again (models/apply.py), as the levels move on them
            asked = asked_requests(window.forecaster.get("asked", []))
            forecaster = rebuild_forecaster(cand.config, list(before), asked=asked).to_state()
        controller = PlannerController(Planner(cand.config, profile=self.profile), forecaster_state=forecaster)
        result = ClosedLoop(workload, setup, controller, window.ready, start_s=start).run()
        a = result.requests.arrays()
        ok = sla_met(a["ttft"], a["itl"], cand.config.ttft_ms, cand.config.itl_ms)
        # Dynamo's rescaling: SLA-good tokens per second of the *window*, since the drain
        # after its last arrival is an artefact of cutting the traffic there; GPUs are
        # averaged over the whole replay, drain included
        per_s = float(a["osl"][ok].sum()) / self.spec.interval_seconds
        gpu_s = result.summary.gpu_hours * 3600.0
        mean_gpus = gpu_s / max(result.end_s - start, self.spec.interval_seconds)
        score = per_s / mean_gpus if mean_gpus > 0 else 0.0
        attainment = float(ok.mean()) if ok.size else 0.0
        return Score(dict(cand.changes), score, attainment, gpu_s / 3600.0, per_s)

    def _rank(self, s: Score) -> tuple:
        if self.spec.objective == "goodput_per_gpu":
            return (s.score,)
        meets = s.attainment >= self.spec.attainment_goal
        return (meets, -s.gpu_hours if meets else s.attainment)

    def _beats(self, best: Score, current: Score) -> bool:
        margin = self.spec.min_improvement_percentage / 100.0
        if self.spec.objective == "goodput_per_gpu":
            return best.score > current.score * (1.0 + margin)
        goal = self.spec.attainment_goal
        if best.attainment >= goal > current.attainment:
            return True
        if best.attainment >= goal:
            return best.gpu_hours < current.gpu_hours * (1.0 - margin)
        return best.attainment > current.attainment * (1.0 + margin)
