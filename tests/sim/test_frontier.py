"""The verdict reading of bench/frontier.py: the rules docs/forecasting.md's tables follow."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.frontier import (
    TIE_COST,
    TIE_POINTS,
    attainment_at,
    by_draw,
    cost_of,
    pareto,
    pooled,
    read_runs,
    tally,
    verdict,
)
from fleetplan.sim import REVISION

VERDICTS = Path(__file__).parents[2] / "bench" / "results" / "verdicts"
RECORDED = sorted(VERDICTS.glob("*.json"))
# the ServeGen days (day 0) as simulator revision 2 measured them, with the default's ablation copies
# and +retune1h rows, and the warm days 4-6 (the default and the reference's sweep); the main files
# hold revision 5's rows since 2026-12-06
REVISION2 = sorted((VERDICTS / "revision2").glob("*.json"))
# the files that carry the default's ablation copies (-windowrate, -coverage, -calibrated); the
# warm days' file, run after them, holds the default and the reference's sweep only
ABLATED = [*(path for path in RECORDED if not path.name.startswith("servegen")),
           VERDICTS / "revision2" / "servegen-500-50.json"]
# every file as the variants measured before 2026-12-06's revision-5 ServeGen days were read with it
HISTORIC = [*ABLATED, VERDICTS / "revision2" / "servegen-warm-500-50.json"]
# the ServeGen file as simulator revision 1 measured it, its -coverage +retune1h rows included
# (revision 2's +retune1h rows are in revision2/)
REVISION1 = sorted((VERDICTS / "revision1").glob("*.json"))

# (GPU-hours, attainment, utilisation): a sweep from 0.9 down to 0.5
SWEEP = [(5.0, 0.95, 0.9), (5.5, 0.98, 0.8), (5.4, 0.97, 0.7), (6.0, 0.99, 0.6), (6.5, 0.99, 0.5)]


def test_pareto_drops_the_settings_another_beats_on_both():
    front = pareto([(g, a) for g, a, _ in SWEEP])
    assert front == [(5.0, 0.95), (5.4, 0.97), (5.5, 0.98), (6.0, 0.99)]


def test_attainment_is_read_between_settings_and_not_below_the_cheapest():
    front = pareto([(g, a) for g, a, _ in SWEEP])
    assert attainment_at(front, 5.75, swept=True) == pytest.approx(0.985)
    assert attainment_at(front, 4.9, swept=True) is None
    # past the dearest setting: its attainment only when the sweep reached its most headroom
    assert attainment_at(front, 7.0, swept=True) == 0.99
    assert attainment_at(front, 7.0, swept=False) is None


def test_the_cost_of_an_attainment_is_interpolated_and_none_out_of_reach():
    front = pareto([(g, a) for g, a, _ in SWEEP])
    assert cost_of(front, 0.985) == pytest.approx(5.75, abs=0.01)  # reached to 0.01 points
    assert cost_of(front, 0.90) == 5.0
    assert cost_of(front, 0.995) is None


@pytest.mark.parametrize(("default", "expected"), [
    ((5.75, 0.995), "won"),    # 1 point above the frontier at its spend, out of its reach
    ((5.75, 0.985), "tie"),    # on the frontier
    ((5.75, 0.9855), "tie"),   # within the 0.15-point band
    ((5.75, 0.980), "lost"),   # the reference reaches 98 % at 5.5, 4 % less
    ((6.5, 0.99), "lost"),     # the same attainment costs the reference 6.0
])
def test_verdicts(default, expected):
    result, readings = verdict(default, {"constant": SWEEP}, tie_points=0.15, tie_cost=0.03)
    assert result == expected
    assert set(readings) == {"constant"}


def test_one_predictor_that_beats_the_default_loses_the_row():
    better = [(g, min(1.0, a + 0.01), u) for g, a, u in SWEEP]
    result, _ = verdict((5.75, 0.988), {"constant": SWEEP, "kalman": better}, 0.15, 0.03)
    assert result == "lost"


def test_a_sweep_that_neither_spans_nor_reaches_the_default_is_unread():
    short = [(5.0, 0.95, 0.9), (5.5, 0.96, 0.8)]
    result, readings = verdict((6.5, 0.99), {"constant": short}, 0.15, 0.03)
    assert result == "unread"
    assert readings == {"constant": (None, None)}


def test_a_frontier_of_one_point_is_read_at_its_own_spend():
    """The other settings dominated and the sweep short of 0.5: at exactly that point's
    GPU-hours the reading is its attainment (until 2026-12-05 none, and the row a tie)."""
    runs = [(10.0, 0.99, 0.9), (11.0, 0.98, 0.8)]
    assert attainment_at(pareto([(g, a) for g, a, _ in runs]), 10.0, swept=False) == 0.99
    result, readings = verdict((10.0, 0.95), {"constant": runs}, 0.15, 0.03)
    assert result == "lost" and readings["constant"][0] == 0.99


@pytest.mark.parametrize("attainment", [0.90, 0.98, 0.5, 0.9985])
def test_a_gap_of_exactly_the_tie_points_is_even_whatever_its_last_bit(attainment):
    """0.15 points above or below the reference at its spend is a tie both ways (until
    2026-12-05, float rounding made 0.90 against 0.8985 won and 0.98 against 0.9815 lost)."""
    for delta in (0.0015, -0.0015):
        runs = [(10.0, attainment + delta, 0.9), (12.0, attainment + delta, 0.5)]
        result, _ = verdict((10.0, attainment), {"constant": runs}, 0.15, 0.03)
        assert result == "tie", (attainment, delta)


@pytest.mark.parametrize("gpu", [1.4, 1.13, 6.0, 485.35])
def test_exactly_the_tie_cost_fewer_gpu_hours_loses_whatever_its_last_bit(gpu):
    """The reference reaching the default's attainment on exactly 3 % fewer GPU-hours loses the
    row (docs/forecasting.md: "for 3 % fewer GPU-hours"), and just under 3 % is a tie; float
    rounding made 1.358 against 1.4 (1.4 × 0.97 = 1.3579999999999999) a tie."""
    for cut, expected in ((0.03, "lost"), (0.0299, "tie")):
        cheaper = round(gpu * (1.0 - cut), 10)
        runs = [(cheaper, 0.99, 0.9), (gpu * 1.2, 0.99, 0.5)]  # the dearer setting gains nothing
        result, readings = verdict((gpu, 0.99), {"constant": runs}, 0.15, 0.03)
        assert readings["constant"] == (0.99, cheaper)
        assert result == expected, (gpu, cut, cheaper)


def test_a_file_or_row_it_cannot_read_names_the_file_and_the_row(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="broken.json: expected a bench/sizing.py --json file"):
        read_runs([broken], "fleetplan (ensemble)")
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"rows": [{"workload": "w", "scale": 1.0, "sla": [500, 50],
                                           "policy": "fleetplan (ensemble)", "gpu_hours": 5.0}]}))
    with pytest.raises(ValueError, match="short.json: row 0: expected .*attainment"):
        read_runs([short], "fleetplan (ensemble)")


def test_the_reference_sweep_read_is_the_one_of_the_sizing_asked_for(tmp_path):
    """``--reference-sizing backlog`` reads the ``reference forecast (P) utilU backlog`` rows as the
    sweep and leaves the plain ones out; without it, the other way round."""
    def row(policy, gpu):
        return {"workload": "w", "scale": 1.0, "sla": [500, 50], "policy": policy, "gpu_hours": gpu,
                "attainment": 0.99}
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"rows": [row("fleetplan (ensemble)", 5.0),
                                         row("reference forecast (constant) util0.8", 6.0),
                                         row("reference forecast (constant) util0.8 backlog", 4.0)]}))
    key = ("w", 1.0, (500, 50))
    assert read_runs([runs], "fleetplan (ensemble)")[key]["refs"] == {"constant": [(6.0, 0.99, 0.8)]}
    assert read_runs([runs], "fleetplan (ensemble)", "backlog")[key]["refs"] == {"constant": [(4.0, 0.99, 0.8)]}


# The verdicts docs/forecasting.md states, read off the committed runs (bench/results/verdicts):
# (workload, rate scale, SLA) -> verdict, for the default; for the default before
# uncalibrated_headroom: coverage (until 2026-12-04); for that one before calibrated_utilization
# (the same verdicts: only the ServeGen figures moved); and for the default at utilisation 0.9.
BEFORE_COVERAGE = {
    ("azure-conv-30min", 34.0, (500.0, 50.0)): "lost",
    ("azure-code-30min", 50.0, (500.0, 50.0)): "tie",
    ("mooncake-conv-30min", 6.0, (500.0, 50.0)): "won",
    # lost on revision 5 as the bench built it until 2026-12-05 (its span taken before spreading,
    # 1,797 s: 6.33 GPU-hours against the reference's 6.14); a tie on the simulator's workload
    ("mooncake-conv-30min-spread", 6.0, (500.0, 50.0)): "tie",
    ("azure-conv-30min", 34.0, (200.0, 20.0)): "won",
    ("azure-code-30min", 50.0, (200.0, 20.0)): "tie",  # won on simulator revision 1
    ("mooncake-conv-30min", 6.0, (200.0, 20.0)): "tie",
    ("mooncake-conv-30min-spread", 6.0, (200.0, 20.0)): "tie",  # won on revision 1
    ("azure-conv-30min", 30.6, (500.0, 50.0)): "lost",
    ("azure-conv-30min", 32.3, (500.0, 50.0)): "lost",
    ("azure-conv-30min", 37.4, (500.0, 50.0)): "tie",
    ("azure-code-30min", 45.0, (500.0, 50.0)): "lost",
    ("servegen-m-large-24h", 0.1714, (500.0, 50.0)): "won",
    ("servegen-m-mid-24h", 0.0667, (500.0, 50.0)): "won",
    ("servegen-m-large-24h", 0.1543, (500.0, 50.0)): "won",
    ("servegen-m-large-24h", 0.1885, (500.0, 50.0)): "won",
}
SERVEGEN = {key for key in BEFORE_COVERAGE if key[0].startswith("servegen")}
# headroom by the P90's coverage: conv at 0.9x and 0.95x go from lost to a tie
BEFORE_WINDOW_RATE = {
    **BEFORE_COVERAGE,
    ("azure-conv-30min", 30.6, (500.0, 50.0)): "tie",
    ("azure-conv-30min", 32.3, (500.0, 50.0)): "tie",
}
DOCUMENTED = {
    # prefill's rate count on the window's P90, the busiest minute left to the queueing floor:
    # conv at 1x went from lost to a tie (lost again since floor_headroom: coverage, below)
    "fleetplan (ensemble)": {**BEFORE_WINDOW_RATE,
                             # floor_tokens (2026-12-06): the same attainment for 5 % more, from won to a tie
                             ("azure-conv-30min", 34.0, (200.0, 20.0)): "tie",
                             # hold_until_scored: decode (2026-12-06): 100.00 % at 6.02, from a tie to won
                             ("azure-conv-30min", 37.4, (500.0, 50.0)): "won",
                             # floor_headroom: coverage (2026-12-06): prefill's floor keeps the forecast's
                             # headroom until the P90 is conformal; conv pays an engine on a tick or two
                             ("azure-code-30min", 50.0, (500.0, 50.0)): "won",
                             ("azure-code-30min", 55.0, (500.0, 50.0)): "tie",
                             ("azure-code-30min", 50.0, (200.0, 20.0)): "won",
                             ("azure-conv-30min", 34.0, (500.0, 50.0)): "lost",
                             ("mooncake-conv-30min", 5.4, (500.0, 50.0)): "won",
                             ("mooncake-conv-30min", 6.0, (200.0, 20.0)): "won",
                             ("mooncake-conv-30min-spread", 6.0, (500.0, 50.0)): "won",
                             ("mooncake-conv-30min-spread", 6.0, (200.0, 20.0)): "won",
                             # the week's scored days, every forecaster warmed on the days before
                             ("servegen-m-large-24h-day4-warm4d", 0.1714, (500.0, 50.0)): "won",
                             ("servegen-m-large-24h-day5-warm5d", 0.1714, (500.0, 50.0)): "won",
                             ("servegen-m-large-24h-day6-warm6d", 0.1714, (500.0, 50.0)): "won",
                             ("servegen-m-mid-24h-day4-warm4d", 0.0667, (500.0, 50.0)): "won",
                             ("servegen-m-mid-24h-day5-warm5d", 0.0667, (500.0, 50.0)): "tie",
                             ("servegen-m-mid-24h-day6-warm6d", 0.0667, (500.0, 50.0)): "won"},
    "fleetplan (ensemble) -windowrate": BEFORE_WINDOW_RATE,
    "fleetplan (ensemble) -coverage": BEFORE_COVERAGE,
    "fleetplan (ensemble) -calibrated": BEFORE_COVERAGE,
    "fleetplan (ensemble) util0.9": {
        ("azure-conv-30min", 34.0, (500.0, 50.0)): "tie",
        ("azure-conv-30min", 32.3, (500.0, 50.0)): "lost",
        ("mooncake-conv-30min", 6.0, (200.0, 20.0)): "lost",
        ("servegen-m-large-24h", 0.1714, (500.0, 50.0)): "won",
        ("servegen-m-mid-24h", 0.0667, (500.0, 50.0)): "won",
    },
    # with replay-based retune of the headroom (docs/retune.md): conv at 0.9x, 0.95x and (with
    # the window's rate count) 1x are ties. On revision 1 conv at 200/20 was won at every level;
    # on revision 2 only at 1x
    "fleetplan (ensemble) +retune": {
        ("azure-conv-30min", 30.6, (500.0, 50.0)): "tie",
        ("azure-conv-30min", 32.3, (500.0, 50.0)): "tie",
        ("azure-conv-30min", 34.0, (500.0, 50.0)): "tie",
        ("azure-conv-30min", 35.7, (500.0, 50.0)): "lost",
        ("azure-conv-30min", 37.4, (500.0, 50.0)): "tie",
        ("azure-code-30min", 45.0, (500.0, 50.0)): "lost",
        ("azure-code-30min", 50.0, (500.0, 50.0)): "tie",
        ("mooncake-conv-30min", 6.0, (500.0, 50.0)): "won",
        ("mooncake-conv-30min-spread", 6.0, (500.0, 50.0)): "tie",  # lost on the 1,797-s workload
        ("azure-conv-30min", 30.6, (200.0, 20.0)): "tie",
        ("azure-conv-30min", 34.0, (200.0, 20.0)): "won",
        ("azure-conv-30min", 37.4, (200.0, 20.0)): "tie",
        ("mooncake-conv-30min", 6.0, (200.0, 20.0)): "tie",
        # lost on revision 2 (57.77 % where the reference reached 57.94 %), a tie on revisions 3
        # and 4, lost on revision 5's 1,797-s workload (57.73 % against 57.96 %), a tie on the
        # simulator's 1,800-s one (58.36 % at 7.74 against 58.29 % at 7.77)
        ("mooncake-conv-30min-spread", 6.0, (200.0, 20.0)): "tie",
    },
    # the hourly retune of calibrated_utilization on the days, run on revision 2 (2026-12-04):
    # 0.19 points above the default on m-large for the same GPU-hours
    "fleetplan (ensemble) +retune1h": {
        ("servegen-m-large-24h", 0.1714, (500.0, 50.0)): "won",
        ("servegen-m-mid-24h", 0.0667, (500.0, 50.0)): "won",
    },
}
# what the revision-1 ServeGen file says (its reference rows read with its own defaults' rows)
DOCUMENTED_REVISION1 = {
    "fleetplan (ensemble) -coverage": {key: "won" for key in SERVEGEN},
    "fleetplan (ensemble) -calibrated": {key: "won" for key in SERVEGEN},
    "fleetplan (ensemble) util0.9": {key: "won" for key in SERVEGEN if key[1] in (0.1714, 0.0667)},
    "fleetplan (ensemble) -coverage +retune1h": {key: "won" for key in SERVEGEN if key[1] in (0.1714, 0.0667)},
}


# decode_demand: weighted (the default since 2026-12-06) moved 11 of the default's trace rows; the
# committed files hold its rows, and bench/results/decode-weighted/burst.json every trace row as
# decode_demand: burst, the default before, ran it (docs/sizing.md)
BURST = VERDICTS.parent / "decode-weighted" / "burst.json"
# quantile_basis: floor_tokens (the default since 2026-12-06) took the default's rows' places too;
# bench/results/floor-tokens/requests.json keeps every row it replaced, as the request basis ran it
REQUESTS = VERDICTS.parent / "floor-tokens" / "requests.json"


# hold_until_scored: decode (the default on 2026-12-06) moved 7 of the default's trace rows;
# bench/results/hold-until-scored keeps all 44 as the default ran them before (none.json) and with
# every role held (all.json), both before the floor's margin. hold_until_scored: all (the default since
# 2026-12-07) moved 21 of them, 26 of the 70B's 36 and 2 of the ServeGen days'; decode.json,
# decode-servegen.json and other-engine/hold-decode.json keep them as decode alone held ran them
HOLD_NONE = VERDICTS.parent / "hold-until-scored" / "none.json"
HOLD_ALL = VERDICTS.parent / "hold-until-scored" / "all.json"
HOLD_DECODE = "fleetplan (ensemble) hold-decode"
HOLD_DECODE_FILES = [VERDICTS.parent / "hold-until-scored" / name for name in ("decode.json", "decode-servegen.json")]
HOLD_DECODE_70B = VERDICTS.parent / "other-engine" / "hold-decode.json"
# floor_headroom: coverage (the default since 2026-12-06) moved 40 of the 44; floor-headroom/none.json
# keeps them as the default ran them before
FLOOR_NONE = VERDICTS.parent / "floor-headroom" / "none.json"


def default_before(files: list[Path], *kept: tuple[Path, str]) -> dict[tuple, dict]:
    """``read_runs`` of the default, its rows replaced by those of each ``(file, policy)`` in turn
    where that file has one: the default as it was before the changes whose rows those files keep."""
    groups = read_runs(files, "fleetplan (ensemble)")
    for path, policy in kept:
        before = read_runs([path], policy)
        for key, group in groups.items():
            if key in before:
                group["default"] = before[key]["default"]
    return groups


def decode_held(files: list[Path]) -> dict[tuple, dict]:
    """The default as it was with ``hold_until_scored: decode`` (until 2026-12-07), on either engine."""
    return default_before(files, *((path, HOLD_DECODE) for path in (*HOLD_DECODE_FILES, HOLD_DECODE_70B)))


def floorless(files: list[Path]) -> dict[tuple, dict]:
    """The default as it was with ``floor_headroom: none`` (and ``hold_until_scored: decode``)."""
    return default_before(files, (FLOOR_NONE, "fleetplan (ensemble) floor-none"))


def released_first(files: list[Path]) -> dict[tuple, dict]:
    """The default as it was with ``hold_until_scored: none`` (and ``quantile_basis: floor_tokens``)."""
    return default_before(files, (HOLD_NONE, "fleetplan (ensemble) hold-none"))


def requests_default(files: list[Path]) -> dict[tuple, dict]:
    """The default as it was with ``quantile_basis: requests`` (and ``decode_demand: weighted``)."""
    return default_before(files, (REQUESTS, "fleetplan (ensemble) requests-basis"))


def burst_default(files: list[Path]) -> dict[tuple, dict]:
    """The default as it was with ``decode_demand: burst`` (on the request basis); the days are the same."""
    return default_before(files, (REQUESTS, "fleetplan (ensemble) requests-basis"),
                          (BURST, "fleetplan (ensemble) decode-burst"))


def moved_rows(before: dict[tuple, dict], now: dict[tuple, dict], keys) -> dict[tuple, tuple[float, float]]:
    """Of ``keys``, each row whose default ran otherwise in ``now`` than in ``before``:
    (workload, scale to 0.1, SLA) -> (GPU-hours more, points more), both rounded to 2 decimals."""
    moved = {}
    for key in keys:
        (gpu0, att0), (gpu, att) = before[key]["default"], now[key]["default"]
        if (gpu, att) != (gpu0, att0):
            moved[(key[0], round(key[1], 1), key[2])] = (round(gpu - gpu0, 2), round((att - att0) * 100, 2))
    return moved


# the trace rows floor_tokens moved: (workload, scale, SLA) -> (GPU-hours more, points more)
FLOOR_TOKENS_MOVED = {
    ("azure-code-30min", 45.0, (500.0, 50.0)): (0.05, 0.0),
    ("azure-code-30min-seed2", 50.0, (500.0, 50.0)): (0.05, 0.81),
    ("azure-code-30min-shift30", 19.0, (500.0, 50.0)): (0.38, 0.0),
    ("azure-conv-30min", 30.6, (200.0, 20.0)): (0.0, 0.0),
    ("azure-conv-30min", 34.0, (200.0, 20.0)): (0.3, 0.07),
    ("azure-conv-30min", 34.0, (500.0, 50.0)): (0.05, 0.0),
    ("azure-conv-30min", 37.4, (200.0, 20.0)): (0.0, 0.0),
    ("azure-conv-30min-shift30", 27.0, (500.0, 50.0)): (0.35, 12.8),
    ("azure-conv-30min-shift30", 34.0, (500.0, 50.0)): (0.35, 10.04),
    ("azure-conv-30min-shift30-seed1", 34.0, (500.0, 50.0)): (0.45, 28.31),
    ("azure-conv-30min-shift30-seed2", 34.0, (500.0, 50.0)): (0.45, 28.92),
}


def test_floor_tokens_moved_eleven_trace_rows_and_none_meets_less():
    """docs/sizing.md: every trace row the default ran on the request basis, run again with
    floor_tokens: 33 to the bit, 11 spend more on prefill's floor (up to 0.45 GPU-hours) for as
    much attainment or more, up to 29 points more on conv with its shape kept."""
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS]
    now, before = released_first(files), read_runs([REQUESTS], "fleetplan (ensemble) requests-basis")
    traces = {key for key in before if not key[0].startswith("servegen")}
    assert len(traces) == 44
    moved = moved_rows(before, now, traces)
    assert moved == FLOOR_TOKENS_MOVED
    for key in traces:  # more GPU-hours on every row that moved, for as much attainment or more
        (gpu0, att0), (gpu, att) = before[key]["default"], now[key]["default"]
        assert (gpu, att) == (gpu0, att0) or (gpu > gpu0 and att >= att0), key


# the trace rows the hold moved: (workload, scale, SLA) -> (GPU-hours more, points more)
HOLD_MOVED = {
    ("azure-conv-30min", 37.4, (500.0, 50.0)): (0.05, 0.91),
    ("azure-conv-30min-shift30", 27.0, (500.0, 50.0)): (0.05, 7.77),
    ("azure-conv-30min-shift30", 34.0, (500.0, 50.0)): (0.05, 2.19),
    ("azure-conv-30min-shift30-seed1", 34.0, (500.0, 50.0)): (0.05, 2.19),
    ("azure-conv-30min-shift30-seed2", 34.0, (500.0, 50.0)): (0.05, 2.19),
    ("mooncake-conv-30min-spread-shift30-seed2", 6.0, (500.0, 50.0)): (0.05, 0.05),
    ("azure-code-30min-shift30", 50.0, (500.0, 50.0)): (-0.0, 0.0),  # 3 GPU-seconds fewer
}


def test_the_hold_moved_seven_trace_rows_for_a_decode_engine_at_most():
    """docs/sizing.md: every trace row run again with hold_until_scored: decode: 37 to the bit; six
    meet 0.05-7.8 points more for 0.05 GPU-hours (a decode engine for the first ticks), and code x50
    with its shape kept is the same attainment for 3 GPU-seconds less."""
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS]
    now, before = floorless(files), read_runs([HOLD_NONE], "fleetplan (ensemble) hold-none")
    assert len(before) == 44
    assert moved_rows(before, now, before) == HOLD_MOVED
    for key, group in before.items():  # never less attainment, never more than a decode engine's first ticks
        (gpu0, att0), (gpu, att) = group["default"], now[key]["default"]
        assert att >= att0 and gpu - gpu0 < 0.05, key


def workload_tallies(groups: dict[tuple, dict]) -> dict[tuple, tuple[int, int, int]]:
    """Each (workload, SLA)'s verdicts over its levels and draws, (won, tie, lost), as
    bench/frontier.py --by-draw counts them."""
    return {key: (c["won"], c["tie"], c["lost"]) for key, c in tally(by_draw(groups, TIE_POINTS, TIE_COST)).items()}


def trace_tally(groups: dict[tuple, dict]) -> dict[str, int]:
    """The 30-minute traces' verdicts over every level and draw: {won, tie, lost} summed."""
    traces = [counts for (workload, _), counts in tally(by_draw(groups, TIE_POINTS, TIE_COST)).items()
              if not workload.startswith("servegen")]
    return {kind: sum(counts[kind] for counts in traces) for kind in ("won", "tie", "lost")}


