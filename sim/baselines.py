"""Baselines: simple policies that bound what an autoscaler can achieve.

- **static-peak**: the fleet sized for the busiest window, all run long.
  Meets the SLA if anything does; the cost ceiling.
- **static-mean**: the fleet sized for the average window. Cheap, and it
  misses the SLA whenever traffic is above average.
- **oracle** (hindsight): in every window the fewest replicas that met the
  SLA in the replay, knowing the future. Workers are started ``startup``
  seconds before the window that needs them (the same startup time as every
  other policy) and drained as soon as no coming window needs them. It is
  the lower bound on GPU-hours an autoscaler could reach.

The oracle's per-window counts start from the capacity search on the true
engine and the traffic that actually came (:mod:`fleetplan.sim.sizing`),
which ignores queueing and so undershoots where traffic is bursty; each
refinement round replays the fleet and adds one replica of the role that
missed (TTFT: the prompt role; ITL: the decode role) in every window whose
attainment fell below the goal. The static baselines are sized from the
oracle's final counts (their maximum, their mean), so all three share one
notion of "enough".

None of these plan anything: they read a schedule computed before the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from fleetplan.sim.policy import PolicyView

BASELINES = ("static-peak", "static-mean", "oracle")


class StaticPolicy:
    """A fixed fleet; the runner starts it at these counts and it never changes."""

    needs_fpm = False

    def __init__(self, targets: Mapping[str, int], name: str = "static") -> None:
        self.targets = dict(targets)
        self.name = name
        self.interval_s = 60.0

    def initial(self) -> dict[str, int]:
        return dict(self.targets)

    def decide(self, view: PolicyView) -> None:
        return None


class SchedulePolicy:
    """Follow per-window targets, starting workers ``lookahead_s`` ahead of need."""

    needs_fpm = False

    def __init__(
        self, needs: list[dict[str, int]], window_s: float, lookahead_s: float, name: str = "oracle"
    ) -> None:
        self.needs = needs
        self.window_s = window_s
        self.lookahead_s = lookahead_s
        self.name = name
        self.interval_s = min(5.0, window_s)
        self._last: dict[str, int] | None = None

    def target_at(self, t: float) -> dict[str, int]:
        """What must be up or starting at ``t``: the max over the windows from the current one
        to every window a worker started at the next tick would be late for.

        The policy decides every ``interval_s``, so a worker whose window starts before
        ``t + interval + lookahead`` starts now, at most one tick early: waiting for the
        next tick, a startup off the tick grid (117 s, a distribution's 99th percentile)
        made it ready seconds into the window that needed it. On the grid (120 s, 60-s
        windows, 5-s ticks) that is the window starting at ``t + lookahead``.
        """
        n = len(self.needs)
        first = min(int(t // self.window_s), n - 1)
        last = min(math.ceil((t + self.interval_s + self.lookahead_s) / self.window_s) - 1, n - 1)
        return most_needed(self.needs[first:max(first, last) + 1])

    def initial(self) -> dict[str, int]:
        return self.target_at(0.0)

    def decide(self, view: PolicyView) -> dict[str, int] | None:
        target = self.target_at(view.time)
        if target == dict(view.expected):
            return None
        return target


def most_needed(needs: list[dict[str, int]]) -> dict[str, int]:
    """Each role's largest count over ``needs``."""
    out: dict[str, int] = {}
    for need in needs:
        for role, v in need.items():
            out[role] = max(out.get(role, 0), v)
    return out


def needs_before(needs: list[dict[str, int]], window_s: float, end_s: float) -> dict[str, int]:
    """Each role's largest count over the windows that start before ``end_s``."""
    last = max(1, math.ceil(end_s / window_s))
    return most_needed(needs[:last])


def static_targets(needs: list[dict[str, int]], how: str, seconds: list[float] | None = None) -> dict[str, int]:
    """Peak (max) or mean (ceil of the time average) of per-window needs.

    ``seconds``: how long each window lasts (``WindowTraffic.duration_s``; full windows
    when not given). The last window of a workload ends with it, and counted as a full
    one a short tail's need weighed as much as a whole window's.
    """
    roles = list(needs[0]) if needs else []
    if how == "peak":
        return {r: max(n[r] for n in needs) for r in roles}
    weights = [1.0] * len(needs) if seconds is None else list(seconds)
    total = sum(weights)
    return {
        r: max(1, math.ceil(sum(n[r] * w for n, w in zip(needs, weights, strict=True)) / total - 1e-9))
        for r in roles
    }


def refine_needs(
    needs: list[dict[str, int]],
    attainment_by_window: Callable[[list[dict[str, int]]], list[tuple[float | None, float | None]]],
    prompt_role: str,
    decode_role: str,
    goal: float,
    rounds: int,
) -> tuple[list[dict[str, int]], int]:
    """Raise per-window counts where a replay missed the goal.

    ``attainment_by_window(needs)`` replays the oracle with ``needs`` and
    returns (TTFT attainment, ITL attainment) per window (None when no
    request arrived). Returns the refined needs and the rounds used.
    """
    current = [dict(n) for n in needs]
    for r in range(rounds):
        misses = attainment_by_window(current)
        changed = False
        for j, (ttft_ok, itl_ok) in enumerate(misses):
            short = set()
            if ttft_ok is not None and ttft_ok < goal:
                short.add(prompt_role)
            if itl_ok is not None and itl_ok < goal:
                short.add(decode_role)  # the same role in agg mode: one more engine
            for role in short:
                current[j][role] += 1
            changed = changed or bool(short)
        if not changed:
            return current, r
    return current, rounds
