"""How the planner's forecasts fared against the traffic that then arrived.

The throughput loop sizes each tick for two numbers: the point forecast of
the next window's request rate, and (with ``throughput_sizing:
startup_quantile``) the upper quantile of the busiest burst sub-window
over the startup horizon. A simulation knows what arrived after every
tick, so it can score both without hindsight leaking into the run:

- the point forecast against the next window's mean rate (absolute
  percentage error, and how often it was under);
- the sized rate against the busiest burst sub-window of the next
  ``horizon_windows`` windows. A P90 that is exceeded far more than 10 %
  of the time under-provisions; one never exceeded is paying for headroom
  it does not need. Ticks whose quantile was conformal (``calibrated``)
  are counted apart: before that the quantile is the largest ratio seen,
  which promises nothing (models/quantiles.py).

Sub-windows are aligned to multiples of the burst length on the run's
clock, as the core's are; ticks whose horizon runs past the end of the
workload are not scored.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence

__all__ = ["forecast_coverage", "run_coverage", "coverage_line"]


def forecast_coverage(
    ticks: Sequence[dict],
    arrivals: Iterable[float],
    *,
    end_s: float,
    interval_s: float,
    burst_s: float,
    quantile: float | None,
) -> dict | None:
    """Score the ticks' forecasts (rows of ``sim.runner.tick_row``) on the arrival times.

    ``burst_s`` is the core's burst sub-window (``PlannerConfig.burst_seconds``;
    0 sizes the window's mean) and ``quantile`` the sizing quantile (None when
    the run sizes the point). None when no tick can be scored.
    """
    burst = burst_s if burst_s > 0 else interval_s
    times = sorted(arrivals)
    point_errors: list[float] = []
    under = 0
    sized = {"scored": 0, "exceeded": 0, "calibrated_scored": 0, "calibrated_exceeded": 0}
    for row in ticks:
        t = row["t"]
        if "predicted_rps" in row and t + interval_s <= end_s:
            actual = _count(times, t, t + interval_s) / interval_s
            if actual > 0:
                point_errors.append(abs(row["predicted_rps"] - actual) / actual)
                under += row["predicted_rps"] < actual
        horizon = row.get("horizon_windows")
        if "sized_rps" not in row or horizon is None or t + horizon * interval_s > end_s:
            continue
        peak = _peak(times, burst, t, t + horizon * interval_s) / burst
        missed = peak > row["sized_rps"]
        sized["scored"] += 1
        sized["exceeded"] += missed
        if row.get("quantile_calibrated"):
            sized["calibrated_scored"] += 1
            sized["calibrated_exceeded"] += missed
    if not point_errors and not sized["scored"]:
        return None
    out: dict = {
        "interval_s": interval_s,
        "point": {
            "scored": len(point_errors),
            "mape_pct": 100.0 * sum(point_errors) / len(point_errors) if point_errors else None,
            "under_share": under / len(point_errors) if point_errors else None,
        },
    }
    if sized["scored"]:
        out["sized"] = {
            "quantile": quantile, "burst_s": burst, **sized,
            "exceeded_share": sized["exceeded"] / sized["scored"],
            "calibrated_exceeded_share": (
                sized["calibrated_exceeded"] / sized["calibrated_scored"] if sized["calibrated_scored"] else None
            ),
        }
    return out


def run_coverage(result, workload, config) -> dict | None:
    """``forecast_coverage`` of a planner run (``sim.runner.RunResult``) on its workload, with its config."""
    return forecast_coverage(
        result.ticks, (r.arrival_s for r in workload.requests()), end_s=workload.duration_s,
        interval_s=config.throughput_adjustment_interval_seconds, burst_s=config.burst_seconds,
        quantile=config.sizing_quantile if config.throughput_sizing == "startup_quantile" else None,
    )


def coverage_line(coverage: dict | None) -> str | None:
    """One line for the run's printed summary."""
    if coverage is None:
        return None
    point = coverage["point"]
    parts = []
    if point["scored"]:
        parts.append(
            f"point forecast off by {point['mape_pct']:.1f} % on average over {point['scored']} ticks "
            f"(under on {point['under_share']:.0%})"
        )
    sized = coverage.get("sized")
    if sized:
        q = "the sized rate" if sized["quantile"] is None else f"the P{100 * sized['quantile']:g}"
        text = (
            f"{q} of the busiest {sized['burst_s']:g} s over the startup horizon exceeded on "
            f"{sized['exceeded']} of {sized['scored']} ticks"
        )
        if sized["calibrated_scored"]:
            text += f" ({sized['calibrated_exceeded']} of the {sized['calibrated_scored']} conformal ones)"
        else:
            text += " (none conformal yet)"
        parts.append(text)
    return "forecast: " + "; ".join(parts)


def _count(times: list[float], start: float, end: float) -> int:
    return bisect_left(times, end) - bisect_left(times, start)


def _peak(times: list[float], burst: float, start: float, end: float) -> int:
    """Arrivals in the busiest burst sub-window (key floor(t / burst), as the core keys them) of [start, end)."""
    best, k = 0, math.floor(start / burst)
    while k * burst < end:
        best = max(best, _count(times, max(start, k * burst), min(end, (k + 1) * burst)))
        k += 1
    return best