# the verdicts of the 44 trace rows, each draw with a reference sweep, for each hold (docs/sizing.md)
HOLD_TALLIES = {
    "none": {"won": 9, "tie": 19, "lost": 16},
    "decode": {"won": 12, "tie": 17, "lost": 15},
    "all": {"won": 16, "tie": 12, "lost": 16},
}


@pytest.mark.parametrize("hold", sorted(HOLD_TALLIES))
def test_the_holds_tally_the_docs_state(hold):
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS, HOLD_ALL]
    groups = {"none": lambda: released_first(files), "decode": lambda: floorless(files),
              "all": lambda: read_runs(files, "fleetplan (ensemble) hold-all")}[hold]()
    assert trace_tally(groups) == HOLD_TALLIES[hold]


def test_the_floors_margin_moved_forty_trace_rows_and_buys_attainment_for_gpu_hours():
    """docs/sizing.md: every trace row run again with floor_headroom: coverage. 4 are the same to the bit;
    38 spend more (0.05-0.69 GPU-hours), Mooncake at seed 1 0.05 less and spread Mooncake with its shape
    kept at seed 2 the same; all meet as much or more but Mooncake with its shape kept (0.03 points)."""
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS]
    now, before = decode_held(files), read_runs([FLOOR_NONE], "fleetplan (ensemble) floor-none")
    assert len(before) == 44
    moved = moved_rows(before, now, before)
    assert len(moved) == 40
    spent = sorted(gpu for gpu, _ in moved.values())
    assert spent[:2] == [-0.05, -0.0] and 0.05 <= spent[2] and spent[-1] == 0.69
    assert {key: change for key, change in moved.items() if change[1] < 0} == {
        ("mooncake-conv-30min-shift30", 6.0, SLA): (0.05, -0.03)}
    assert max(points for (workload, _, _), (_, points) in moved.items() if workload.startswith("azure-conv-30min")
               and "shift" not in workload) <= 0.1  # conv meets what it met: the margin is spend there


