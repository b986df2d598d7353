"""A simulation experiment: one workload, one fleet, the contenders side by side.

``simulate`` runs the chosen policy (the planner by default) and, in the
same invocation, the baselines on the same workload and fleet, so every
figure in the summary is comparable: same requests, same engines, same
startup time, same connector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO

import numpy as np

from fleetplan.models.constraints import fit_gpu_budget
from fleetplan.sim.baselines import (
    SchedulePolicy,
    StaticPolicy,
    needs_before,
    refine_needs,
    static_targets,
)
from fleetplan.sim.metrics import sla_met
from fleetplan.sim.realtime import LiveRun
from fleetplan.sim.runner import (
    ClosedLoop,
    FleetSetup,
    PlannerController,
    PolicyController,
    RunResult,
)
from fleetplan.sim.sizing import EngineCapacity, window_needs, window_traffic
from fleetplan.sim.workload import Workload


@dataclass
class Sizing:
    """Per-window replica needs of the workload (the baselines' schedule).

    ``capacity_needs``: sized with the SLA-bound capacity search (the warm
    start); ``floor_needs``: sized with peak throughput (the oracle's start);
    ``needs``: the oracle's refined counts once it has run.
    """

    window_s: float
    capacity_needs: list[dict[str, int]]
    floor_needs: list[dict[str, int]]
    needs: list[dict[str, int]]
    traffic: list
    refine_rounds: int = 0
    engine_rps: dict[str, float] = field(default_factory=dict)


def size_workload(workload: Workload, setup: FleetSetup) -> Sizing:
    cfg = setup.config
    window = setup.options.window_s
    traffic = window_traffic(workload, window)
    capacity = EngineCapacity(setup.timing, setup.limits, cfg.ttft_ms, cfg.itl_ms)
    peak = EngineCapacity(setup.timing, setup.limits, None, None)
    minimums = {r: max(cfg.min_endpoints(r), 1) for r in setup.roles}
    needs = window_needs(traffic, capacity, setup.roles, minimums)
    floor = window_needs(traffic, peak, setup.roles, minimums)
    busy = [w for w in traffic if w.num_req]
    engine_rps = {}
    if busy:
        isl = sum(w.isl * w.num_req for w in busy) / sum(w.num_req for w in busy)
        osl = sum(w.osl * w.num_req for w in busy) / sum(w.num_req for w in busy)
        engine_rps = {r: capacity.rps(r, isl, osl) for r in setup.roles}
    return Sizing(window, needs, floor, [dict(n) for n in needs], traffic, 0, engine_rps)


def initial_fleet(
    spec: str | Mapping[str, int], setup: FleetSetup, sizing: Sizing, workload: Workload | None = None,
    goal: float = 0.99, rounds: int = 8,
) -> dict[str, int]:
    """``warm``: the fleet that meets the SLA until the first decision can take effect;
    ``min``: the config's minimums; or explicit counts.

    ``warm`` and ``min`` are cut to the config's replica ceilings and
    ``max_gpu_budget`` (``within_limits``), which the planner never exceeds,
    as explicit counts above them are refused (sim/cli.py).

    The first decision comes at the first tick of the slower enabled loop and
    its engines one startup later, so a fleet that had been planned before
    the trace began would carry that span; sizing for less charges the
    planner for a cold start it could not have prevented. The capacity
    search alone is optimistic on bursty traffic (it sees a window's mean
    rate), so with ``workload`` given the span is replayed on a fixed fleet
    and a role is added wherever a window of the span misses ``goal`` for
    its target (TTFT: the prompt role, ITL: the decode role), as the
    oracle's refinement does.
    """
    if isinstance(spec, Mapping):
        return {r: int(spec.get(r, 1)) for r in setup.roles}
    if spec == "min":
        return within_limits({r: max(setup.config.min_endpoints(r), 0) for r in setup.roles}, setup)
    if spec != "warm":
        raise ValueError(f"initial: expected warm, min or role=count pairs, got {spec!r}")
    cfg = setup.config
    first_tick = (cfg.throughput_adjustment_interval_seconds if cfg.throughput_enabled
                  else cfg.load_adjustment_interval_seconds)
    span = setup.startup().upper() + first_tick
    # the windows that start before the span ends: from then on, the first decision's engines serve
    fleet = needs_before(sizing.capacity_needs, sizing.window_s, span)
    if workload is None:
        return within_limits(fleet, setup)
    return within_limits(_replayed_warm_fleet(workload, setup, sizing.window_s, span, fleet, goal, rounds), setup)


def within_limits(fleet: Mapping[str, int], setup: FleetSetup) -> dict[str, int]:
    """``fleet`` cut to the config's replica ceilings, then to ``max_gpu_budget``.

    A fleet this planner had planned holds neither more (until 2026-12-05 the
    warm fleet of Azure code x50 began at 11 GPUs under the default 8). The
    budget is cut as the planner cuts a fleet over it (models/constraints.py):
    the largest GPU user first, the minimums kept while they fit.
    """
    cfg = setup.config
    maximums = {r: cfg.max_endpoints(r) for r in setup.roles}
    capped = {r: n if maximums[r] is None else min(n, maximums[r]) for r, n in fleet.items()}
    if cfg.max_gpu_budget < 0:
        return capped
    floors = {r: cfg.min_endpoints(r) for r in setup.roles}
    fitted, _ = fit_gpu_budget(capped, capped, setup.gpus, cfg.max_gpu_budget, floors=floors, maximums=maximums)
    return fitted


def _replayed_warm_fleet(
    workload: Workload, setup: FleetSetup, window_s: float, span_s: float, fleet: dict[str, int],
    goal: float, rounds: int,
) -> dict[str, int]:
    """Grow ``fleet`` until every window of the first ``span_s`` meets ``goal`` on replay.

    The oracle's refinement with one fixed fleet for the span: its worst
    window decides which role is short.
    """
    head = Workload(f"{workload.name}[:{span_s:g}s]", span_s,
                    lambda: [r for r in workload.requests() if r.arrival_s < span_s])
    n_windows = max(1, math.ceil(span_s / window_s))

    def worst(values):
        seen = [v for v in values if v is not None]
        return min(seen) if seen else None

    def replay(needs):
        result = run_policy(head, setup, StaticPolicy(needs[0], "warm"), "warm", needs[0])
        windows = window_attainment(result, setup, window_s, n_windows)
        return [(worst(t for t, _ in windows), worst(i for _, i in windows))]

    refined, _ = refine_needs([fleet], replay, setup.roles[0], setup.roles[-1], goal, rounds)
    return refined[0]


def run_planner(
    workload: Workload, setup: FleetSetup, planner, initial: Mapping[str, int],
    log: IO[bytes] | None = None, progress: Callable[[float], None] | None = None,
    live: LiveRun | None = None, retune=None, seed: list[list] | None = None,
) -> RunResult:
    """One planner run; with ``retune`` (a :class:`fleetplan.sim.retune.Retuner`) its
    decisions are in ``RunResult.retune``. ``seed`` (``fleetplan.sim.warm.history_windows``)
    starts the deployment's forecaster from the traffic before the run instead of empty."""
    controller = PlannerController(planner, retune=retune, seed=seed)
    loop = ClosedLoop(workload, setup, controller, initial, log=log, progress=progress, live=live)
    result = loop.run()
    if retune is not None:
        result.retune = list(retune.decisions)
    return result


def run_policy(
    workload: Workload, setup: FleetSetup, policy, name: str, initial: Mapping[str, int] | None = None,
    log: IO[bytes] | None = None, progress: Callable[[float], None] | None = None,
    live: LiveRun | None = None,
) -> RunResult:
    controller = PolicyController(policy, name, setup.roles)
    start = controller.initial() if initial is None else initial
    if start is None:
        start = {r: 1 for r in setup.roles}
    return ClosedLoop(workload, setup, controller, start, log=log, progress=progress, live=live).run()


def feasible_requests(result: RunResult, setup: FleetSetup) -> tuple[np.ndarray, np.ndarray]:
    """Which requests *could* meet each target on an idle engine.

    A 30k-token prompt cannot meet a 500 ms TTFT however many engines run, so
    a miss on it says nothing about capacity. The floor is the request alone:
    its prompt chunked on an empty prefill engine plus the KV transfer (TTFT),
    one decode step of a batch of one (ITL).
    """
    a = result.requests.arrays()
    cfg = setup.config
    timing = setup.timing
    mbt = setup.limits.max_num_batched_tokens
    prompt = np.maximum(a["isl"] - a["cached"], 1)
    floors: dict[int, float] = {}
    ttft_floor = np.empty(prompt.size)
    for i, tokens in enumerate(prompt.tolist()):
        t = floors.get(tokens)
        if t is None:
            full, tail = divmod(tokens, mbt)
            t = full * timing.prefill_s(mbt) + (timing.prefill_s(tail) if tail else 0.0)
            floors[tokens] = t
        ttft_floor[i] = t
    if setup.config.mode == "disagg":
        ttft_floor += a["isl"] * setup.transfer.kv_bytes_per_token / setup.transfer.bandwidth_bytes_per_s
    itl_floor = np.array([timing.decode_s(1, isl + osl / 2) for isl, osl in zip(a["isl"].tolist(), a["osl"].tolist(), strict=True)])
    return ttft_floor * 1000.0 <= cfg.ttft_ms, itl_floor * 1000.0 <= cfg.itl_ms


def feasible_attainment(result: RunResult, setup: FleetSetup) -> float | None:
    """SLA attainment over the requests that could meet both targets on an idle engine.

    Where some prompts are too long for the TTFT on any fleet (Mooncake's
    reach 85k tokens), this is the share that capacity decides; None when
    no request could.
    """
    a = result.requests.arrays()
    can_ttft, can_itl = feasible_requests(result, setup)
    feasible = can_ttft & (can_itl | np.isnan(a["itl"]))
    if not feasible.any():
        return None
    ok = sla_met(a["ttft"], a["itl"], setup.config.ttft_ms, setup.config.itl_ms)
    return float((ok & feasible).sum() / feasible.sum())


def window_attainment(result: RunResult, setup: FleetSetup, window_s: float, n_windows: int):
    """(TTFT attainment, ITL attainment) per arrival window over the requests that could
    meet each target (:func:`feasible_requests`); None where there were none."""
    a = result.requests.arrays()
    cfg = setup.config
    idx = np.minimum((a["arrival"] // window_s).astype(np.int64), n_windows - 1)
    can_ttft, can_itl = feasible_requests(result, setup)
    itl = a["itl"]
    can_itl &= ~np.isnan(itl)
    ttft_ok = (a["ttft"] * 1000.0 <= cfg.ttft_ms) & can_ttft
    itl_ok = (itl * 1000.0 <= cfg.itl_ms) & can_itl
    n_t = np.bincount(idx, weights=can_ttft, minlength=n_windows)
    n_i = np.bincount(idx, weights=can_itl, minlength=n_windows)
    t_ok = np.bincount(idx, weights=ttft_ok, minlength=n_windows)
    i_ok = np.bincount(idx, weights=itl_ok, minlength=n_windows)
    return [
        (t_ok[j] / n_t[j] if n_t[j] else None, i_ok[j] / n_i[j] if n_i[j] else None)
        for j in range(n_windows)
    ]


def run_oracle(
    workload: Workload, setup: FleetSetup, sizing: Sizing, goal: float, rounds: int,
    progress: Callable[[str], None] | None = None, log: IO[bytes] | None = None,
    live: LiveRun | None = None,
) -> RunResult:
    """Refine the per-window needs by replay, then run the final oracle (the only one ``live``)."""
    lookahead = setup.startup().upper()
    window = sizing.window_s
    roles = setup.roles
    prompt_role = roles[0]
    decode_role = roles[-1]

    def replay(needs):
        result = run_policy(workload, setup, SchedulePolicy(needs, window, lookahead), "oracle")
        if progress is not None:
            progress(f"oracle round: attainment {result.summary.sla_attainment:.4f}")
        return window_attainment(result, setup, window, len(needs))

    needs, used = refine_needs(sizing.floor_needs, replay, prompt_role, decode_role, goal, rounds)
    sizing.needs = needs
    sizing.refine_rounds = used
    return run_policy(workload, setup, SchedulePolicy(needs, window, lookahead), "oracle", log=log,
                      live=live)


def run_static(
    workload: Workload, setup: FleetSetup, sizing: Sizing, how: str, log: IO[bytes] | None = None,
    live: LiveRun | None = None,
) -> RunResult:
    targets = static_targets(sizing.needs, how, [w.duration_s for w in sizing.traffic])
    return run_policy(workload, setup, StaticPolicy(targets, f"static-{how}"), f"static-{how}", targets,
                      log=log, live=live)
