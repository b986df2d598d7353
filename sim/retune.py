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

Fields the planner builds its state from (the load predictor and its
parameters, loop intervals) and the engine's or SLA's own fields cannot be
searched; Dynamo's predictor pre-sweep is not implemented.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetplan.models.config import PREDICTOR_FIELDS, STARTUP_FIELDS, ConfigError, PlannerConfig
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
    # the load predictor: Dynamo never makes it a grid dimension (its pre-sweep picks it, which
    # fleetplan does not implement yet; the core can now swap predictors: models/predictor_swap.py)
    *PREDICTOR_FIELDS, "predictor_history_windows",
    # built into the state when a deployment starts: set_config refuses them
    *STARTUP_FIELDS,
})
"""PlannerConfig fields a retune grid may not search."""


class RetuneError(ValueError):
    """A retune spec that cannot run; the message names the field."""


class RetuneSpec(BaseModel):
    """The ``retune`` block: windows, the grid, and how candidates are scored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interval_seconds: float = Field(1800.0, gt=0, allow_inf_nan=False)
    grace_seconds: float = Field(60.0, ge=0, allow_inf_nan=False)
    decision_latency_seconds: float = Field(0.0, ge=0, allow_inf_nan=False)
    planner: dict[str, list[Any]] = Field(min_length=1)
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
        self.startup_point = {n: getattr(base, n) for n in names}
        self.grid = [self._candidate(p, f"retune.planner point {i} {p}") for i, p in enumerate(points)]
        self.current = dict(self.startup_point)
        self._windows: dict[int, _Window] = {}
        self._requests: list[tuple[float, float, int, TraceRequest]] = []  # (arrival, end, index, request)
        self._next_window = 0
        self._pending: _Pending | None = None

    def _candidate(self, point: dict[str, Any], where: str) -> Candidate:
        try:
            return Candidate(dict(point), self.setup.config.with_changes(point))
        except ConfigError as err:
            raise RetuneError(f"{where}: {err}") from None

    # --- fed by the run --------------------------------------------------------

    def start(self, initial: dict[str, int], forecaster_state: dict) -> None:
        """The run begins: window 0 starts from its initial fleet and forecaster (warmed, if the config says so)."""
        self._windows[0] = _Window(0, dict(initial), forecaster_state)

    def request_done(self, req) -> None:
        self._requests.append((req.arrival, req.end, req.index, TraceRequest(
            req.arrival, req.isl, req.osl, tuple(req.hash_ids or ()),
        )))

    def tick(self, now: float, ready: dict[str, int], forecaster_state) -> dict[str, Any] | None:
        """Called after each tick of the run; returns the config changes to apply now, if any.

        ``forecaster_state`` is called (once, at a window start) for the
        forecaster's saved state.
        """
        window = self.spec.interval_seconds
        k = now / window
        if math.isclose(k, round(k)) and round(k) not in self._windows:
            self._windows[round(k)] = _Window(round(k), dict(ready), forecaster_state())
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
                self._pending = self._sweep(self._windows[newest], now)
                for old in [w for w in self._windows if w <= newest]:
                    del self._windows[old]
        return landed

    # --- the sweep -------------------------------------------------------------

    def _sweep(self, window: _Window, now: float) -> _Pending:
        spec = self.spec
        start = window.index * spec.interval_seconds
        end = start + spec.interval_seconds
        requests = self.window_requests(start, end, end + spec.grace_seconds)
        self._requests = [r for r in self._requests if r[0] >= end]  # later windows need only these
        record: dict[str, Any] = {
            "window": [start, end], "launched_at": now, "requests": len(requests),
            "start_fleet": dict(window.ready),
            "current": dict(self.current), "outcome": None, "changes": None, "candidates": [],
        }
        lands_at = now + max(spec.decision_latency_seconds, self.setup.config.tick_interval_seconds)
        missing = [r for r in self.setup.roles if window.ready.get(r, 0) < 1]
        if missing:
            record["outcome"] = f"failed: no ready {'/'.join(missing)} worker at the window start"
            return _Pending(lands_at, record, None)
        if not requests:
            record["outcome"] = "empty_window"
            return _Pending(lands_at, record, None)
        candidates = self._candidates()
        scores = [self._replay(c, window, requests, start, end) for c in candidates]
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

    def _candidates(self) -> list[Candidate]:
        """The current point, the startup point, then the grid; one per distinct config."""
        out: list[Candidate] = []
        seen: list[PlannerConfig] = []
        first = [self._candidate(self.current, "retune current point"),
                 self._candidate(self.startup_point, "retune startup point")]
        for cand in first + self.grid:
            if cand.config not in seen:
                seen.append(cand.config)
                out.append(cand)
        return out

    def _replay(self, cand: Candidate, window: _Window, requests: list[TraceRequest],
                start: float, end: float) -> Score:
        from fleetplan.models.planner import Planner
        from fleetplan.sim.runner import ClosedLoop, PlannerController

        setup = dataclasses.replace(self.setup, config=cand.config)
        workload = Workload(f"retune window [{start:g}, {end:g})", end, lambda: requests)
        controller = PlannerController(Planner(cand.config, profile=self.profile),
                                       forecaster_state=window.forecaster)
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