# the verdicts of the 44 trace rows without and with the floor's margin, decode alone held (docs/sizing.md)
FLOOR_TALLIES = {"none": (12, 17, 15), "coverage": (21, 11, 12)}
# and the default's since every role is held (2026-12-07): spread Mooncake at seed 1 from a tie to won
TRACE_TALLY = (22, 10, 12)


@pytest.mark.parametrize("floor", sorted(FLOOR_TALLIES))
def test_the_floors_margin_tallies_the_docs_state(floor):
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS]
    groups = floorless(files) if floor == "none" else decode_held(files)
    assert tuple(trace_tally(groups).values()) == FLOOR_TALLIES[floor]


def test_weighted_moved_only_decode_and_meets_as_much_for_as_much_or_less():
    """docs/sizing.md: every trace row the default ran with burst, run again with weighted: 33 to the
    bit, 11 cheaper by 0.0005-0.29 GPU-hours (decode engines), and none meets less but spread
    Mooncake with its shape kept at seed 2 (0.05 points, for 0.05 GPU-hours less)."""
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS]  # module constants, defined with their tests below
    now, before = requests_default(files), read_runs([BURST], "fleetplan (ensemble) decode-burst")
    assert len(before) == 44
    moved = {}
    for key, group in before.items():
        (gpu0, att0), (gpu, att) = group["default"], now[key]["default"]
        if (gpu, att) != (gpu0, att0):
            # the whole key: by workload alone a second moved row of it (conv x34 beside x35.7) was
            # folded into the first and the count of moved rows went unchecked
            moved[key] = (round(gpu0 - gpu, 2), round((att - att0) * 100, 2))
            assert 0.0005 <= gpu0 - gpu < 0.295
    assert len(moved) == 11
    assert {workload: change for (workload, _, _), change in moved.items()} == {
        "azure-conv-30min": (0.0, 0.0), "azure-conv-30min-seed1": (0.0, 0.0),
        "azure-conv-30min-shift30": (0.05, 0.0), "mooncake-conv-30min": (0.05, 0.0),
        "mooncake-conv-30min-seed1": (0.19, 0.0), "mooncake-conv-30min-seed2": (0.0, 0.0),
        "mooncake-conv-30min-shift30": (0.09, 0.0), "mooncake-conv-30min-spread-seed1": (0.29, 0.0),
        "mooncake-conv-30min-spread-seed2": (0.24, 0.0), "mooncake-conv-30min-spread-shift30-seed1": (0.05, 0.0),
        "mooncake-conv-30min-spread-shift30-seed2": (0.05, -0.05),
    }


# Which simulator measured each committed file (sim/__init__.py REVISION; a row without
# sim_revision is from revision 1). A file behind the current revision is stale, and
# bench/remeasure.py runs it again; the verdicts README says why any is left behind.
# Revision 3 (2026-12-05) moved no workload of the ServeGen files: their runs are whole days on the
# window grid. Revision 4 (2026-12-05, decode below the shortest measured context) was run on the four
# files of the 30-minute traces; the ServeGen files stay at 2 (verdicts README: the default's m-large
# day, run again on revision 4, is the committed row).
# Revision 5 (2026-12-05, prefix caching) moves only workloads with prefix hashes: Mooncake's rows
# were run again, the Azure rows of revision 4 are current (UNMOVED_BY).
# Both ServeGen files were run again on revision 5 on 2026-12-06 (their revision-2 rows are in revision2/).
STALE: dict[str, int] = {}
UNMOVED_BY: dict[int, Callable[[str], bool]] = {5: lambda workload: not workload.startswith("mooncake")}


def current_revision(workload: str, revision: int) -> int:
    """The latest revision a row of ``workload`` measured at ``revision`` stands for: the revisions
    after it that do not move its workload leave its figures as they are."""
    while revision < REVISION and UNMOVED_BY.get(revision + 1, lambda _: False)(workload):
        revision += 1
    return revision


def test_the_committed_runs_say_which_simulator_measured_them():
    for path in RECORDED:
        rows = json.loads(path.read_text())["rows"]
        revisions = {current_revision(row["workload"], row.get("sim_revision", 1)) for row in rows}
        assert revisions == {STALE.get(path.name, REVISION)}, path.name


@pytest.mark.parametrize(("files", "default"), [
    *((RECORDED if d == "fleetplan (ensemble)" else HISTORIC, d) for d in sorted(DOCUMENTED)),
    *((REVISION1, d) for d in sorted(DOCUMENTED_REVISION1)),
])
def test_the_committed_runs_give_the_documented_verdicts(files, default):
    expected = (DOCUMENTED if files is not REVISION1 else DOCUMENTED_REVISION1)[default]
    groups = read_runs(files, default)
    found = {key: verdict(groups[key]["default"], groups[key]["refs"], TIE_POINTS, TIE_COST)[0]
             for key in expected}
    assert found == expected


@pytest.mark.parametrize(("files", "revision", "names"), [
    (REVISION1, 1, ["servegen-500-50.json"]),
    (REVISION2, 2, ["servegen-500-50.json", "servegen-warm-500-50.json"]),
])
def test_the_earlier_records_are_of_their_revision_throughout(files, revision, names):
    assert [p.name for p in files] == names
    for path in files:
        assert {row.get("sim_revision", 1) for row in json.loads(path.read_text())["rows"]} == {revision}


def test_calibrated_headroom_moves_only_the_runs_long_enough_to_calibrate():
    """A 30-minute trace never has the 9 origins the P90 needs, so with the full headroom until
    then its rows are the ones before calibrated_utilization; the ServeGen days spend 3-5 % less
    for at most 0.53 points (docs/sizing.md)."""
    now = read_runs(ABLATED, "fleetplan (ensemble) -coverage")
    before = read_runs(ABLATED, "fleetplan (ensemble) -calibrated")
    assert set(now) == set(before) and len(now) == 24
    for key in now:
        (gpu, att), (gpu0, att0) = now[key]["default"], before[key]["default"]
        if key[0].startswith("servegen"):
            assert gpu < 0.97 * gpu0 and att0 - 0.0054 < att < att0
        else:  # the same run, some rows of it kept at the printed tables' 2 decimals
            assert (round(gpu, 2), round(att, 4)) == (round(gpu0, 2), round(att0, 4)), key


