"""Verdicts of the default against the reference's forecasting, read off the reference's sweep.

Usage:

    .venv/bin/python bench/frontier.py RUN.json [RUN.json ...] [--default "fleetplan (ensemble)"] \\
        [--reference-sizing backlog] [--tie-points 0.15] [--tie-cost 0.03] [--pool | --by-draw]

The runs behind docs/forecasting.md's tables are committed:
``bench/frontier.py bench/results/verdicts/*.json`` prints their verdicts.

Reads the ``--json`` files of ``bench/sizing.py`` runs that hold the
default and ``reference forecast (P) utilU`` variants (``--variants
forecast-frontier``, or a subset of its settings), and prints, per
workload, rate scale and SLA, what docs/forecasting.md's verdict tables
state:

- each reference predictor's attainment at the default's GPU-hours, read
  linearly between the two nearest settings of its Pareto frontier over
  headroom (its best attainment for what it spends); past its most
  expensive setting, that setting's attainment if the sweep went down to
  utilisation ``FULL_SWEEP`` (0.5, the most headroom ``--variants
  forecast-frontier`` gives: more buys it nothing it was shown), and no
  reading otherwise, nor below its cheapest;
- the fewest GPU-hours at which its frontier reaches the default's
  attainment (to 0.01 points), likewise interpolated (none if it never
  does).

The verdict is **lost** where some predictor reaches the default's
attainment at ``--tie-cost`` (3 %) fewer GPU-hours or more, or beats its
attainment at the same GPU-hours by more than ``--tie-points`` (0.15
points); **won** where every predictor with a reading is more than
``--tie-points`` below it and none reaches its attainment for less;
otherwise a **tie** (**unread** where no predictor's sweep gives either
reading: run more of its settings). The reference's frontier is taken per workload and
load level with hindsight, so it is the stricter comparison: an operator
of the reference picks one headroom for all of them. ``--pool`` prints that
view instead: per workload and SLA, each policy's GPU-hours summed and
attainment averaged over the load levels the default ran at (policies that
ran at all of them; the draws of a workload count as levels), and its worst level. ``--by-draw`` adds, below the
verdicts, each row's verdict at every draw of its workload the runs hold
(``bench/sizing.py --seeds``: a workload drawn at seed N is named -seedN,
seed 0 keeps its name): whether a verdict is the policy's or one draw's; and then
each workload's verdicts counted over its levels and draws, and over every row.
``--reference-sizing backlog`` reads the sweep run with prefill at the default's
backlogged rate (``--variants forecast-frontier-backlog``): the committed sweeps
rate it at its best batch, the default before 2026-12-07.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

DRAW = re.compile(r"^(?P<workload>.+?)(?:-seed(?P<seed>[0-9]+))?$")
REFERENCE = re.compile(r"reference forecast \((?P<predictor>[^)]+)\) util(?P<util>[0-9.]+)(?: (?P<sizing>\S+))?$")
FULL_SWEEP = 0.5
MATCH = 1e-4
"""An attainment within this share (0.01 points, the tables' precision) of another reaches it."""
TIE_POINTS = 0.15
"""Attainment points within which the default and the reference are even (``--tie-points``)."""
TIE_COST = 0.03
"""Share of GPU-hours within which they are even (``--tie-cost``)."""
EVEN = 1e-9
"""Float slack on the comparisons with the thresholds: a gap of exactly ``--tie-points`` is even,
whatever its last bit (0.90 against 0.8985 came out won, 0.98 against 0.9815 lost), and exactly
``--tie-cost`` fewer GPU-hours loses (1.358 against 1.4 came out a tie)."""


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (GPU-hours, attainment) points no other point beats on both, cheapest first."""
    best: list[tuple[float, float]] = []
    for gpu, att in sorted(points, key=lambda p: (p[0], -p[1])):
        if not best or att > best[-1][1]:
            best.append((gpu, att))
    return best


def attainment_at(front: list[tuple[float, float]], gpu: float, swept: bool) -> float | None:
    """The frontier's attainment at ``gpu`` GPU-hours.

    None below its cheapest point, and past its dearest unless ``swept``
    (the sweep reached its most headroom, so spending more is not an option).
    """
    if not front or gpu < front[0][0]:
        return None
    for (g0, a0), (g1, a1) in zip(front, front[1:], strict=False):
        if g0 <= gpu <= g1:
            return a0 + (a1 - a0) * (gpu - g0) / (g1 - g0) if g1 > g0 else a1
    if gpu == front[-1][0]:
        return front[-1][1]  # a frontier of one point (the others dominated), read at it
    return front[-1][1] if swept else None


def cost_of(front: list[tuple[float, float]], att: float) -> float | None:
    """The fewest GPU-hours at which the frontier reaches ``att`` (None if it never does)."""
    att -= MATCH
    if front and front[0][1] >= att:
        return front[0][0]
    for (g0, a0), (g1, a1) in zip(front, front[1:], strict=False):
        if a0 < att <= a1:
            return g0 + (g1 - g0) * (att - a0) / (a1 - a0)
    return None


def verdict(default: tuple[float, float], sweeps: dict[str, list[tuple[float, float, float]]],
            tie_points: float, tie_cost: float) -> tuple[str, dict[str, tuple[float | None, float | None]]]:
    """('won' | 'tie' | 'lost' | 'unread', per predictor (attainment at the default's GPU-hours, cost of its attainment)).

    ``sweeps``: per reference predictor, its runs as (GPU-hours, attainment, utilisation).
    """
    gpu, att = default
    readings = {}
    for p, runs in sorted(sweeps.items()):
        front = pareto([(g, a) for g, a, _ in runs])
        swept = min(u for _, _, u in runs) <= FULL_SWEEP
        readings[p] = (attainment_at(front, gpu, swept), cost_of(front, att))
    if all(a is None and c is None for a, c in readings.values()):
        return "unread", readings  # the sweep neither spans the default's spend nor reaches its attainment
    cheaper = [c for _, c in readings.values() if c is not None and c <= gpu * (1.0 - tie_cost + EVEN)]
    diffs = [att - a for a, _ in readings.values() if a is not None]
    if cheaper or any(d < -tie_points / 100 - EVEN for d in diffs):
        return "lost", readings
    if diffs and all(d > tie_points / 100 + EVEN for d in diffs) and not any(
            c is not None and c < gpu for _, c in readings.values()):
        return "won", readings
    return "tie", readings


def read_runs(paths: list[Path], default: str, reference_sizing: str | None = None) -> dict[tuple, dict]:
    """Per (workload, rate scale, SLA): the default's (GPU-hours, attainment) and the reference sweeps.

    ``{"default": point or None, "refs": {predictor: [(GPU-hours, attainment, utilisation), ...]}}``.
    The sweeps are the ``reference forecast (P) utilU`` rows, or with ``reference_sizing`` S the
    ``reference forecast (P) utilU S`` ones (``backlog``: ``--variants forecast-frontier-backlog``).
    A file or row it cannot read is a ValueError naming the file, the row and what was expected.
    """
    groups: dict[tuple, dict] = {}
    for key, policy, point in _points(paths):
        group = groups.setdefault(key, {"default": None, "refs": {}})
        if policy == default:
            group["default"] = point
        elif (match := REFERENCE.match(policy)) and match["sizing"] == reference_sizing:
            group["refs"].setdefault(match["predictor"], []).append((*point, float(match["util"])))
    return groups


def pooled(paths: list[Path], default: str) -> dict[tuple, dict[str, tuple[float, float, float]]]:
    """Per (workload, SLA): each policy's (GPU-hours summed, mean attainment, worst attainment).

    Over the load levels the default ran at, for the policies that ran at every one of them:
    one setting held across load levels, as an operator of either would run it. The draws of
    a workload (-seedN, ``by_draw``) are levels of it too: an operator does not pick a setting
    per draw either.
    """
    runs: dict[tuple, dict[str, dict[tuple, tuple[float, float]]]] = {}
    for (workload, scale, sla), policy, point in _points(paths):
        drawn, seed = _draw(workload)
        runs.setdefault((drawn, sla), {}).setdefault(policy, {})[(scale, seed)] = point
    out = {}
    for key, policies in sorted(runs.items()):
        levels = set(policies.get(default, {}))
        if not levels:
            continue
        out[key] = {
            policy: (sum(by[s][0] for s in levels), sum(by[s][1] for s in levels) / len(levels),
                     min(by[s][1] for s in levels))
            for policy, by in sorted(policies.items()) if levels <= set(by)
        }
    return out


def by_draw(groups: dict[tuple, dict], tie_points: float, tie_cost: float) -> dict[tuple, dict[int, str]]:
    """Per (workload as drawn at seed 0, rate scale, SLA): the verdict at each draw the runs hold.

    ``groups`` is ``read_runs``'s; a workload named -seedN is draw N of the one without the suffix.
    Rows without the default, or without a reference sweep, have no verdict and are left out.
    """
    out: dict[tuple, dict[int, str]] = {}
    for (workload, scale, sla), group in sorted(groups.items()):
        if group["default"] is None or not group["refs"]:
            continue
        drawn, seed = _draw(workload)
        found = verdict(group["default"], group["refs"], tie_points, tie_cost)[0]
        out.setdefault((drawn, scale, sla), {})[seed] = found
    return {key: dict(sorted(draws.items())) for key, draws in out.items()}


VERDICT_KINDS = ("won", "tie", "lost")


def tally(draws: dict[tuple, dict[int, str]]) -> dict[tuple[str, tuple], dict[str, int]]:
    """Per (workload as drawn at seed 0, SLA): its verdicts counted over every load level and draw.

    ``draws`` is ``by_draw``'s. A status is read over a workload's levels and draws together, since
    one level at one draw can rest on a tenth of a point (docs/forecasting.md's glance table).
    """
    out: dict[tuple[str, tuple], dict[str, int]] = {}
    for (workload, _, sla), verdicts in draws.items():
        counts = out.setdefault((workload, sla), dict.fromkeys(VERDICT_KINDS, 0))
        for found in verdicts.values():
            counts[found] = counts.get(found, 0) + 1
    return dict(sorted(out.items()))


def _draw(workload: str) -> tuple[str, int]:
    """(the workload as drawn at seed 0, the seed): ``w-seed3`` is draw 3 of ``w``."""
    match = DRAW.match(workload)
    return match["workload"], int(match["seed"] or 0)


def _points(paths: list[Path]):
    """``((workload, rate scale, SLA), policy, (GPU-hours, attainment))`` per row of the runs."""
    for path in paths:
        try:
            rows = json.loads(path.read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: expected a bench/sizing.py --json file with 'rows' ({exc})") from exc
        for i, row in enumerate(rows):
            try:
                key = (row["workload"], round(row["scale"], 4), tuple(row["sla"]))
                point = (float(row["gpu_hours"]), float(row["attainment"]))
                policy = row["policy"]
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: row {i}: expected workload, scale, sla, policy, gpu_hours and "
                                 f"attainment ({exc!r})") from exc
            yield key, policy, point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="bench/sizing.py --json files")
    parser.add_argument("--default", default="fleetplan (ensemble)", help="the policy judged")
    parser.add_argument("--reference-sizing", metavar="S", default=None,
                        help="read the sweeps named 'reference forecast (P) utilU S' (e.g. backlog) instead")
    parser.add_argument("--tie-points", type=float, default=TIE_POINTS,
                        help="attainment points within which the two are even")
    parser.add_argument("--tie-cost", type=float, default=TIE_COST,
                        help="share of GPU-hours within which the two are even")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--pool", action="store_true",
                      help="one setting for every load level: totals over the levels instead of verdicts")
    view.add_argument("--by-draw", action="store_true",
                      help="also tally each row's verdicts over the draws of its workload (-seedN)")
    args = parser.parse_args()
    try:
        policies = {policy for _, policy, _ in _points(args.runs)}
        if args.default not in policies:  # a misspelled one printed an empty table, status 0
            parser.error(f"--default: no row of the runs is {args.default!r}; their policies: "
                         f"{', '.join(sorted(policies))}")
        if args.pool:
            print_pooled(pooled(args.runs, args.default))
            return
        groups = read_runs(args.runs, args.default, args.reference_sizing)
    except ValueError as exc:
        parser.error(str(exc))
    print("| workload | SLA | default | reference at the default's GPU-hours | "
          "its GPU-hours for the default's attainment | verdict |\n|---|---|---|---|---|---|")
    for (workload, scale, sla), group in sorted(groups.items()):
        if group["default"] is None or not group["refs"]:
            continue
        result, readings = verdict(group["default"], group["refs"], args.tie_points, args.tie_cost)
        gpu, att = group["default"]
        at = " / ".join(f"{p} {'–' if a is None else f'{a:.2%}'}" for p, (a, _) in readings.items())
        cost = " / ".join(f"{p} {'never' if c is None else f'{c:.2f}'}" for p, (_, c) in readings.items())
        print(f"| {workload} ×{scale:g} | {sla[0]:g}/{sla[1]:g} | {att:.2%} · {gpu:.2f} | {at} | {cost} | "
              f"**{result}** |")
    if args.by_draw:
        print_by_draw(by_draw(groups, args.tie_points, args.tie_cost))


def print_by_draw(draws: dict[tuple, dict[int, str]]) -> None:
    print("\n| workload | SLA | verdict by draw | won | tie | lost |\n|---|---|---|---:|---:|---:|")
    for (workload, scale, sla), verdicts in draws.items():
        each = ", ".join(f"{seed}: {v}" for seed, v in verdicts.items())
        counts = [sum(v == kind for v in verdicts.values()) for kind in VERDICT_KINDS]
        print(f"| {workload} ×{scale:g} | {sla[0]:g}/{sla[1]:g} | {each} | " + " | ".join(map(str, counts)) + " |")
    totals = tally(draws)
    print("\n| workload, every level and draw | SLA | verdicts | won | tie | lost |\n|---|---|---:|---:|---:|---:|")
    for (workload, sla), counts in totals.items():
        print(f"| {workload} | {sla[0]:g}/{sla[1]:g} | {sum(counts.values())} | "
              + " | ".join(str(counts[kind]) for kind in VERDICT_KINDS) + " |")
    every = {kind: sum(counts[kind] for counts in totals.values()) for kind in VERDICT_KINDS}
    rows = sum(sum(counts.values()) for counts in totals.values())  # an unread verdict counts here only
    print(f"| every row | | {rows} | " + " | ".join(str(every[kind]) for kind in VERDICT_KINDS) + " |")


def print_pooled(pools: dict[tuple, dict[str, tuple[float, float, float]]]) -> None:
    print("| workload | SLA | policy | GPU-hours, summed | attainment, mean | worst level |\n|---|---|---|---:|---:|---:|")
    for (workload, sla), policies in pools.items():
        for policy, (gpu, att, worst) in policies.items():
            print(f"| {workload} | {sla[0]:g}/{sla[1]:g} | {policy} | {gpu:.2f} | {att:.2%} | {worst:.2%} |")


if __name__ == "__main__":
    main()
