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
  which promises nothing (models/quantiles.py);
- with ``burst_sizing: queueing``, the window's own P90 (what prefill's
  rate count sized for) against the busiest window of the horizon.

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
    sized, window = _Misses(), _Misses()
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
        end = t + horizon * interval_s
        sized.add(_peak(times, burst, t, end) / burst > row["sized_rps"], row)
        if "window_sized_rps" in row:
            window.add(_peak(times, interval_s, t, end, aligned_at=t) / interval_s > row["window_sized_rps"], row)
    if not point_errors and not sized.counts["scored"]:
        return None
    out: dict = {
        "interval_s": interval_s,
        "point": {
            "scored": len(point_errors),
            "mape_pct": 100.0 * sum(point_errors) / len(point_errors) if point_errors else None,
            "under_share": under / len(point_errors) if point_errors else None,
        },
    }
    if sized.counts["scored"]:
        out["sized"] = {"quantile": quantile, "burst_s": burst, **sized.summary()}
        # the planner's own score of its conformal quantiles at its last tick (models/quantiles.py
        # ``exceedances``): what a live deployment reports, beside the simulator's count
        live = next((row["quantile_exceeded"] for row in reversed(ticks) if "quantile_exceeded" in row), None)
        if live is not None:
            out["sized"]["planner_exceeded"], out["sized"]["planner_scored"] = live
    if window.counts["scored"]:
        out["window"] = {"quantile": quantile, **window.summary()}
    return out


class _Misses:
    """How often a sized rate was exceeded, over all scored ticks and over the conformal ones."""

    def __init__(self) -> None:
        self.counts = {"scored": 0, "exceeded": 0, "calibrated_scored": 0, "calibrated_exceeded": 0}

    def add(self, missed: bool, row: dict) -> None:
        self.counts["scored"] += 1
        self.counts["exceeded"] += missed
        if row.get("quantile_calibrated"):
            self.counts["calibrated_scored"] += 1
            self.counts["calibrated_exceeded"] += missed

    def summary(self) -> dict:
        c = self.counts
        return {
            **c, "exceeded_share": c["exceeded"] / c["scored"],
            "calibrated_exceeded_share": c["calibrated_exceeded"] / c["calibrated_scored"]
            if c["calibrated_scored"] else None,
        }


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
        parts.append(_misses_text(f"{q} of the busiest {sized['burst_s']:g} s over the startup horizon", sized))
    window = coverage.get("window")
    if window:
        parts.append(_misses_text(f"the window's own P{100 * window['quantile']:g} (prefill's rate count)", window))
    return "forecast: " + "; ".join(parts)


def _misses_text(what: str, misses: dict) -> str:
    text = f"{what} exceeded on {misses['exceeded']} of {misses['scored']} ticks"
    if misses["calibrated_scored"]:
        own = (f"; the planner's own count at its last tick, {misses['planner_exceeded']} of "
               f"{misses['planner_scored']}" if misses.get("planner_scored") else "")
        return text + f" ({misses['calibrated_exceeded']} of the {misses['calibrated_scored']} conformal ones{own})"
    return text + " (none conformal yet)"


def _count(times: list[float], start: float, end: float) -> int:
    return bisect_left(times, end) - bisect_left(times, start)


def _peak(times: list[float], burst: float, start: float, end: float, aligned_at: float = 0.0) -> int:
    """Arrivals in the busiest ``burst``-long sub-window of [start, end).

    Sub-windows are keyed floor((t - aligned_at) / burst): on the run's
    clock for burst sub-windows, as the core keys them; at the tick for the
    throughput windows that follow it.
    """
    best, k = 0, math.floor((start - aligned_at) / burst)
    while aligned_at + k * burst < end:
        lo, hi = aligned_at + k * burst, aligned_at + (k + 1) * burst
        best = max(best, _count(times, max(start, lo), min(end, hi)))
        k += 1
    return best