def test_headroom_by_coverage_spends_less_only_where_prefill_is_sized_by_rate():
    """The same attainment on every 30-minute row; fewer GPU-hours on conv, whose prefill the
    rate sets (at 500/50 every level, at 200/20 all but 1x), and the same run elsewhere, where
    the queueing floor sets prefill and decode is sized by its slots (docs/sizing.md)."""
    now = read_runs(ABLATED, "fleetplan (ensemble) -windowrate")  # the default of 2026-12-04 morning
    before = read_runs(ABLATED, "fleetplan (ensemble) -coverage")
    assert set(now) == set(before) and len(now) == 24
    keys = {key for key in now if not key[0].startswith("servegen")}
    cheaper = set()
    for key in now.keys() - keys:  # a day sizes differently for its first 33 minutes only
        (gpu, att), (gpu0, att0) = now[key]["default"], before[key]["default"]
        assert abs(att - att0) < 0.0004 and abs(gpu / gpu0 - 1) < 0.006, key
    for key in keys:
        (gpu, att), (gpu0, att0) = now[key]["default"], before[key]["default"]
        assert att == att0, key
        assert gpu <= gpu0, key
        if gpu < gpu0:
            cheaper.add(key)
    conv_500 = {("azure-conv-30min", s, (500.0, 50.0)) for s in (30.6, 32.3, 34.0, 35.7, 37.4)}
    conv_200 = {("azure-conv-30min", s, (200.0, 20.0)) for s in (30.6, 37.4)}
    assert {(w, round(s, 1), sla) for w, s, sla in cheaper} == conv_500 | conv_200


def test_the_windows_rate_count_spends_less_only_where_the_rate_count_sets_prefill():
    """The same attainment on every row, days included (at conv 1.05x within 0.001 points); fewer
    GPU-hours on conv at 500/50 from 0.95x to 1.1x, where the busiest minute's P90 in the rate count asked for a 7th prefill
    engine the floor did not; the same run wherever the queueing floor sets prefill (docs/sizing.md)."""
    now = burst_default(ABLATED)  # the default both were measured with
    before = read_runs(ABLATED, "fleetplan (ensemble) -windowrate")
    assert set(now) == set(before) and len(now) == 24
    cheaper = set()
    for key in now:
        (gpu, att), (gpu0, att0) = now[key]["default"], before[key]["default"]
        assert abs(att - att0) < 1e-5, key  # to the digit but at conv 1.05x: 0.0003 points fewer
        assert gpu <= gpu0, key
        if gpu < gpu0:
            cheaper.add((key[0], round(key[1], 1), key[2]))
        else:
            assert att == att0, key
    # at 1.1x by 0.001 GPU-hours
    assert cheaper == {("azure-conv-30min", s, (500.0, 50.0)) for s in (32.3, 34.0, 35.7, 37.4)}


def test_pooling_sums_over_the_defaults_levels_and_drops_a_policy_missing_one(tmp_path):
    def row(scale, policy, gpu, att):
        return {"workload": "w", "scale": scale, "sla": [500, 50], "policy": policy,
                "gpu_hours": gpu, "attainment": att}
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"rows": [
        row(1.0, "fleetplan (ensemble)", 5.0, 0.99), row(1.1, "fleetplan (ensemble)", 6.0, 0.97),
        row(1.0, "reference forecast (constant) util0.8", 4.5, 0.98),
        row(1.1, "reference forecast (constant) util0.8", 5.5, 0.96),
        row(1.0, "reference forecast (constant) util0.9", 4.0, 0.95),  # not run at 1.1x
        row(1.2, "reference forecast (constant) util0.8", 7.0, 0.50),  # a level the default skipped
    ]}))
    pools = pooled([runs], "fleetplan (ensemble)")
    assert set(pools) == {("w", (500, 50))}
    found = pools[("w", (500, 50))]
    assert set(found) == {"fleetplan (ensemble)", "reference forecast (constant) util0.8"}
    assert found["fleetplan (ensemble)"] == pytest.approx((11.0, 0.98, 0.97))
    assert found["reference forecast (constant) util0.8"] == pytest.approx((10.0, 0.97, 0.96))


def test_pooling_takes_a_workloads_draws_as_levels_of_it(tmp_path):
    """w-seed3 is w drawn again: pooled with w, a policy that ran on one draw only is dropped."""
    def row(workload, policy, gpu, att):
        return {"workload": workload, "scale": 1.0, "sla": [500, 50], "policy": policy,
                "gpu_hours": gpu, "attainment": att}
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"rows": [
        row("w", "fleetplan (ensemble)", 5.0, 0.99), row("w-seed3", "fleetplan (ensemble)", 6.0, 0.95),
        row("w", "reference forecast (constant) util0.8", 4.5, 0.98),
        row("w-seed3", "reference forecast (constant) util0.8", 5.0, 0.97),
        row("w", "reference forecast (constant) util0.9", 4.0, 0.95),  # not run on draw 3
    ]}))
    found = pooled([runs], "fleetplan (ensemble)")
    assert set(found) == {("w", (500, 50))}
    assert found[("w", (500, 50))] == {"fleetplan (ensemble)": pytest.approx((11.0, 0.97, 0.95)),
                                       "reference forecast (constant) util0.8": pytest.approx((9.5, 0.975, 0.97))}


# The shape-kept verdicts docs/forecasting.md and docs/sizing.md state (bench/results/shape-kept,
# with the flat traces' recorded runs for the token basis's rows at the recorded scales): the
# default, and the default with quantile_basis: tokens.
SHAPE_KEPT = sorted((VERDICTS.parent / "shape-kept").glob("*.json"))
TOKENS = VERDICTS.parent / "tokens" / "tokens.json"
FLAT_TRACES = [VERDICTS / name for name in ("azure-conv-500-50.json", "azure-code-500-50.json", "mooncake-500-50.json")]
SLA = (500.0, 50.0)
SHAPE_KEPT_VERDICTS = {
    # floor_tokens (2026-12-06) turned conv x34 from lost to a tie, and the hold until a forecast is scored
    # (the same day) to won, and x27 from lost to won
    "fleetplan (ensemble)": {
        ("azure-conv-30min-shift30", 34.0, SLA): "won", ("azure-conv-30min-shift30", 27.0, SLA): "won",
        ("azure-code-30min-shift30", 50.0, SLA): "won", ("azure-code-30min-shift30", 19.0, SLA): "won",
        # floor_headroom: coverage (2026-12-06) turned spread Mooncake from lost to won
        ("mooncake-conv-30min-shift30", 6.0, SLA): "won", ("mooncake-conv-30min-spread-shift30", 6.0, SLA): "won",
    },
    "fleetplan (ensemble) tokens": {
        ("azure-conv-30min-shift30", 34.0, SLA): "tie", ("azure-conv-30min-shift30", 27.0, SLA): "lost",
        ("azure-code-30min-shift30", 50.0, SLA): "won", ("azure-code-30min-shift30", 19.0, SLA): "won",
        ("mooncake-conv-30min-shift30", 6.0, SLA): "won", ("mooncake-conv-30min-spread-shift30", 6.0, SLA): "lost",
        ("azure-conv-30min", 34.0, SLA): "lost", ("azure-code-30min", 50.0, SLA): "tie",
        ("mooncake-conv-30min", 6.0, SLA): "won", ("mooncake-conv-30min-spread", 6.0, SLA): "tie",
    },
}


@pytest.mark.parametrize("default", sorted(SHAPE_KEPT_VERDICTS))
def test_the_shape_kept_runs_give_the_documented_verdicts(default):
    assert [p.name for p in SHAPE_KEPT] == ["azure-500-50-shift30-chosen.json", "azure-500-50-shift30.json",
                                           "mooncake-500-50-shift30.json"]
    groups = read_runs([*SHAPE_KEPT, *FLAT_TRACES, TOKENS], default)
    expected = SHAPE_KEPT_VERDICTS[default]
    found = {key: verdict(groups[key]["default"], groups[key]["refs"], TIE_POINTS, TIE_COST)[0] for key in expected}
    assert found == expected


# docs/sizing.md's tally of the token basis over the recorded verdicts' rows, beside the default's of
# then (the request basis, as requests.json keeps it)
TALLIES = {
    "fleetplan (ensemble) requests-basis": {"traces": {"won": 5, "tie": 12, "lost": 3}, "servegen": {"won": 9, "tie": 1}},
    "fleetplan (ensemble) tokens": {"traces": {"won": 5, "tie": 11, "lost": 4}, "servegen": {"won": 9, "lost": 1}},
    "fleetplan (ensemble) tokens util0.9": {"traces": {"won": 6, "tie": 8, "lost": 6}, "servegen": {}},  # not run
}


@pytest.mark.parametrize("default", sorted(TALLIES))
def test_the_token_basis_tallies_the_docs_state(default):
    groups = (requests_default([*HISTORIC, TOKENS]) if default.endswith("requests-basis")
              else read_runs([*HISTORIC, TOKENS], default))
    counted: dict[str, dict[str, int]] = {"traces": {}, "servegen": {}}
    for (workload, _, _), group in groups.items():
        if group["default"] is None or "shift" in workload:
            continue
        kind = "servegen" if workload.startswith("servegen") else "traces"
        found = verdict(group["default"], group["refs"], TIE_POINTS, TIE_COST)[0]
        counted[kind][found] = counted[kind].get(found, 0) + 1
    assert counted == TALLIES[default]


def test_by_draw_gathers_a_rows_verdicts_over_the_draws_of_its_workload():
    """-seedN is draw N of the workload without the suffix (seed 0 keeps the name), at the same
    scale and SLA; a scale or SLA of its own is another row; rows without a verdict are left out."""
    refs = {"constant": [(g, a, u) for g, a, u in SWEEP]}
    groups = {
        ("conv-shift30", 34.0, SLA): {"default": (5.4, 0.99), "refs": refs},  # the reference 0.97: won
        ("conv-shift30-seed1", 34.0, SLA): {"default": (5.4, 0.96), "refs": refs},  # lost
        ("conv-shift30-seed12", 34.0, SLA): {"default": (5.4, 0.9705), "refs": refs},  # within 0.15: tie
        ("conv-shift30-seed1", 35.7, SLA): {"default": (5.4, 0.99), "refs": refs},
        ("conv-shift30-seed2", 34.0, SLA): {"default": None, "refs": refs},
        ("code", 50.0, SLA): {"default": (5.4, 0.99), "refs": {}},
    }
    assert by_draw(groups, TIE_POINTS, TIE_COST) == {
        ("conv-shift30", 34.0, SLA): {0: "won", 1: "lost", 12: "tie"},
        ("conv-shift30", 35.7, SLA): {1: "won"},
    }


