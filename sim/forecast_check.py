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

With ``quantile_basis: tokens`` those quantiles are of tokens, in requests
of the lengths forecast at the tick (docs/sizing.md), and a count of
requests is not what they promise to cover: a sub-window is then read as
the most work any role's lengths give (its prompt tokens over the
forecast prompt, its answer tokens over the forecast answer), as the sized
rate is the most any role was sized for; the window's P90 (prefill's) on
its prompt tokens. With ``floor_tokens`` the sized rate is the larger of
the count's quantile and the prompt tokens' (prefill's queueing floor), so
a sub-window is read as the larger of its requests and its prompt tokens;
the window's P90, the rate count's, is of the count.

Sub-windows are aligned to multiples of the burst length on the run's
clock, as the core's are; ticks whose horizon runs past the end of the
workload are not scored.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import accumulate

from fleetplan.models.planner import work_series

__all__ = ["BASIS_TEXT", "forecast_coverage", "run_coverage", "coverage_line", "sized_basis"]

# the planner's quantile series (their suffixes, ``work_series``) as the arrivals' kinds of work
SERIES_KIND = {"": "requests", ":prompt": "isl", ":answer": "osl"}
# what a sized rate of each basis but the request count's is of, as the summary line and the report name it
BASIS_TEXT = {"tokens": "tokens, the most any role's", "floor_tokens": "requests or prefill's prompt tokens, the more"}


def forecast_coverage(
    ticks: Sequence[dict],
    arrivals: Iterable[float],
    *,
    end_s: float,
    interval_s: float,
    burst_s: float,
    quantile: float | None,
    work: tuple[str, ...] | None = None,
) -> dict | None:
    """Score the ticks' forecasts (rows of ``sim.runner.tick_row``) on the arrival times.

    ``burst_s`` is the core's burst sub-window (``PlannerConfig.burst_seconds``;
    0 sizes the window's mean) and ``quantile`` the sizing quantile (None when
    the run sizes the point). ``work`` (``quantile_basis: tokens``: the
    lengths the fleet's roles work on, ``"isl"`` and/or ``"osl"``;
    ``floor_tokens``: ``"requests"`` and ``"isl"``) scores the sized rate on
    the most of those kinds of work a sub-window brought, ``arrivals`` then
    being ``(time, isl, osl)``. None when no tick can be scored.
    """
    burst = burst_s if burst_s > 0 else interval_s
    if work is None:
        times, tokens = sorted(arrivals), {}
    else:
        rows = sorted((float(t), float(isl), float(osl)) for t, isl, osl in arrivals)
        times = [t for t, _, _ in rows]
        tokens = {"isl": _prefix(r[1] for r in rows), "osl": _prefix(r[2] for r in rows)}
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
        if work is None:
            peak = _peak(times, burst, t, end)
            window_peak = _peak(times, interval_s, t, end, aligned_at=t) if "window_sized_rps" in row else 0
        else:  # the busiest sub-window's work, in requests of the lengths forecast at the tick
            peak = max(_work_peak(times, tokens, row, k, burst, t, end) for k in work)
            window_kind = "requests" if "requests" in work else "isl"  # what prefill's rate count is of
            window_peak = _work_peak(times, tokens, row, window_kind, interval_s, t, end, aligned_at=t) \
                if "window_sized_rps" in row else 0
        sized.add(peak / burst > row["sized_rps"], row)
        if "window_sized_rps" in row:
            window.add(window_peak / interval_s > row["window_sized_rps"], row)
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
        if work is not None:  # of the roles' tokens, or of the count and prefill's prompt tokens
            out["sized"]["basis"] = _basis_of(work)
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
    work = _work_of(config)
    return forecast_coverage(
        result.ticks,
        (r.arrival_s if work is None else (r.arrival_s, r.input_tokens, r.output_tokens) for r in workload.requests()),
        end_s=workload.duration_s,
        interval_s=config.throughput_adjustment_interval_seconds, burst_s=config.burst_seconds,
        quantile=config.sizing_quantile if config.throughput_sizing == "startup_quantile" else None, work=work,
    )


def _work_of(config) -> tuple[str, ...] | None:
    """What the run's sizing quantile is of: None for the request count alone; else the kinds
    (``"requests"``, ``"isl"``, ``"osl"``) whose largest the sized rate covers.

    As the planner sizes them (``models.planner.work_series``): with
    ``quantile_basis: tokens`` prefill on the prompts, decode on the answers,
    an aggregated engine on both; with ``floor_tokens`` every role on the
    count and prefill's queueing floor on its prompt tokens too.
    """
    kinds = tuple(dict.fromkeys(SERIES_KIND[w] for series in work_series(config).values() for w in series))
    return None if kinds == ("requests",) else kinds


def sized_basis(config) -> str:
    """What the run's sized rate is of, as the planner applied its ``quantile_basis``: ``requests``,
    ``tokens``, or ``floor_tokens`` (``requests`` where no queueing floor took the burst apart)."""
    work = _work_of(config)
    return "requests" if work is None else _basis_of(work)


def _basis_of(work: tuple[str, ...]) -> str:
    return "floor_tokens" if "requests" in work else "tokens"


def _work_peak(times, tokens, row: dict, kind: str, burst: float, start: float, end: float,
               aligned_at: float = 0.0) -> float:
    """The busiest sub-window's ``kind`` tokens over the tick's forecast mean of them: requests of
    the forecast length. Where the tick forecast none, its requests, as the planner's ratio of 1."""
    value = 0.0 if kind == "requests" else row.get(f"predicted_{kind}") or 0.0
    if not (math.isfinite(value) and value > 0):
        return _peak(times, burst, start, end, aligned_at=aligned_at)
    return _peak(times, burst, start, end, aligned_at=aligned_at, tokens=tokens[kind]) / value


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
        basis = BASIS_TEXT.get(sized.get("basis"))
        of = f" ({basis})" if basis else ""
        parts.append(_misses_text(f"{q} of the busiest {sized['burst_s']:g} s{of} over the startup horizon", sized))
    window = coverage.get("window")
    if window:
        of = " of prompt tokens" if sized and sized.get("basis") == "tokens" else ""
        parts.append(_misses_text(f"the window's own P{100 * window['quantile']:g}{of} (prefill's rate count)", window))
    return "forecast: " + "; ".join(parts)


def _misses_text(what: str, misses: dict) -> str:
    text = f"{what} exceeded on {misses['exceeded']} of {misses['scored']} ticks"
    if misses["calibrated_scored"]:
        own = (f"; the planner's own count at its last tick, {misses['planner_exceeded']} of "
               f"{misses['planner_scored']}" if misses.get("planner_scored") else "")
        return text + f" ({misses['calibrated_exceeded']} of the {misses['calibrated_scored']} conformal ones{own})"
    return text + " (none conformal yet)"


def _count(times: list[float], start: float, end: float, tokens: list[float] | None = None) -> float:
    """Arrivals in [start, end); with ``tokens`` (``_prefix`` of their lengths), their tokens."""
    lo, hi = bisect_left(times, start), bisect_left(times, end)
    return hi - lo if tokens is None else tokens[hi] - tokens[lo]


def _prefix(values) -> list[float]:
    """Running sums, 0 first: the tokens of arrivals i..j are ``out[j] - out[i]``."""
    return list(accumulate(values, initial=0.0))


def _peak(times: list[float], burst: float, start: float, end: float, aligned_at: float = 0.0,
          tokens: list[float] | None = None) -> float:
    """Arrivals (their tokens, with ``tokens``) in the busiest ``burst``-long sub-window of [start, end).

    Sub-windows are keyed floor((t - aligned_at) / burst): on the run's
    clock for burst sub-windows, as the core keys them; at the tick for the
    throughput windows that follow it.
    """
    best, k = 0, math.floor((start - aligned_at) / burst)
    while aligned_at + k * burst < end:
        lo, hi = aligned_at + k * burst, aligned_at + (k + 1) * burst
        best = max(best, _count(times, max(start, lo), min(end, hi), tokens))
        k += 1
    return best
