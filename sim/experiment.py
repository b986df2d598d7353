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

from fleetplan.sim.baselines import SchedulePolicy, StaticPolicy, refine_needs, static_targets
from fleetplan.sim.runner import ClosedLoop, FleetSetup, PlannerController, PolicyController, RunResult
from fleetplan.sim.sizing import EngineCapacity, window_needs, window_traffic
from fleetplan.sim.workload import Workload


@dataclass
class Sizing:
    """Per-window replica needs of the workload (the baselines' schedule)."""

    window_s: float
    capacity_needs: list[dict[str, int]]
    needs: list[dict[str, int]]
    traffic: list
    refine_rounds: int = 0
    engine_rps: dict[str, float] = field(default_factory=dict)


def size_workload(workload: Workload, setup: FleetSetup) -> Sizing:
    cfg = setup.config
    window = setup.options.window_s
    traffic = window_traffic(workload, window)
    capacity = EngineCapacity(setup.timing, setup.limits, cfg.ttft_ms, cfg.itl_ms)
    minimums = {r: max(cfg.min_endpoints(r), 1) for r in setup.roles}
    needs = window_needs(traffic, capacity, setup.roles, window, minimums)
    busy = [w for w in traffic if w.num_req]
    engine_rps = {}
    if busy:
        isl = sum(w.isl * w.num_req for w in busy) / sum(w.num_req for w in busy)
        osl = sum(w.osl * w.num_req for w in busy) / sum(w.num_req for w in busy)
        engine_rps = {r: capacity.rps(r, isl, osl) for r in setup.roles}
    return Sizing(window, needs, [dict(n) for n in needs], traffic, 0, engine_rps)


def initial_fleet(spec: str | Mapping[str, int], setup: FleetSetup, sizing: Sizing) -> dict[str, int]:
    """``warm``: sized for the traffic of the first startup period; ``min``: the
    config's minimums; or explicit counts."""
    if isinstance(spec, Mapping):
        return {r: int(spec.get(r, 1)) for r in setup.roles}
    if spec == "min":
        return {r: max(setup.config.min_endpoints(r), 0) for r in setup.roles}
    if spec == "warm":
        lookahead = setup.startup().upper()
        return SchedulePolicy(sizing.capacity_needs, sizing.window_s, lookahead).initial()
    raise ValueError(f"initial: expected warm, min or role=count pairs, got {spec!r}")


def run_planner(
    workload: Workload, setup: FleetSetup, planner, initial: Mapping[str, int],
    log: IO[bytes] | None = None, progress: Callable[[float], None] | None = None,
) -> RunResult:
    loop = ClosedLoop(workload, setup, PlannerController(planner), initial, log=log, progress=progress)
    return loop.run()


def run_policy(
    workload: Workload, setup: FleetSetup, policy, name: str, initial: Mapping[str, int] | None = None,
    log: IO[bytes] | None = None, progress: Callable[[float], None] | None = None,
) -> RunResult:
    controller = PolicyController(policy, name, setup.roles)
    start = controller.initial() if initial is None else initial
    if start is None:
        start = {r: 1 for r in setup.roles}
    return ClosedLoop(workload, setup, controller, start, log=log, progress=progress).run()


def window_attainment(result: RunResult, setup: FleetSetup, window_s: float, n_windows: int):
    """(TTFT attainment, ITL attainment) per arrival window; None where nothing arrived."""
    a = result.requests.arrays()
    cfg = setup.config
    idx = np.minimum((a["arrival"] // window_s).astype(np.int64), n_windows - 1)
    ttft_ok = a["ttft"] * 1000.0 <= cfg.ttft_ms
    itl = a["itl"]
    itl_ok = np.isnan(itl) | (itl * 1000.0 <= cfg.itl_ms)
    count = np.bincount(idx, minlength=n_windows)
    t_ok = np.bincount(idx, weights=ttft_ok, minlength=n_windows)
    i_ok = np.bincount(idx, weights=itl_ok, minlength=n_windows)
    return [
        (None, None) if count[j] == 0 else (t_ok[j] / count[j], i_ok[j] / count[j])
        for j in range(n_windows)
    ]


def run_oracle(
    workload: Workload, setup: FleetSetup, sizing: Sizing, goal: float, rounds: int,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Refine the per-window needs by replay, then run the final oracle."""
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

    needs, used = refine_needs(sizing.capacity_needs, replay, prompt_role, decode_role, goal, rounds)
    sizing.needs = needs
    sizing.refine_rounds = used
    return run_policy(workload, setup, SchedulePolicy(needs, window, lookahead), "oracle")


def run_static(workload: Workload, setup: FleetSetup, sizing: Sizing, how: str) -> RunResult:
    targets = static_targets(sizing.needs, how)
    return run_policy(workload, setup, StaticPolicy(targets, f"static-{how}"), f"static-{how}", targets)


def ceil_div(a: float, b: float) -> int:
    return math.ceil(a / b - 1e-9)