def test_tally_counts_a_workloads_verdicts_over_its_levels_and_draws_by_sla():
    draws = {
        ("conv", 35.7, SLA): {0: "lost", 1: "tie"},
        ("conv", 34.0, SLA): {0: "won", 1: "won", 2: "tie"},
        ("conv", 34.0, (200.0, 20.0)): {0: "unread"},
        ("code", 50.0, SLA): {0: "lost"},
    }
    assert tally(draws) == {
        ("code", SLA): {"won": 0, "tie": 0, "lost": 1},
        ("conv", (200.0, 20.0)): {"won": 0, "tie": 0, "lost": 0, "unread": 1},
        ("conv", SLA): {"won": 2, "tie": 2, "lost": 1},
    }
    assert list(tally(draws)) == [("code", SLA), ("conv", (200.0, 20.0)), ("conv", SLA)]


# docs/forecasting.md's "Other draws of the same traces": each row's verdict at seeds 0, 1 and 2
DRAWS = sorted((VERDICTS.parent / "draws").glob("*.json"))
DRAW_VERDICTS = {
    # floor_headroom: coverage (2026-12-06) won code at seed 1 x45 and seed 0 x50, and tied seed 0 x55;
    # conv x34 at seed 0 went from a tie to lost (an engine on a tick or two)
    ("azure-code-30min", 45.0): {0: "lost", 1: "won", 2: "lost"},
    ("azure-code-30min", 50.0): {0: "won", 1: "lost", 2: "lost"},
    ("azure-code-30min", 55.0): {0: "tie", 1: "lost", 2: "lost"},
    ("azure-conv-30min", 34.0): {0: "lost", 1: "tie", 2: "tie"},
    ("azure-conv-30min", 35.7): {0: "lost", 1: "lost", 2: "tie"},
    # decode_demand: weighted (2026-12-06) turned both seed-1 losses into ties: burst's 5th decode engine;
    # floor_headroom: coverage (the same day) won seed 1, and spread Mooncake at seed 0; every role held
    # (2026-12-07) spread Mooncake at seed 1
    ("mooncake-conv-30min", 6.0): {0: "won", 1: "won", 2: "won"},
    ("mooncake-conv-30min-spread", 6.0): {0: "won", 1: "won", 2: "lost"},
    # quantile_basis: floor_tokens (2026-12-06) turned seed 0 into a tie, 1 and 2 lost by 2 points, not 18-25;
    # hold_until_scored: decode (the same day) seed 0 into won, and 1 and 2 lost by 1.2 and 0.1
    ("azure-conv-30min-shift30", 34.0): {0: "won", 1: "lost", 2: "lost"},
    # floor_headroom: coverage (2026-12-06) seed 0 into won, 2 into a tie
    ("mooncake-conv-30min-spread-shift30", 6.0): {0: "won", 1: "won", 2: "tie"},
    # day 0 on revision 5 at both seeds (since 2026-12-06), against the constant's sweep at seed 0, three predictors at 1
    ("servegen-m-large-24h", 0.1714): {0: "won", 1: "won"},
    ("servegen-m-mid-24h", 0.0667): {0: "won", 1: "won"},
    **{(f"servegen-m-large-24h-day{d}-warm{d}d", 0.1714): {0: "won", 1: "won"} for d in (4, 5, 6)},
    # m-mid's warm day 5, a tie at seed 0, is lost at seed 1; days 4 and 6 are won at both
    ("servegen-m-mid-24h-day4-warm4d", 0.0667): {0: "won", 1: "won"},
    ("servegen-m-mid-24h-day5-warm5d", 0.0667): {0: "tie", 1: "lost"},
    ("servegen-m-mid-24h-day6-warm6d", 0.0667): {0: "won", 1: "won"},
}


def test_the_draws_give_the_documented_verdicts():
    assert [p.name for p in DRAWS] == ["code-500-50.json", "conv-500-50.json", "mooncake-500-50.json",
                                       "servegen-500-50.json", "shift30-500-50.json"]
    draws = by_draw(read_runs([*RECORDED, *SHAPE_KEPT, *DRAWS], "fleetplan (ensemble)"), TIE_POINTS, TIE_COST)
    found = {(workload, round(scale, 4)): verdicts for (workload, scale, sla), verdicts in draws.items()
             if sla == SLA and (workload, round(scale, 4)) in DRAW_VERDICTS}
    assert found == DRAW_VERDICTS


# docs/forecasting.md's "Every verdict at a glance" and benchmarks.md's end-to-end table: each workload's
# verdicts (won, tied, lost) over its levels and draws, as bench/frontier.py --by-draw counts them
TIGHT = (200.0, 20.0)
GLANCE = {
    ("azure-code-30min", TIGHT): (3, 0, 0),
    ("azure-code-30min", SLA): (2, 1, 6),
    ("azure-code-30min-shift30", SLA): (2, 0, 0),
    ("azure-conv-30min", TIGHT): (0, 3, 0),
    ("azure-conv-30min", SLA): (1, 5, 3),
    ("azure-conv-30min-shift30", SLA): (2, 0, 2),
    ("mooncake-conv-30min", TIGHT): (1, 0, 0),
    ("mooncake-conv-30min", SLA): (5, 0, 0),
    ("mooncake-conv-30min-shift30", SLA): (1, 0, 0),
    ("mooncake-conv-30min-spread", TIGHT): (1, 0, 0),
    ("mooncake-conv-30min-spread", SLA): (2, 0, 1),
    ("mooncake-conv-30min-spread-shift30", SLA): (2, 1, 0),
    ("servegen-m-large-24h", SLA): (4, 0, 0),
    **{(f"servegen-m-large-24h-day{d}-warm{d}d", SLA): (2, 0, 0) for d in (4, 5, 6)},
    ("servegen-m-mid-24h", SLA): (2, 0, 0),
    ("servegen-m-mid-24h-day4-warm4d", SLA): (2, 0, 0),
    ("servegen-m-mid-24h-day5-warm5d", SLA): (0, 1, 1),
    ("servegen-m-mid-24h-day6-warm6d", SLA): (2, 0, 0),
}


def test_every_verdict_at_a_glance_is_the_tally_the_docs_state():
    counts = tally(by_draw(read_runs([*RECORDED, *SHAPE_KEPT, *DRAWS], "fleetplan (ensemble)"), TIE_POINTS, TIE_COST))
    assert {key: (c["won"], c["tie"], c["lost"]) for key, c in counts.items()} == GLANCE
    assert all(set(c) == {"won", "tie", "lost"} for c in counts.values())  # none unread
    traces = [c for (workload, _), c in GLANCE.items() if not workload.startswith("servegen")]
    days = [c for (workload, _), c in GLANCE.items() if workload.startswith("servegen")]
    assert tuple(map(sum, zip(*traces, strict=True))) == TRACE_TALLY  # the 44 trace verdicts
    assert tuple(map(sum, zip(*days, strict=True))) == (16, 1, 1)


def test_the_servegen_days_at_seed_1_are_won_by_the_margins_the_docs_state():
    """docs/forecasting.md and benchmarks.md: each predictor's frontier read at the default's
    GPU-hours, day 0, the warm days but m-mid's 5th, the frozen ARIMA that does not hold the
    m-large day, and m-mid's warm day 5, which is lost. The default's rows are floor_tokens's
    (2026-12-06); the request basis's, in floor-tokens/requests.json, give the same verdicts."""
    groups = read_runs(DRAWS, "fleetplan (ensemble)")
    stated = {
        "servegen-m-large-24h-seed1": ((490.90, 97.94), {"arima_frozen": None, "constant": 96.69, "kalman": 96.17}),
        # every role held (2026-12-07): 97.52 % at 677.07 before, the references read at that spend
        "servegen-m-mid-24h-seed1": ((677.31, 97.53), {"arima_frozen": 93.20, "constant": 95.29, "kalman": 95.33}),
        "servegen-m-large-24h-day4-warm4d-seed1": ((501.42, 96.77), {"constant": 95.70, "kalman": 95.67}),
        "servegen-m-large-24h-day5-warm5d-seed1": ((635.36, 93.95), {"constant": 92.87, "kalman": 92.82}),
        "servegen-m-large-24h-day6-warm6d-seed1": ((480.99, 95.93), {"constant": 95.12, "kalman": 95.28}),
        "servegen-m-mid-24h-day4-warm4d-seed1": ((417.18, 96.43), {"constant": 94.71, "kalman": 93.82}),
        "servegen-m-mid-24h-day6-warm6d-seed1": ((445.53, 96.45), {"constant": 95.93}),
    }
    for (workload, _, sla), group in groups.items():
        if workload in stated:
            (gpu, att), at_spend = stated.pop(workload)
            assert sla == SLA and (round(group["default"][0], 2), round(group["default"][1] * 100, 2)) == (gpu, att)
            found, readings = verdict(group["default"], group["refs"], TIE_POINTS, TIE_COST)
            assert found == "won"
            assert {p: None if a is None else round(a * 100, 2) for p, (a, _) in readings.items()} == at_spend
            assert all(cost is None for _, cost in readings.values())  # none reaches the default's attainment
    assert not stated
    # m-mid's warm day 5 is the one lost: the constant meets the default's 96.27 % from 377.95
    # GPU-hours, 3.1 % under its 390.24 (390.04 before floor_headroom: coverage; on the request
    # basis 96.26 % at 389.13, from 377.20)
    day5 = groups[("servegen-m-mid-24h-day5-warm5d-seed1", 0.0667, SLA)]
    found, readings = verdict(day5["default"], day5["refs"], TIE_POINTS, TIE_COST)
    assert (found, round(day5["default"][0], 2), round(day5["default"][1] * 100, 2)) == ("lost", 390.24, 96.27)
    assert round(readings["constant"][1], 2) == 377.95 and readings["kalman"][0] is None  # its sweep ends at 389.35
    before = requests_default(DRAWS)
    assert {w: verdict(g["default"], g["refs"], TIE_POINTS, TIE_COST)[0] for (w, _, _), g in before.items()
            if w.startswith("servegen")} == {w: verdict(g["default"], g["refs"], TIE_POINTS, TIE_COST)[0]
                                             for (w, _, _), g in groups.items() if w.startswith("servegen")}
    large = [r for r in json.loads((VERDICTS.parent / "draws" / "servegen-500-50.json").read_text())["rows"]
             if r["workload"] == "servegen-m-large-24h-seed1" and "arima_frozen" in r["policy"]]
    assert sorted(round(r["attainment"] * 100, 2) for r in large) == [59.38, 61.13]
    assert {round(r["forecast"]["point"]["under_share"] * 100) for r in large} == {68}


