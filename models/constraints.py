"""Constraints every target passes through: replica bounds and the GPU budget.

The budget guard preserves direction (Dynamo 1.6.1, fixing its issue
#12428): each role of a fleet inside the band and its replica bounds ends
between its current count and its proposal, so a guard can slow a move
down but never reverse it, and an opposing rebalance (one role up, the
other down) moves both legs or neither. The budget is never exceeded: at
the ceiling an upward proposal holds.

``max_gpu_budget`` and each role's replica ceiling are hard limits; the floor
budget (``min_gpu_budget``) and the role minimums are preferences that yield
to them: no hold keeps a fleet that the budget or a ceiling (lowered at run
time) forbids, and no held-back leg is held past them. A role below its
minimum is brought up to it from the other roles (Dynamo's endpoint
recovery) when the budget has no room left for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetplan.schemas.events import Role


def clamp_to_bounds(
    proposed: Mapping[Role, int],
    minimums: Mapping[Role, int],
    maximums: Mapping[Role, int | None],
) -> tuple[dict[Role, int], str | None]:
    """Clamp each role into [min, max]; say which side bound, if any."""
    out: dict[Role, int] = {}
    reason = None
    for role, value in proposed.items():
        lo = minimums.get(role, 0)
        hi = maximums.get(role)
        if value < lo:
            value, reason = lo, "reconcile_clamped_to_floor"
        if hi is not None and value > hi:
            value, reason = hi, "reconcile_clamped_to_ceiling"
        out[role] = value
    return out, reason


def engine_gpus(config, workers: Mapping, profile_gpus: int | None = None) -> dict[Role, int]:
    """GPUs an engine of each of ``config``'s roles costs: the config's, else the largest its
    workers report (a budget priced at the smallest could be overrun by the next engine started),
    else the profile's engine (``engine_gpus``), else 1.

    An engine known only from its FPMs reports no GPUs (the live stack writes no inventory),
    so it is priced as the profile's: priced at 1, a TP2 fleet ran at twice ``max_gpu_budget``.
    The tick fits the budget at these prices, and a ``set_config`` is checked at them
    (models/apply.py).
    """
    out: dict[Role, int] = {}
    for role in config.roles:
        configured = config.gpus_per_engine(role)
        if configured is not None:
            out[role] = configured
            continue
        seen = [w.gpus for w in workers.values() if w.role == role and not w.discovered]
        out[role] = max(seen) if seen else profile_gpus or 1
    return out


def gpu_total(counts: Mapping[Role, int], gpus: Mapping[Role, int]) -> int:
    return sum(n * gpus[r] for r, n in counts.items())


def _shrink_to_fit(
    counts: dict[Role, int], gpus: Mapping[Role, int], budget: int, floors: Mapping[Role, int]
) -> dict[Role, int]:
    """Remove replicas, largest GPU user first, until the budget holds.

    Floors are kept while possible; the budget wins over floors because a
    budget is a hard limit and a floor is a preference.
    """
    out = dict(counts)
    for respect_floors in (True, False):
        while gpu_total(out, gpus) > budget:
            candidates = [
                r for r in sorted(out)
                if out[r] > (floors.get(r, 0) if respect_floors else 0)
            ]
            if not candidates:
                break
            role = max(candidates, key=lambda r: (out[r] * gpus[r], r))
            out[role] -= 1
    return out


def _grow_to_fit(
    counts: dict[Role, int], gpus: Mapping[Role, int], budget: int,
    ceiling: int, maximums: Mapping[Role, int | None],
) -> dict[Role, int]:
    """Add replicas, smallest GPU user first, until the floor budget holds."""
    out = dict(counts)
    while gpu_total(out, gpus) < budget:
        candidates = [
            r for r in sorted(out)
            if (maximums.get(r) is None or out[r] < maximums[r])
            and (ceiling < 0 or gpu_total(out, gpus) + gpus[r] <= ceiling)
        ]
        if not candidates:
            break
        role = min(candidates, key=lambda r: (out[r] * gpus[r], r))
        out[role] += 1
    return out


def _raise_toward(
    fitted: dict[Role, int], target: Mapping[Role, int], up: list[Role], gpus: Mapping[Role, int],
    ceiling: int, enough: int | None = None,
) -> dict[Role, int]:
    """Step the ``up`` roles toward ``target`` one replica at a time, in turn, under ``ceiling``
    (negative: none), stopping once ``enough`` GPUs are used when it is given.

    With ``target`` the current counts and ``up`` the roles proposed to go down, this shortens
    downward moves: the one change a floor budget can make without reversing anything.
    """
    def full() -> bool:
        return enough is not None and gpu_total(fitted, gpus) >= enough

    progress = True
    while progress and not full():
        progress = False
        for role in up:
            if full():
                break
            if fitted[role] < target[role] and (ceiling < 0 or gpu_total(fitted, gpus) + gpus[role] <= ceiling):
                fitted[role] += 1
                progress = True
    return fitted


def _held(current: Mapping[Role, int], maximums: Mapping[Role, int | None]) -> dict[Role, int]:
    """The current fleet with each role cut to its replica ceiling: the most a hold may keep.

    A ceiling lowered at run time leaves a role above it; holding it there would keep it above
    its ceiling for good, so every hold and every shortened downward leg stops at the ceiling.
    """
    return {r: current[r] if maximums.get(r) is None else min(current[r], maximums[r]) for r in current}


def _shorten_downward(
    fitted: dict[Role, int], current: Mapping[Role, int], target: Mapping[Role, int],
    gpus: Mapping[Role, int], max_budget: int, min_budget: int,
    maximums: Mapping[Role, int | None] | None = None, floors: Mapping[Role, int] | None = None,
) -> dict[Role, int]:
    """Shorten the downward legs until the floor budget holds; hold the current fleet when they
    cannot reach it under the ceiling.

    An opposing rebalance in a narrow band can leave no step that lands inside it (one GPU
    short, the next replica two GPUs over): the upward leg then waits with the downward one. A
    role's replica ceiling (``maximums``) wins over the floor budget: a fleet above it (a ceiling
    lowered at run time) still comes down to it (``_held``), as a config whose floor budget the
    ceilings cannot hold would otherwise keep a role above its ceiling for good.

    Only a fleet inside the band with every role at its minimum (``floors``) is held: the floor
    budget is a preference, and holding a fleet over a ``max_budget`` lowered at run time, under
    the floor once cut to its ceilings, or short of a role's minimum would keep it wrong for good.
    The shortened fleet, which is under the max budget, then grows toward the floor budget as a
    fleet below the band does, taking at once the move the next tick would (until 2026-12-05 such
    a fleet was held, every tick, over the max budget or with a role short of its minimum).
    """
    maximums = maximums or {}
    floors = floors or {}
    held = _held(current, maximums)
    down = sorted(r for r in target if target[r] < held[r])
    shortened = _raise_toward(dict(fitted), held, down, gpus, max_budget, enough=min_budget)  # fitted may be target
    if gpu_total(shortened, gpus) >= min_budget:
        return shortened
    held_gpus = gpu_total(held, gpus)
    in_band = min_budget <= held_gpus and (max_budget < 0 or held_gpus <= max_budget)
    if in_band and all(held[r] >= floors.get(r, 0) for r in held):
        # no step lands on the floor budget exactly: one engine short of it is Dynamo's band too
        loose = min_budget - floor_tolerance(current, target, gpus)
        if gpu_total(shortened, gpus) >= loose:
            return shortened
        return held
    return _grow_to_fit(shortened, gpus, min_budget, max_budget, maximums)


def floor_tolerance(current: Mapping[Role, int], proposed: Mapping[Role, int], gpus: Mapping[Role, int]) -> int:
    """How far below ``min_gpu_budget`` a move that cannot land on it may end: one engine of
    the largest role that moves.

    Dynamo's band is ``[min_gpu_budget - tol, max_gpu_budget]`` with this ``tol``
    (``core/budget.py``), because with engines of different sizes an exact total is often out
    of reach. fleetplan keeps the floor exact wherever a step lands on it, and takes the
    tolerance only where none does: a fleet pinned at band [8, 8] of 1-GPU prefill and 2-GPU
    decode engines, P2/D3 proposed P3/D2 (7 GPUs), was held there every tick until 2026-12-05.
    """
    return max((gpus[r] for r in proposed if proposed[r] != current.get(r, 0)), default=0)


def fit_gpu_budget(
    current: Mapping[Role, int],
    proposed: Mapping[Role, int],
    gpus: Mapping[Role, int],
    max_budget: int,
    min_budget: int = -1,
    floors: Mapping[Role, int] | None = None,
    maximums: Mapping[Role, int | None] | None = None,
) -> tuple[dict[Role, int], str | None]:
    """Fit ``proposed`` into the GPU band [min_budget, max_budget].

    A negative budget disables that side. Returns the targets and a reason
    code when the budget changed anything: ``gpu_budget_guard_hold`` when a
    move was held or slowed, ``gpu_budget_reconcile`` when the current state
    itself was outside the band and had to be brought back.
    """
    floors = floors or {}
    maximums = maximums or {}
    target = dict(proposed)
    if max_budget >= 0 and gpu_total(target, gpus) > max_budget:
        up = sorted(r for r in target if target[r] > current[r])
        if gpu_total(current, gpus) > max_budget:
            start = {r: min(current[r], target[r]) for r in target}
            fitted = _shrink_to_fit(start, gpus, max_budget, floors)
            # what shrinking freed goes to the upward legs (a role below its floor)
            return _raise_toward(fitted, target, up, gpus, max_budget), "gpu_budget_reconcile"
        if any(current[r] < floors.get(r, 0) for r in target):
            # endpoint recovery (Dynamo's): a role below its minimum takes its engines from the
            # roles above theirs. Held instead, a role at 0 stayed there (no request served) as
            # long as the other role's proposal filled the budget
            return _shrink_to_fit(target, gpus, max_budget, floors), "gpu_budget_reconcile"
        # Downward legs take their full move; upward legs get what is left.
        fitted = _raise_toward({r: min(current[r], target[r]) for r in target}, target, up, gpus, max_budget)
        moved_up = any(fitted[r] > current[r] for r in up)
        moved_down = any(target[r] < current[r] for r in target)
        if up and moved_down and not moved_up:
            # an opposing rebalance whose upward leg cannot move: hold both legs (at their ceilings)
            return _held(current, maximums), "gpu_budget_guard_hold"
        if min_budget >= 0 and gpu_total(fitted, gpus) < min_budget <= gpu_total(current, gpus):
            # the full downward legs left too little: shorten them, never below the floor budget
            fitted = _shorten_downward(fitted, current, target, gpus, max_budget, min_budget, maximums,
                                       floors)
        return fitted, "gpu_budget_guard_hold"
    if min_budget >= 0 and gpu_total(target, gpus) < min_budget:
        if gpu_total(current, gpus) >= min_budget:
            # inside the band: shorten the downward legs to the floor budget; no role that was
            # not proposed to move is moved. Above it the fleet is brought back (_shorten_downward)
            over = 0 <= max_budget < gpu_total(current, gpus)
            fitted = _shorten_downward(target, current, target, gpus, max_budget, min_budget, maximums, floors)
            if fitted == target:  # the whole move, one engine under the floor (floor_tolerance)
                return fitted, None
            return fitted, "gpu_budget_reconcile" if over else "gpu_budget_guard_hold"
        if gpu_total(target, gpus) < gpu_total(current, gpus):
            # below the band the downward legs are held, but only up to the max budget and each
            # role's ceiling (until 2026-12-05 a rebalance was held whole, its upward leg on top)
            held = _held(current, maximums)
            target = _raise_toward(target, held, sorted(r for r in target if target[r] < held[r]),
                                   gpus, max_budget)
        grown = _grow_to_fit(target, gpus, min_budget, max_budget, maximums)
        return grown, "gpu_budget_reconcile"
    return target, None
