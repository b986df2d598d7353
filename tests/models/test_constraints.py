"""Bounds and the GPU budget: never exceeded, never reversing a move."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.constraints import clamp_to_bounds, fit_gpu_budget, floor_tolerance, gpu_total
from fleetplan.models.fleet import Fleet
from fleetplan.models.planner import Planner
from fleetplan.sim.profiles import load_profile
from tests.models.factories import T0, decisions, ready, requests

G = {"prefill": 1, "decode": 2}


def test_bounds():
    out, reason = clamp_to_bounds({"prefill": 0, "decode": 9}, {"prefill": 1, "decode": 1}, {"prefill": None, "decode": 4})
    assert out == {"prefill": 1, "decode": 4}
    assert reason == "reconcile_clamped_to_ceiling"


def test_within_budget_unchanged():
    assert fit_gpu_budget({"prefill": 1, "decode": 1}, {"prefill": 2, "decode": 2}, G, 8) == (
        {"prefill": 2, "decode": 2}, None)


def test_upward_move_slowed_to_fit():
    out, reason = fit_gpu_budget({"prefill": 1, "decode": 1}, {"prefill": 5, "decode": 3}, G, 8)
    assert gpu_total(out, G) <= 8 and reason == "gpu_budget_guard_hold"
    assert out["prefill"] >= 1 and out["decode"] >= 1


def test_hold_at_ceiling():
    out, reason = fit_gpu_budget({"prefill": 2, "decode": 3}, {"prefill": 3, "decode": 3}, G, 8)
    assert out == {"prefill": 2, "decode": 3} and reason == "gpu_budget_guard_hold"


def test_opposing_rebalance_moves_both_or_neither():
    # decode wants down 3->2 (frees 2), prefill wants up 2->5 (needs 3): prefill can take 2 of them
    out, _ = fit_gpu_budget({"prefill": 2, "decode": 3}, {"prefill": 5, "decode": 2}, G, 8)
    assert out == {"prefill": 4, "decode": 2}
    # at the ceiling, prefill up by 3 but decode frees nothing usable -> neither moves
    out, reason = fit_gpu_budget({"prefill": 2, "decode": 3}, {"prefill": 3, "decode": 3}, G, 8)
    assert out == {"prefill": 2, "decode": 3}


def test_out_of_band_reconciles_down():
    out, reason = fit_gpu_budget({"prefill": 4, "decode": 4}, {"prefill": 4, "decode": 4}, G, 8,
                                 floors={"prefill": 1, "decode": 1})
    assert gpu_total(out, G) <= 8 and reason == "gpu_budget_reconcile"
    assert out["prefill"] >= 1 and out["decode"] >= 1


def test_reconciling_down_gives_the_freed_room_to_a_role_below_its_floor():
    # 0 prefill and 5 decode over a budget of 4 GPUs, floors of 2: decode comes down to
    # its target and what that frees raises prefill (each role stays between current and target)
    one = {"prefill": 1, "decode": 1}
    out, reason = fit_gpu_budget({"prefill": 0, "decode": 5}, {"prefill": 2, "decode": 3}, one, 4,
                                 floors={"prefill": 2, "decode": 2})
    assert out == {"prefill": 1, "decode": 3} and reason == "gpu_budget_reconcile"


def test_min_budget_grows():
    out, reason = fit_gpu_budget({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, G, 20, min_budget=7)
    assert gpu_total(out, G) >= 7 and reason == "gpu_budget_reconcile"


sizes = st.integers(0, 12)


@given(sizes, sizes, sizes, sizes, st.integers(0, 30))
def test_budget_never_exceeded_and_direction_kept(cp, cd, pp, pd, budget):
    current = {"prefill": cp, "decode": cd}
    proposed = {"prefill": pp, "decode": pd}
    out, _ = fit_gpu_budget(current, proposed, G, budget)
    assert gpu_total(out, G) <= budget
    if gpu_total(current, G) <= budget:
        for r in out:  # between current and proposal
            lo, hi = sorted((current[r], proposed[r]))
            assert lo <= out[r] <= hi


@given(sizes, sizes, sizes, sizes, st.integers(0, 40), st.integers(0, 40))
def test_a_fleet_inside_the_band_stays_inside_and_keeps_direction(cp, cd, pp, pd, low, width):
    """Inside [min, max] a fleet stays inside it, each role between its current count and its
    proposal: the floor budget shortens downward moves, never grows a role nobody moved."""
    high = low + width
    current = {"prefill": cp, "decode": cd}
    proposed = {"prefill": pp, "decode": pd}
    if not low <= gpu_total(current, G) <= high:
        return
    out, _ = fit_gpu_budget(current, proposed, G, high, min_budget=low)
    assert low - floor_tolerance(current, proposed, G) <= gpu_total(out, G) <= high
    for r in out:
        lo, hi = sorted((current[r], proposed[r]))
        assert lo <= out[r] <= hi, (current, proposed, out)


def test_the_floor_budget_shortens_a_downward_leg_instead_of_growing_another_role():
    # the reviewer's case: one GPU each, band [4, 8], prefill proposed down from 3 to 1
    one = {"prefill": 1, "decode": 1}
    out, reason = fit_gpu_budget({"prefill": 3, "decode": 1}, {"prefill": 1, "decode": 1}, one, 8, min_budget=4)
    assert out == {"prefill": 3, "decode": 1} and reason == "gpu_budget_guard_hold"
    # and the ceiling branch: 2- and 4-GPU engines, band [11, 13], P4/D1 proposed to P1/D3
    two_four = {"prefill": 2, "decode": 4}
    out, _ = fit_gpu_budget({"prefill": 4, "decode": 1}, {"prefill": 1, "decode": 3}, two_four, 13, min_budget=11)
    assert out == {"prefill": 2, "decode": 2} and gpu_total(out, two_four) == 12


def test_a_rebalance_that_cannot_land_on_a_narrow_band_ends_one_engine_under_its_floor():
    # found by hypothesis in CI: decode (2 GPUs) down from 3, prefill (1 GPU) up from 0, band
    # [6, 6]; shortening decode reaches 5 and the next replica would make 7. Until 2026-12-05
    # both legs waited; Dynamo's band is [min - tol, max], tol one engine of the largest role
    # that moves (2 here), so decode stops at 2 engines and prefill gets its one
    out, reason = fit_gpu_budget({"prefill": 0, "decode": 3}, {"prefill": 1, "decode": 0}, G, 6, min_budget=6)
    assert out == {"prefill": 1, "decode": 2} and reason == "gpu_budget_guard_hold"


def test_a_fleet_pinned_at_its_budget_with_engines_of_two_sizes_can_rebalance():
    """Band [8, 8], 1-GPU prefill and 2-GPU decode engines: P2/D3 proposed P3/D2 (7 GPUs) has no
    step that lands on 8 under the ceiling, and was held every tick (until 2026-12-05), so the
    load loop, which moves each role by one, could never give prefill another engine."""
    out, reason = fit_gpu_budget({"prefill": 2, "decode": 3}, {"prefill": 3, "decode": 2}, G, 8, min_budget=8)
    assert out == {"prefill": 3, "decode": 2} and reason is None  # the whole move: nothing held
    # a step that lands on the floor exactly is still taken: band [4, 8], one GPU each
    one = {"prefill": 1, "decode": 1}
    out, reason = fit_gpu_budget({"prefill": 3, "decode": 1}, {"prefill": 1, "decode": 1}, one, 8, min_budget=4)
    assert out == {"prefill": 3, "decode": 1} and reason == "gpu_budget_guard_hold"


# --- the max budget and the ceilings are hard; the floor budget yields (2026-12-05) ---------------


def test_a_rebalance_below_the_floor_budget_stops_at_the_max_budget():
    """b3: band [8, 9], 1-GPU engines, 6 prefill + 1 decode (7, below the band), traffic asks
    for 1 prefill and 4 decode. Decode's move is kept whole and prefill's downward leg is held
    only as far as the max budget lets it: 9 GPUs, not 6 + 4 = 10."""
    one = {"prefill": 1, "decode": 1}
    out, reason = fit_gpu_budget({"prefill": 6, "decode": 1}, {"prefill": 1, "decode": 4}, one, 9,
                                 min_budget=8, floors={"prefill": 1, "decode": 1})
    assert out == {"prefill": 5, "decode": 4} and reason == "gpu_budget_reconcile"


def test_the_planner_under_a_floor_budget_never_decides_past_the_max_budget():
    """b3 end to end: the decision used to be P6/D4, 10 GPUs over a max_gpu_budget of 9."""
    cfg = config_from_dict({"load_predictor": "constant", **REFERENCE_SIZING,
                            "max_gpu_budget": 9, "min_gpu_budget": 8})
    fleet = Fleet(Planner(cfg, profile=load_profile("h200-llama3.1-8b")))
    events = [*(ready(f"p{i}", "prefill") for i in range(6)), ready("d0", "decode"),
              *requests(30, T0 + 1, T0 + 185, isl=200, osl=1500)]
    made = decisions(fleet.run(events))
    assert made and all(sum(d.targets.values()) <= 9 for d in made)
    assert made[0].targets == {"prefill": 5, "decode": 4}


def test_below_the_floor_budget_a_role_is_held_no_higher_than_its_ceiling():
    """b10: prefill_max_endpoint 4 with 6 prefill running, band [8, 12]: the clamped proposal
    P4/D2 is 6 GPUs, under the floor; prefill is held at its ceiling (not at 6) and decode grows."""
    one = {"prefill": 1, "decode": 1}
    ceilings = {"prefill": 4, "decode": None}
    proposed, _ = clamp_to_bounds({"prefill": 6, "decode": 2}, {"prefill": 1, "decode": 1}, ceilings)
    out, reason = fit_gpu_budget({"prefill": 6, "decode": 1}, proposed, one, 12, min_budget=8,
                                 floors={"prefill": 1, "decode": 1}, maximums=ceilings)
    assert out == {"prefill": 4, "decode": 4} and reason == "gpu_budget_reconcile"


def test_a_fleet_over_a_lowered_max_budget_is_not_held_there():
    """b7: 2- and 4-GPU engines, band [19, 21], P1/D6 (26 GPUs, max_gpu_budget lowered) with a
    proposal of P1/D1: holding the fleet kept it at 26 every tick. Decode's downward leg is
    shortened under the max budget (P1/D4, 18) and the fleet grows into the band."""
    two_four = {"prefill": 2, "decode": 4}
    out, reason = fit_gpu_budget({"prefill": 1, "decode": 6}, {"prefill": 1, "decode": 1}, two_four, 21,
                                 min_budget=19, floors={"prefill": 1, "decode": 1})
    assert out == {"prefill": 2, "decode": 4} and reason == "gpu_budget_reconcile"
    assert gpu_total(out, two_four) == 20


def test_an_opposing_rebalance_held_at_the_max_budget_holds_no_role_above_its_ceiling():
    """1-GPU prefill, 4-GPU decode, max budget 7: P5/D0 with prefill's ceiling lowered to 4 is
    proposed P4/D1 (8 GPUs); decode cannot come up, so both legs hold, but prefill at its
    ceiling of 4, not at the 5 it held before."""
    out, reason = fit_gpu_budget({"prefill": 5, "decode": 0}, {"prefill": 4, "decode": 1},
                                 {"prefill": 1, "decode": 4}, 7, maximums={"prefill": 4, "decode": None})
    assert out == {"prefill": 4, "decode": 0} and reason == "gpu_budget_guard_hold"


def test_a_role_short_of_its_minimum_is_not_held_there_for_the_floor_budget():
    """Band [7, 9], 4-GPU prefill, 1-GPU decode, P2/D0 (8) proposed P1/D2 (6): shortening
    prefill's leg cannot land in the band (10 GPUs), and holding P2/D0 kept decode at 0, below
    its minimum of 1, every tick. The floor budget yields: P1/D2 grows to P1/D3 (7)."""
    out, reason = fit_gpu_budget({"prefill": 2, "decode": 0}, {"prefill": 1, "decode": 2},
                                 {"prefill": 4, "decode": 1}, 9, min_budget=7, floors={"prefill": 1, "decode": 1})
    assert out == {"prefill": 1, "decode": 3} and reason == "gpu_budget_guard_hold"


engine_gpus = st.integers(1, 4)
counts = st.integers(0, 8)
ceilings = st.one_of(st.none(), st.integers(0, 6))


@settings(max_examples=3000, deadline=None)
@given(engine_gpus, engine_gpus, counts, counts, counts, counts, st.integers(-1, 30), st.integers(-1, 30),
       st.integers(0, 3), st.integers(0, 3), ceilings, ceilings)
def test_the_max_budget_and_the_ceilings_are_never_exceeded(gp, gd, cp, cd, pp, pd, low, high,
                                                            min_p, min_d, ceil_p, ceil_d):
    """Whatever the current fleet (over the band, under it, above a lowered ceiling, below a
    raised minimum): the result is under the max budget and every role's ceiling; where the
    minimums fit the max budget, a role ends below its minimum only when the budget has no room
    for one more of its engines (the budget wins over the floors, docs/planner.md); the same
    input, in either role order, gives the same output."""
    gpus = {"prefill": gp, "decode": gd}
    if high >= 0 and 0 <= high < low:
        low, high = high, low  # the config refuses min_gpu_budget > max_gpu_budget
    minimums = {"prefill": min_p, "decode": min_d}
    # a config's minimum is at most its ceiling, and a ceiling is never 0 (models/config.py)
    maximums = {r: None if c is None else max(c, minimums[r], 1)
                for r, c in (("prefill", ceil_p), ("decode", ceil_d))}
    current = {"prefill": cp, "decode": cd}
    proposed, _ = clamp_to_bounds({"prefill": pp, "decode": pd}, minimums, maximums)  # as the planner does

    out, reason = fit_gpu_budget(current, proposed, gpus, high, min_budget=low,
                                 floors=minimums, maximums=maximums)

    total = gpu_total(out, gpus)
    if high >= 0:
        assert total <= high, (current, proposed, out, reason)
    minimums_fit = high < 0 or gpu_total(minimums, gpus) <= high
    for r, n in out.items():
        assert n >= 0
        assert maximums[r] is None or n <= maximums[r], (current, proposed, out, reason)
        if n < minimums[r] and minimums_fit:
            assert 0 <= high < total + gpus[r], (current, proposed, out, reason)
    within = (all(minimums[r] <= current[r] and (maximums[r] is None or current[r] <= maximums[r])
                  for r in current)
              and (low < 0 or gpu_total(current, gpus) >= low) and (high < 0 or gpu_total(current, gpus) <= high))
    if within:  # a fleet inside every limit stays inside the band (Dynamo's: one engine of the
        # largest role that moves under the floor) and keeps each role's direction
        assert low - floor_tolerance(current, proposed, gpus) <= total and (high < 0 or total <= high), (
            current, proposed, out, reason)
        for r in out:
            assert min(current[r], proposed[r]) <= out[r] <= max(current[r], proposed[r]), (current, proposed, out)
    again = fit_gpu_budget(dict(reversed(current.items())), dict(reversed(proposed.items())), gpus,
                           high, min_budget=low, floors=minimums, maximums=maximums)
    assert again == (out, reason)


def test_bounds_name_no_side_when_nothing_was_clamped():
    # a role at its floor or its ceiling was not clamped: the tick keeps its load reason
    out, reason = clamp_to_bounds({"prefill": 1, "decode": 4}, {"prefill": 1, "decode": 1}, {"prefill": None, "decode": 4})
    assert out == {"prefill": 1, "decode": 4} and reason is None


def test_over_the_budget_the_largest_gpu_user_gives_up_replicas_first():
    # 4 prefill (1 GPU) + 4 decode (2 GPUs) = 12 over a budget of 10: decode uses 8 GPUs, prefill
    # 4, so one decode engine goes (10), not two prefill engines
    out, reason = fit_gpu_budget({"prefill": 4, "decode": 4}, {"prefill": 4, "decode": 4}, G, 10,
                                 floors={"prefill": 1, "decode": 1})
    assert out == {"prefill": 4, "decode": 3} and reason == "gpu_budget_reconcile"


def test_a_fleet_below_the_band_grows_to_a_max_budget_it_can_reach():
    # band [4, 4] of 1-GPU engines, the fleet at 2: it grows to 4, the last engine landing on the max
    one = {"prefill": 1, "decode": 1}
    out, reason = fit_gpu_budget({"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}, one, 4, min_budget=4)
    assert gpu_total(out, one) == 4 and reason == "gpu_budget_reconcile"


def test_engines_known_only_from_their_fpms_cost_the_profiles_gpus_in_the_budget():
    """The live stack sends no inventory, so engines are known from their FPMs. Of a TP2 profile
    (the bundled 70B's default config) each costs 2 GPUs; until 2026-12-05 the budget counted 1,
    and a max_gpu_budget of 8 let 20 rps grow the fleet to P5/D3, 16 GPUs."""
    from tests.models.factories import fpm

    profile = load_profile("h100-llama3.3-70b")
    assert profile.engine_gpus == 2
    cfg = config_from_dict({"load_predictor": "constant", **REFERENCE_SIZING, "max_gpu_budget": 8})
    fleet = Fleet(Planner(cfg, profile=profile))
    events = [fpm("p0", "prefill", T0 + 0.5, wall=0), fpm("d0", "decode", T0 + 0.5, wall=0),
              *requests(20, T0 + 1, T0 + 185)]
    made = decisions(fleet.run(events))
    assert made and all(2 * sum(d.targets.values()) <= 8 for d in made)


def test_a_budget_that_cannot_hold_one_engine_of_the_profiles_each_role_is_refused_at_start():
    """Unset ``*_engine_num_gpu``, an engine is the profile's (TP8 here: 8 GPUs), so the default
    budget of 8 GPUs leaves decode no engine; refused when the planner is built, as simulate does."""
    import pytest

    from fleetplan.bootstrap import build_planner
    from fleetplan.models.config import ConfigError

    cfg = config_from_dict({"profile_tp": 8})
    with pytest.raises((ConfigError, ValueError), match="max_gpu_budget"):
        build_planner(cfg, profile="h100-llama3.3-70b")


def test_a_role_below_its_minimum_takes_a_donor_when_the_budget_is_full():
    """Dynamo's endpoint recovery: 0 prefill and 8 decode engines of 1 GPU fill a budget of 8, and
    prefill's minimum is 1. The clamped proposal P1/D8 is 9 GPUs; the fit held P0/D8, so prefill
    stayed at 0 (no request served) for as long as decode's proposal filled the budget. The floor
    now takes its engine from the role above its minimum: P1/D7 (2-GPU prefill: P1/D6), reconciled."""
    one = {"prefill": 1, "decode": 1}
    floors = {"prefill": 1, "decode": 1}
    out, reason = fit_gpu_budget({"prefill": 0, "decode": 8}, {"prefill": 1, "decode": 8}, one, 8, floors=floors)
    assert out == {"prefill": 1, "decode": 7} and reason == "gpu_budget_reconcile"
    out, reason = fit_gpu_budget({"prefill": 0, "decode": 8}, {"prefill": 1, "decode": 7},
                                 {"prefill": 2, "decode": 1}, 8, floors=floors)
    assert out == {"prefill": 1, "decode": 6} and reason == "gpu_budget_reconcile"


def test_the_planner_brings_a_role_at_zero_back_to_its_minimum_under_a_full_budget():
    """End to end: the fleet came up with its 8 decode engines and no prefill engine (max_gpu_budget
    8); no decision was ever made and the deployment served nothing."""
    from fleetplan.schemas import ClockEvent

    cfg = config_from_dict({"load_predictor": "constant", **REFERENCE_SIZING, "max_gpu_budget": 8})
    fleet = Fleet(Planner(cfg, profile=load_profile("h200-llama3.1-8b")))
    made = decisions(fleet.run([*(ready(f"d{i}", "decode") for i in range(8)),
                                ClockEvent(deployment="d", time=T0 + 200)]))
    assert made and made[0].targets == {"prefill": 1, "decode": 7}