def test_the_servegen_day_0_rows_on_revision_5_are_won_by_the_margins_the_docs_state():
    """bench/results/verdicts/README.md and docs/forecasting.md: day 0 at seed 0, run again on revision 5
    with the default of 2026-12-06, is won at every level, and no reference reaches its attainment
    (with floor_headroom: coverage, the same day: m-large at 0.9x and 1.1x moved, 1x and m-mid did not; with
    every role held, 2026-12-07, m-mid by 0.01 points)."""
    groups = read_runs([VERDICTS / "servegen-500-50.json"], "fleetplan (ensemble)")
    stated = {
        ("servegen-m-large-24h", 0.1543): ((451.49, 97.80), 96.06),
        ("servegen-m-large-24h", 0.1714): ((488.50, 97.67), 96.40),
        ("servegen-m-large-24h", 0.1885): ((521.31, 97.89), 96.76),
        # every role held (2026-12-07): 97.36 % at 668.29 before
        ("servegen-m-mid-24h", 0.0667): ((667.53, 97.37), 94.99),
    }
    found = {}
    for (workload, scale, sla), group in groups.items():
        assert sla == SLA
        verdict_found, readings = verdict(group["default"], group["refs"], TIE_POINTS, TIE_COST)
        assert verdict_found == "won" and all(cost is None for _, cost in readings.values())
        found[(workload, round(scale, 4))] = ((round(group["default"][0], 2), round(group["default"][1] * 100, 2)),
                                              round(readings["constant"][0] * 100, 2))
    assert found == stated


def test_the_warm_days_on_revision_5_give_the_margins_the_docs_state():
    """bench/results/verdicts/README.md and docs/forecasting.md: days 4-6 warmed, run again on revision 5
    with the default of 2026-12-06: (the default, the constant at its spend, the constant's GPU-hours
    for its attainment), and the same verdicts as revision 2's rows."""
    stated = {
        "servegen-m-large-24h-day4-warm4d": ((513.75, 96.68), 95.34, None),
        "servegen-m-large-24h-day5-warm5d": ((643.83, 94.18), 92.72, None),
        "servegen-m-large-24h-day6-warm6d": ((490.72, 96.15), 95.32, None),
        "servegen-m-mid-24h-day4-warm4d": ((413.90, 96.11), 93.82, None),
        # floor_headroom: coverage (2026-12-06): the same 96.13 % for 0.20 GPU-hours more (380.18 before)
        "servegen-m-mid-24h-day5-warm5d": ((380.38, 96.13), 96.25, 373.56),
        "servegen-m-mid-24h-day6-warm6d": ((446.36, 96.09), 95.73, None),
    }
    now = read_runs([VERDICTS / "servegen-warm-500-50.json"], "fleetplan (ensemble)")
    before = read_runs([VERDICTS / "revision2" / "servegen-warm-500-50.json"], "fleetplan (ensemble)")
    found = {}
    for key, group in now.items():
        result, readings = verdict(group["default"], group["refs"], TIE_POINTS, TIE_COST)
        assert result == verdict(before[key]["default"], before[key]["refs"], TIE_POINTS, TIE_COST)[0], key
        at, cost = readings["constant"]
        found[key[0]] = ((round(group["default"][0], 2), round(group["default"][1] * 100, 2)), round(at * 100, 2),
                         None if cost is None else round(cost, 2))
    assert found == stated


def test_pooled_over_levels_and_draws_code_is_between_the_references_at_055_and_05():
    """docs/forecasting.md: one setting over code's three levels and three draws. Since floor_headroom:
    coverage (2026-12-06) the default spends between the reference's 0.55 and 0.5 and meets as much as
    0.5 on average; until then it was the frozen ARIMA's at 0.55 for less. Every role held (2026-12-07)
    adds 0.2 GPU-hours and 0.03 points."""
    files = [VERDICTS / "azure-code-500-50.json", VERDICTS.parent / "draws" / "code-500-50.json"]
    pools = pooled(files, "fleetplan (ensemble)")[("azure-code-30min", SLA)]
    rounded = {p: (round(g, 2), round(a * 100, 2), round(w * 100, 2)) for p, (g, a, w) in pools.items()}
    assert rounded["fleetplan (ensemble)"] == (63.18, 99.44, 98.68)
    assert rounded["reference forecast (arima_frozen) util0.55"] == (59.43, 98.92, 97.58)
    assert rounded["reference forecast (arima_frozen) util0.5"] == (64.30, 99.64, 98.59)
    assert rounded["reference forecast (constant) util0.5"] == (64.27, 99.41, 97.68)
    assert rounded["reference forecast (kalman) util0.5"] == (64.65, 99.47, 97.68)
    before = pooled([*files, FLOOR_NONE], "fleetplan (ensemble) floor-none")[("azure-code-30min", SLA)]
    gpu, attainment, worst = before["fleetplan (ensemble) floor-none"]
    assert (round(gpu, 2), round(attainment * 100, 2), round(worst * 100, 2)) == (60.83, 98.74, 97.28)
    decode = pooled([*files, HOLD_DECODE_FILES[0]], HOLD_DECODE)[("azure-code-30min", SLA)][HOLD_DECODE]
    assert (round(decode[0], 2), round(decode[1] * 100, 2), round(decode[2] * 100, 2)) == (62.98, 99.41, 98.68)


# docs/sizing.md's decode sections: verdicts of decode_demand: burst (the default until 2026-12-06),
# window and weighted (the default since) over the trace rows all ran, every draw with a reference sweep
DECODE_WINDOW = VERDICTS.parent / "decode-window" / "decode-window.json"
DECODE_TALLIES = {
    "burst": {"flat 500/50": {"won": 3, "tie": 10, "lost": 13}, "flat 200/20": {"won": 3, "tie": 5},
              "shape kept": {"won": 4, "lost": 6}},
    "window": {"flat 500/50": {"won": 3, "tie": 12, "lost": 11}, "flat 200/20": {"won": 5, "tie": 3},
               "shape kept": {"won": 4, "lost": 6}},
    "weighted": {"flat 500/50": {"won": 3, "tie": 12, "lost": 11}, "flat 200/20": {"won": 3, "tie": 5},
                 "shape kept": {"won": 4, "lost": 6}},
}


@pytest.mark.parametrize("demand", sorted(DECODE_TALLIES))
def test_decode_demand_tallies_the_docs_state(demand):
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS, DECODE_WINDOW]
    both = {key for key, group in read_runs(files, "fleetplan (ensemble) decode-window").items()
            if group["default"] is not None}
    groups = {"burst": lambda: burst_default(files), "weighted": lambda: requests_default(files),
              "window": lambda: read_runs(files, "fleetplan (ensemble) decode-window")}[demand]()
    counted: dict[str, dict[str, int]] = {}
    for (workload, scale, sla), verdicts in by_draw(groups, TIE_POINTS, TIE_COST).items():
        if workload.startswith("servegen"):
            continue
        kind = "shape kept" if "shift" in workload else f"flat {sla[0]:g}/{sla[1]:g}"
        for seed, found in verdicts.items():
            if (workload + (f"-seed{seed}" if seed else ""), scale, sla) in both:
                counted.setdefault(kind, {})[found] = counted.setdefault(kind, {}).get(found, 0) + 1
    assert counted == DECODE_TALLIES[demand]


def test_decode_window_with_the_shape_kept_meets_what_the_docs_say():
    """docs/sizing.md: with the shape kept, decode_demand: window spends as much or less on every
    row and meets as much or less: 0.1-0.4 points less on Mooncake, at most 0.03 on conv (not
    0.1-0.4, as the section said), 8.4 on code x50, the same on code x19."""
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS, DECODE_WINDOW]
    default, window = burst_default(files), read_runs(files, "fleetplan (ensemble) decode-window")
    drops: dict[str, list[float]] = {}
    for (workload, scale, sla), group in sorted(window.items()):
        if "shift" in workload and group["default"] is not None:
            (gpu, att), (gpu_w, att_w) = default[(workload, scale, sla)]["default"], group["default"]
            assert gpu_w <= gpu
            drops.setdefault(f"{workload.split('-')[1]} x{scale:g}", []).append(round(round(att * 100, 2) - round(att_w * 100, 2), 2))  # as printed
    assert drops == {"code x19": [0.0], "code x50": [8.37], "conv x27": [0.0], "conv x34": [0.0, 0.03, 0.01],
                     "conv x6": [0.27, 0.35, 0.18, 0.13]}  # Mooncake: mooncake-conv-30min


def test_decode_window_on_the_servegen_days_is_the_documented_loss():
    """docs/sizing.md: every day meets less for fewer GPU-hours, and two won days become ties."""
    files = [*HISTORIC, DECODE_WINDOW]
    default = requests_default(files)
    window = read_runs(files, "fleetplan (ensemble) decode-window")
    days = sorted(key for key, group in window.items() if key[0].startswith("servegen") and group["default"])
    assert len(days) == 10
    changed = {}
    for key in days:
        (gpu_d, att_d), (gpu_w, att_w) = default[key]["default"], window[key]["default"]
        assert att_w < att_d and gpu_w < gpu_d
        before, after = (verdict(g["default"], g["refs"], TIE_POINTS, TIE_COST)[0] for g in (default[key], window[key]))
        if before != after:
            changed[key[0]] = (before, after)
    assert changed == {"servegen-m-large-24h-day4-warm4d": ("won", "tie"),
                       "servegen-m-mid-24h-day6-warm6d": ("won", "tie")}


# docs/forecasting.md's "On an engine the defaults were not tuned on": the four traces on the 70B profile
OTHER_ENGINE = [VERDICTS.parent / "other-engine" / f"h100-70b-{sla}.json" for sla in ("2000-50", "500-50")]
LOOSE = (2000.0, 50.0)
# held out: the default of the day the rows were read (decode alone held); every role held since 2026-12-07
# turned conv x7.7 at 2000/50 from lost to a tie, read on these rows after the tally, so not held out
ON_70B_HELD_OUT = {
    **{(f"{trace}-h100-llama3.3-70b", sla): (n, 0, 0)
       for trace, n in (("azure-code-30min", 5), ("mooncake-conv-30min", 3), ("mooncake-conv-30min-spread", 5))
       for sla in (SLA, LOOSE)},
    ("azure-conv-30min-h100-llama3.3-70b", SLA): (5, 0, 0),
    ("azure-conv-30min-h100-llama3.3-70b", LOOSE): (0, 0, 5),
}
ON_70B = {**ON_70B_HELD_OUT, ("azure-conv-30min-h100-llama3.3-70b", LOOSE): (0, 1, 4)}


@pytest.mark.parametrize(("default", "expected", "totals"), [
    ("today's", ON_70B, (31, 1, 4)), ("held out", ON_70B_HELD_OUT, (31, 0, 5))])
def test_on_the_engine_the_defaults_were_not_tuned_on_conv_at_the_loose_ttft_is_what_loses(default, expected, totals):
    assert sorted((VERDICTS.parent / "other-engine").glob("h100-70b-[0-9]*.json")) == OTHER_ENGINE
    rows = [row for path in OTHER_ENGINE for row in json.loads(path.read_text())["rows"]]
    assert {row["profile"] for row in rows} == {"h100-llama3.3-70b"}
    groups = read_runs(OTHER_ENGINE, "fleetplan (ensemble)") if default == "today's" else decode_held(OTHER_ENGINE)
    assert workload_tallies(groups) == expected
    assert tuple(map(sum, zip(*expected.values(), strict=True))) == totals


