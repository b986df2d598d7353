"""bench/forecast_clients.py: the parts it forecasts add up to the aggregate it is compared with.

docs/forecasting.md reports the bottom-up loss as a ratio to the
aggregate's, so the split must lose nothing (the parts sum to the curve
in every window) and a split into one part must score exactly as the
aggregate does.
"""

from __future__ import annotations

import math

import pytest

from bench.forecast_clients import PER_DAY, SPLITS, parts_of, score, summed_count
from fleetplan.models.forecast import TrafficObservation

WEEK = 7 * PER_DAY


def _counts() -> dict[str, list[float]]:
    """Three clients over a week: a steady one, a daily one and one that comes and goes."""
    return {
        "steady": [100.0 + (i % 5) for i in range(WEEK)],
        "daily": [50.0 + 40.0 * math.sin(2 * math.pi * i / PER_DAY) for i in range(WEEK)],
        "bursty": [300.0 if i % 37 < 3 else 0.0 for i in range(WEEK)],
    }


def _windows(counts: dict[str, list[float]]) -> list[TrafficObservation]:
    return [TrafficObservation(600.0, math.fsum(c[i] for c in counts.values()), 900.0, 200.0, start_s=600.0 * i)
            for i in range(WEEK)]


@pytest.mark.parametrize("top", [0, 1, 2])
def test_the_parts_sum_to_the_aggregate_in_every_window(top):
    counts = _counts()
    parts = parts_of(counts, top, SPLITS["dev"][0])
    assert len(parts) == (3 if top == 0 else top + 1)
    for i in range(WEEK):
        assert math.fsum(p[i] for p in parts) == pytest.approx(math.fsum(c[i] for c in counts.values()), rel=1e-12)


def test_the_busiest_clients_of_the_warm_up_are_forecast_alone():
    parts = parts_of(_counts(), 1, SPLITS["dev"][0])
    assert parts[0] == _counts()["steady"]  # 100-104 a window against the daily's 50 and the bursty's 24


def test_one_part_scores_as_the_aggregate():
    counts = {"only": [80.0 + 30.0 * math.sin(i / 9.0) + (i % 7) for i in range(WEEK)]}
    whole, summed, parts, _ = score(_windows(counts), counts, "constant", 0, "dev")
    assert parts == 1
    assert summed == whole > 0.0


def test_the_sum_is_idle_where_the_aggregate_forecasts_none():
    assert summed_count(0.0, [70_758.0, 0.0]) == 0.0  # m-mid's recording gap, its top client's forecast
    assert summed_count(12.0, [5.0, 6.5]) == 11.5
