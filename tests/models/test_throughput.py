"""The throughput loop's arithmetic: engines for a rate, and the step cap (docs/planner.md)."""

from __future__ import annotations

from fleetplan.models.throughput import cap_change, replicas_for


def test_an_exact_multiple_of_the_engine_rate_needs_no_extra_engine():
    assert replicas_for(10.0, 5.0, 1) == 2
    # 1.1 / 0.1 is 11.000000000000002 in floats: still 11 engines, not 12
    assert replicas_for(1.1, 0.1, 1) == 11
    assert replicas_for(10.01, 5.0, 1) == 3
    assert replicas_for(0.0, 5.0, 2) == 2


def test_a_decision_moves_at_most_the_step_either_way():
    # max_throughput_scaling_replicas (8) from the current count
    assert cap_change(0, 20, 8, 0) == 12
    assert cap_change(30, 0, 8, 0) == 8
    assert cap_change(5, 3, 8, 0) == 5


def test_recovering_the_floor_may_exceed_the_step():
    # a fleet of 0 under a minimum of 10: one decision takes it to the floor (Dynamo 1.6.1)
    assert cap_change(10, 0, 8, 10) == 10