@pytest.mark.parametrize("engine", ["8b", "70b"])
def test_every_role_held_meets_more_for_more_and_wins_one_verdict_more(engine):
    """docs/sizing.md: hold_until_scored: all, the default since 2026-12-07, measured with the floor's margin.
    On the 44 trace rows it moved 21 and wins one verdict more (22/10/12 against 21/11/12); on the 70B it
    moved 26 of 36 and turns conv x7.7 at 2000/50 from lost to a tie (31/1/4 against 31/0/5). A moved row
    spends up to 1.2 GPU-hours more (one 70B row 0.0003 less) and meets up to 7.44 points more, or
    within 0.14 points less (three rows)."""
    files = [*RECORDED, *SHAPE_KEPT, *DRAWS] if engine == "8b" else OTHER_ENGINE
    kept = read_runs([HOLD_DECODE_FILES[0] if engine == "8b" else HOLD_DECODE_70B], HOLD_DECODE)
    before, after = decode_held(files), read_runs(files, "fleetplan (ensemble)")
    traces = {key: after[key] for key in kept}
    moved = moved_rows(before, traces, traces).values()
    totals = tuple(trace_tally(traces).values())
    assert (len(traces), len(moved), totals) == {"8b": (44, 21, TRACE_TALLY), "70b": (36, 26, (31, 1, 4))}[engine]
    assert all(-0.15 < points < 7.45 and -0.001 < gpu < 1.201 for gpu, points in moved)
    assert sum(points < 0 for _, points in moved) == {"8b": 1, "70b": 2}[engine]


def test_every_role_held_moves_the_servegen_days_by_a_hundredth_of_a_point_at_most():
    """docs/sizing.md: with hold_until_scored: all, m-large's day-0 rows and m-mid's warm days are the
    rows of decode alone held to the bit, and m-mid's day-0 two move by at most 0.01 points and 0.8
    GPU-hours; m-large's warm days cannot be held (no quantile pool is empty after their warm-up)."""
    files = [*(VERDICTS / name for name in ("servegen-500-50.json", "servegen-warm-500-50.json")),
             VERDICTS.parent / "draws" / "servegen-500-50.json"]
    kept = read_runs([HOLD_DECODE_FILES[1]], HOLD_DECODE)
    before, after = decode_held(files), read_runs(files, "fleetplan (ensemble)")
    held = {key: after[key] for key in kept}
    moved = moved_rows(before, held, held)
    assert (len(held), sorted(key[0] for key in moved)) == (12, ["servegen-m-mid-24h", "servegen-m-mid-24h-seed1"])
    assert all(abs(points) < 0.015 and abs(gpu) < 0.8 for gpu, points in moved.values())
    day0 = [group for key, group in held.items() if "warm" not in key[0]]
    assert len(day0) == 6
    assert all(verdict(group["default"], group["refs"], TIE_POINTS, TIE_COST)[0] == "won" for group in day0)


# docs/forecasting.md's "The same traces on the 70B at TP4": an engine held out for every default
ON_TP4 = [VERDICTS.parent / "other-engine" / f"h100-70b-tp4-{sla}.json" for sla in ("1200-50", "500-50")]
TP4_LOOSE = (1200.0, 50.0)
TP4_TALLY = {
    **{("azure-code-30min-h100-llama3.3-70b-tp4", sla): (5, 0, 0) for sla in (SLA, TP4_LOOSE)},
    **{("mooncake-conv-30min-h100-llama3.3-70b-tp4", sla): (3, 0, 0) for sla in (SLA, TP4_LOOSE)},
    ("mooncake-conv-30min-spread-h100-llama3.3-70b-tp4", SLA): (5, 0, 0),
    ("mooncake-conv-30min-spread-h100-llama3.3-70b-tp4", TP4_LOOSE): (0, 0, 5),
    **{("azure-conv-30min-h100-llama3.3-70b-tp4", sla): (0, 0, 5) for sla in (SLA, TP4_LOOSE)},
}


@pytest.mark.parametrize("default", ["fleetplan (ensemble)", HOLD_DECODE])
def test_on_the_70b_at_tp4_conv_is_lost_at_both_slas_with_either_hold(default):
    """docs/forecasting.md: 21 won, 15 lost on the TP4 engine, the same with decode alone held; every role
    held moved 25 of the 36 rows and no conv row."""
    rows = [row for path in ON_TP4 for row in json.loads(path.read_text())["rows"]]
    assert {(row["profile"], row["tp"]) for row in rows} == {("h100-llama3.3-70b", 4)}
    assert workload_tallies(read_runs(ON_TP4, default)) == TP4_TALLY
    assert tuple(map(sum, zip(*TP4_TALLY.values(), strict=True))) == (21, 0, 15)
    now, decode = read_runs(ON_TP4, "fleetplan (ensemble)"), read_runs(ON_TP4, HOLD_DECODE)
    moved = moved_rows(decode, now, now)
    assert len(moved) == 25 and not any(workload.startswith("azure-conv") for workload, _, _ in moved)


# docs/calibration.md's "Past the measured usage": the TP4 conv rows again, the engine's decode levels
# carried on past the profile's rows (bench/sizing.py --engine-timing interp-extend)
EXTEND_TP4 = [VERDICTS.parent / "engine-timing" / f"h100-70b-tp4-{sla}.json" for sla in ("1200-50", "500-50")]


def test_on_the_70b_at_tp4_conv_is_lost_whichever_guess_the_engine_makes_past_its_rows():
    """docs/forecasting.md: with the other guess past the profile's rows the ten conv verdicts are lost
    as with the simulator's own, at the same rate scales."""
    rows = [row for path in EXTEND_TP4 for row in json.loads(path.read_text())["rows"]]
    assert {(row["profile"], row["tp"], row["timing"]) for row in rows} == {("h100-llama3.3-70b", 4, "interp-extend")}
    conv = "azure-conv-30min-h100-llama3.3-70b-tp4"
    held = [row for path in ON_TP4 for row in json.loads(path.read_text())["rows"] if row["workload"].startswith(conv)]
    assert {(r["workload"].replace("-extend", ""), r["scale"]) for r in rows} == {(r["workload"], r["scale"]) for r in held}
    assert workload_tallies(read_runs(EXTEND_TP4, "fleetplan (ensemble)")) == {
        (f"{conv}-extend", sla): (0, 0, 5) for sla in (SLA, TP4_LOOSE)}


def _without_extend(tallies: dict[tuple, tuple[int, int, int]]) -> dict[tuple, tuple[int, int, int]]:
    return {(workload.replace("-extend", ""), sla): counts for (workload, sla), counts in tallies.items()}


@pytest.mark.parametrize(("extended", "interp"), [
    (["h100-70b-500-50.json"], [VERDICTS.parent / "other-engine" / "h100-70b-500-50.json"]),
    (["h200-8b-mooncake-500-50.json"], [VERDICTS / "mooncake-500-50.json", VERDICTS.parent / "draws" / "mooncake-500-50.json",
                                        VERDICTS.parent / "engine-timing" / "h200-8b-mooncake-spread-interp-500-50.json"]),
])
def test_no_verdict_rests_on_how_the_engine_is_timed_past_its_profiles_rows(extended, interp):
    """docs/calibration.md's "Past the measured usage": the 70B TP2's conv and code rows and the 8B's
    Mooncake rows, on interp-extend, give each workload the verdicts they have on interp."""
    paths = [VERDICTS.parent / "engine-timing" / name for name in extended]
    rows = [row for path in paths for row in json.loads(path.read_text())["rows"]]
    assert {row["timing"] for row in rows} == {"interp-extend"}
    now = _without_extend(workload_tallies(read_runs(paths, "fleetplan (ensemble)")))
    before = workload_tallies(read_runs(interp, "fleetplan (ensemble)"))
    assert now == {key: before[key] for key in now}
    assert sum(map(sum, now.values())) == 10


# docs/sizing.md's "Prefill's rate under a backlog": the default with prefill_capacity: backlog (the rate
# count) and backlog_all (the queueing floor too), their rows read against the committed reference sweeps
# (bench/results/prefill-capacity)
PREFILL_CAPACITY = VERDICTS.parent / "prefill-capacity"
BACKLOG, BACKLOG_ALL = "fleetplan (ensemble) backlog", "fleetplan (ensemble) backlog-all"
BACKLOG_ENGINES = [  # each engine's trace verdict rows, the default's tally (won, tie, lost) and backlog's
    ([*RECORDED, *SHAPE_KEPT, *DRAWS], "h200-8b-*.json", (22, 10, 12), (22, 9, 13)),
    (OTHER_ENGINE, "h100-70b-[0-9]*.json", (31, 1, 4), (31, 1, 4)),
    (ON_TP4, "h100-70b-tp4-*.json", (21, 0, 15), (22, 0, 14)),
]
# the ServeGen days' day-0 rows (on the 70B at TP2), and their warm days (days 4-6 at seeds 0 and 1)
BACKLOG_DAY0 = [VERDICTS / "servegen-500-50.json", VERDICTS.parent / "draws" / "servegen-500-50.json",
                PREFILL_CAPACITY / "backlog" / "servegen-500-50.json"]
BACKLOG_WARM = [VERDICTS / "servegen-warm-500-50.json", VERDICTS.parent / "draws" / "servegen-500-50.json",
                PREFILL_CAPACITY / "backlog" / "servegen-warm-500-50.json"]
BACKLOG_MOVED = {  # (workload, scale, SLA): the verdict before and with backlog
    ("azure-conv-30min-seed1", 35.7, SLA): ("lost", "lost"),
    ("azure-conv-30min-seed2", 35.7, SLA): ("tie", "lost"),
    ("azure-conv-30min-h100-llama3.3-70b-seed1", 7.0, LOOSE): ("lost", "lost"),
    ("azure-conv-30min-h100-llama3.3-70b-seed2", 7.0, LOOSE): ("lost", "lost"),
    ("azure-conv-30min-h100-llama3.3-70b-tp4", 10.8, TP4_LOOSE): ("lost", "lost"),
    ("azure-conv-30min-h100-llama3.3-70b-tp4", 13.2, TP4_LOOSE): ("lost", "won"),
    ("azure-conv-30min-h100-llama3.3-70b-tp4-seed1", 12.0, TP4_LOOSE): ("lost", "lost"),
    ("servegen-m-large-24h", 0.1543, SLA): ("won", "won"),  # 0.9x of 0.1714, as the rows are keyed
}


def _backlog_runs(files: list[Path], pattern: str, default: str) -> dict[tuple, dict]:
    """The engine's trace rows (not the ServeGen days, which the backlog rows do not cover) with ``default``'s row."""
    runs = read_runs([*files, *sorted((PREFILL_CAPACITY / "backlog").glob(pattern))], default)
    return {key: group for key, group in runs.items() if not key[0].startswith("servegen")}


def _tally(groups: dict[tuple, dict]) -> tuple[int, int, int]:
    return tuple(sum(counts[i] for counts in workload_tallies(groups).values()) for i in range(3))


def _verdict(group: dict) -> str:
    return verdict(group["default"], group["refs"], TIE_POINTS, TIE_COST)[0]


@pytest.mark.parametrize(("files", "pattern", "best", "backlog"), BACKLOG_ENGINES)
def test_the_backlog_rate_count_tallies_the_docs_state_on_every_engine(files, pattern, best, backlog):
    """Every trace verdict row of the engine, run with the rate count at the backlogged rate."""
    before, now = (_backlog_runs(files, pattern, default) for default in ("fleetplan (ensemble)", BACKLOG))
    assert (_tally(before), _tally(now)) == (best, backlog)
    assert len(now) == sum(best) and all(group["default"] for group in now.values())  # a row for every verdict


def test_the_backlog_rate_count_moves_eight_rows_of_122_and_none_meets_less():
    before, now = {}, {}
    for files, pattern, _, _ in BACKLOG_ENGINES:
        before |= _backlog_runs(files, pattern, "fleetplan (ensemble)")
        now |= _backlog_runs(files, pattern, BACKLOG)
    day0 = {key: group for key, group in read_runs(BACKLOG_DAY0, BACKLOG).items() if group["default"]}
    assert len(day0) == 6 and all(_verdict(group) == "won" for group in day0.values())
    before |= {key: read_runs(BACKLOG_DAY0, "fleetplan (ensemble)")[key] for key in day0}
    now |= day0
    assert len(now) == 122
    moved = {key: (_verdict(before[key]), _verdict(group)) for key, group in now.items()
             if group["default"] != before[key]["default"]}
    assert {(w, round(scale, 6), sla): v for (w, scale, sla), v in moved.items()} == BACKLOG_MOVED
    for key in moved:
        (gpu0, att0), (gpu, att) = before[key]["default"], now[key]["default"]
        assert att >= att0 and gpu > gpu0, key


# The reference's forecasting swept again with the backlogged rate too (bench/results/prefill-capacity/
# reference-backlog): every trace verdict row of the three engines, the 8B's 44, TP2's 36 and TP4's
# 36, and ServeGen m-large's 10 verdict rows (day 0 and the warm days, at the settings the best batch's
# rows ran); not m-mid's 8. Per file: the committed files with the default's backlogged rows, and the
# tally (won, tie, lost) of the rows with prefill at its best batch on both sides, the default with the
# backlogged rate against the reference at its best batch, and both at the backlogged rate
REFERENCE_BACKLOG = PREFILL_CAPACITY / "reference-backlog"


def _backlogged(files: list[Path], *names: str) -> list[Path]:
    return [*files, *(PREFILL_CAPACITY / "backlog" / name for name in names)]


M_LARGE_DAYS = [path for path in [*RECORDED, *DRAWS] if path.name.startswith("servegen")]
EQUAL_SIZING = [
    ("h100-70b-tp4-1200-50.json", _backlogged(ON_TP4, "h100-70b-tp4-1200-50.json"), (8, 0, 10), (9, 0, 9), (8, 0, 10)),
    ("h100-70b-tp4-500-50.json", _backlogged(ON_TP4, "h100-70b-tp4-500-50.json"), (13, 0, 5), (13, 0, 5), (13, 0, 5)),
    ("h200-8b-500-50.json", _backlogged([*RECORDED, *SHAPE_KEPT, *DRAWS], "h200-8b-500-50.json"),
     (17, 7, 12), (17, 6, 13), (16, 7, 13)),
    ("h200-8b-200-20.json", _backlogged(RECORDED, "h200-8b-200-20.json"), (5, 3, 0), (5, 3, 0), (5, 3, 0)),
    ("h100-70b-2000-50.json", _backlogged(OTHER_ENGINE, "h100-70b-2000-50.json"), (13, 1, 4), (13, 1, 4), (13, 0, 5)),
    ("h100-70b-500-50.json", _backlogged(OTHER_ENGINE, "h100-70b-500-50.json"), (18, 0, 0), (18, 0, 0), (18, 0, 0)),
    ("servegen-m-large-500-50.json",
     _backlogged(M_LARGE_DAYS, "servegen-500-50.json", "servegen-warm-500-50.json"), (10, 0, 0), (10, 0, 0), (10, 0, 0)),
]


def _settings(rows, key: tuple) -> set[str]:
    return {row["policy"].removesuffix(" backlog") for row in rows if row["policy"].startswith("reference")
            and (row["workload"], round(row["scale"], 4), tuple(row["sla"])) == key}


@pytest.mark.parametrize(("name", "files", "best", "against_best", "equal"), EQUAL_SIZING)
def test_with_the_backlogged_rate_on_both_sides_no_verdict_is_won_that_the_best_batch_lost(
        name, files, best, against_best, equal):
    """docs/sizing.md: the reference's forecasting gains from the backlogged rate as much as the default
    (TP4's conv ×10.8 at 1200/50: 99.98 % for 20.35 GPU-hours at 0.8, where at its best batch 0.8 met
    89.26 %), so ×13.2's win was the rate's, not the forecast's; the 8B's conv ×35.7 seed 2 stays lost,
    its code ×50 is a tie, not won, and the 70B's conv ×7.7 at 2000/50 lost, not tied. ServeGen m-large's
    rows stay won: the reference meets at most 2.31 points more there, the default's rows do not move."""
    swept = json.loads((REFERENCE_BACKLOG / name).read_text())["rows"]
    rerun = {(row["workload"], round(row["scale"], 4), tuple(row["sla"])) for row in swept}
    readings = [read_runs([*files, REFERENCE_BACKLOG / name], default, sizing) for default, sizing in
                (("fleetplan (ensemble)", None), (BACKLOG, None), (BACKLOG, "backlog"))]
    tallies = []
    for groups in readings:
        verdicts = [_verdict(groups[key]) for key in rerun]
        tallies.append(tuple(verdicts.count(v) for v in ("won", "tie", "lost")))
    assert tallies == [best, against_best, equal]
    committed = [row for path in files for row in json.loads(path.read_text())["rows"]]
    for key in rerun:  # on the traces every predictor's sweep; on the days the settings the best batch's rows ran
        if key[0].startswith("servegen"):
            assert _settings(committed, key) == _settings(swept, key), key
        else:
            assert len(readings[2][key]["refs"]) == 4, key


def _reference_gains(name: str, files: list[Path]) -> list[float]:
    """Each reference setting's attainment with the backlogged rate less its attainment at the best batch
    (where the committed sweep ran that setting: at the 8B's conv ×35.7 seed 0 it ran 0.9 and 0.8 only)."""
    def key(row: dict) -> tuple:
        return row["workload"], row["scale"], tuple(row["sla"]), row["policy"].removesuffix(" backlog")
    best_batch = {key(row): row["attainment"] for path in files for row in json.loads(path.read_text())["rows"]}
    return [row["attainment"] - best_batch[key(row)]
            for row in json.loads((REFERENCE_BACKLOG / name).read_text())["rows"] if key(row) in best_batch]


def test_the_backlogged_reference_meets_up_to_27_points_more_and_at_most_a_third_of_one_less():
    """At every setting both sweeps ran; the most it loses is ServeGen m-large's day 0 at seed 1 (Kalman
    at 0.7, 3.5 GPU-hours more, its fleet on another path through the day), on the traces spread Mooncake
    on the 70B at 0.9× and 2000/50 (the constant at 0.55), 0.16 points for 0.10 GPU-hours more."""
    gains = [gain for name, files, *_ in EQUAL_SIZING for gain in _reference_gains(name, files)]
    assert len(gains) == 2655 and round(max(gains) * 100, 1) == 27.6 and round(min(gains) * 100, 2) == -0.32


def _warm_decisions(policy: str) -> dict[tuple, list]:
    return {(row["workload"], row["scale"]): row["decisions"] for path in BACKLOG_WARM
            for row in json.loads(path.read_text())["rows"] if row["policy"] == policy and "warm" in row["workload"]}


def test_the_backlog_rate_count_leaves_the_warm_servegen_days_to_the_bit():
    """The 12 warm-day verdicts (run after the 122): every row the default's, attainment, spend and decisions."""
    now = {key: group for key, group in read_runs(BACKLOG_WARM, BACKLOG).items() if group["default"]}
    before = read_runs(BACKLOG_WARM, "fleetplan (ensemble)")
    assert len(now) == 12 and all("warm" in key[0] for key in now)
    assert all(group["default"] == before[key]["default"] for key, group in now.items())
    assert _tally(now) == (10, 1, 1)
    backlog, default = _warm_decisions(BACKLOG), _warm_decisions("fleetplan (ensemble)")
    assert len(backlog) == 12 and backlog == {key: default[key] for key in backlog}


BACKLOG_ALL_TALLIES = [
    ([PREFILL_CAPACITY / "backlog-all" / "h100-70b-tp4-1200-50.json", *ON_TP4],
     ("azure-conv-30min-h100-llama3.3-70b-tp4", TP4_LOOSE), (0, 0, 5), (0, 1, 4)),
    ([PREFILL_CAPACITY / "backlog-all" / "h100-70b-tp4-500-50.json", *ON_TP4],
     ("azure-conv-30min-h100-llama3.3-70b-tp4", SLA), (0, 0, 5), (0, 0, 5)),
    ([PREFILL_CAPACITY / "backlog-all" / "h200-8b-500-50.json", VERDICTS / "azure-conv-500-50.json"],
     ("azure-conv-30min", SLA), (1, 2, 2), (1, 2, 2)),
    ([PREFILL_CAPACITY / "backlog-all" / "h200-8b-500-50.json", VERDICTS / "azure-code-500-50.json",
      VERDICTS.parent / "draws" / "code-500-50.json"], ("azure-code-30min", SLA), (2, 1, 6), (1, 2, 6)),
]


@pytest.mark.parametrize(("files", "key", "best", "backlog_all"), BACKLOG_ALL_TALLIES)
def test_the_backlog_rate_everywhere_meets_more_on_a_loose_ttft_and_spends_more_elsewhere(files, key, best, backlog_all):
    """The verdicts docs/sizing.md gives, each row's default run both ways, and no row meeting less."""
    for default, counts in (("fleetplan (ensemble)", best), (BACKLOG_ALL, backlog_all)):
        assert workload_tallies(read_runs(files, default))[key] == counts
    now, before = read_runs(files, BACKLOG_ALL), read_runs(files, "fleetplan (ensemble)")
    rows = [k for k in now if (k[0].replace("-seed1", "").replace("-seed2", ""), k[2]) == key]
    assert len(rows) == (9 if key[0] == "azure-code-30min" else 5)  # code at three levels and three draws
    for k in rows:
        (gpu0, att0), (gpu, att) = before[k]["default"], now[k]["default"]
        assert att >= att0 and gpu >= gpu0 - 0.005, k
