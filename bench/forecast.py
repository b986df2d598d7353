"""Benchmark load predictors one step ahead on real traffic ("measure first").

    .venv/bin/python bench/forecast.py --data /work/shared/data [--kinds a,b,...]
        [--series code-60,...] [--split test|dev] [--jobs 1] [--json out.json]

Every predictor kind is run through the planner's own ``TrafficForecaster``
(the same idle rules, three predictors for count, ISL and OSL), warmed on
the first part of a series and then, window by window, asked for the next
window before seeing it. Per series and kind it reports:

- loss: the reference's ``window_loss`` per window, averaged (lower is
  better; it is what the Dynamo simulation package scores predictors by);
- MAPE of the request count (windows with no requests are left out: the
  percentage error of a miss on zero is undefined);
- under: the share of windows whose count was under-forecast (an
  under-forecast is what costs SLA; an over-forecast costs GPUs);
- ms: the mean and max wall time of one ``forecast()`` (all three series).

Series (``--split test``, the figures in docs/forecasting.md):

- the Azure 2023 code and conv traces and the Mooncake conversation trace
  (each file is the first half hour of its trace) at 60 s and 180 s
  windows: warm up on the first half of the windows, score the rest;
- the ServeGen week-1 aggregate curves m-large, m-mid and m-small at their
  10-minute windows (count = rate x 600 s; ISL/OSL from the 6-hour means):
  warm up on days 0-3, score days 4-6.

``--split dev`` scores only data that ``test`` never scores (the trace
first halves at 30 s and 60 s, ServeGen days 0-3, the one-day deepseek-r1
and mm-image curves, and days 0-3 of the three busiest clients of each
week-1 model): predictor defaults were chosen on it, so
the test figures are not tuned on what they score.

Not a test: nothing asserts. Bench code reads the shared data; the package
never does.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fleetplan.models import ensemble  # noqa: F401  (registers the "ensemble" kind)
from fleetplan.models import predictors as predictors_module
from fleetplan.models.forecast import (
    TrafficForecaster,
    TrafficObservation,
    bucket_traffic,
    window_loss,
)
from fleetplan.models.quantiles import DEFAULT_ADAPT_RATE, QuantileForecaster
from fleetplan.sim.traces import read_trace, trace_arrivals

REFERENCE_KINDS = ("constant", "arima_frozen", "arima", "kalman", "prophet")
DAY_S = 86_400
SERVEGEN_WINDOW_S = 600

TRACES = {
    "azure-code": "traces/azure2023/AzureLLMInferenceTrace_code_first30min.csv",
    "azure-conv": "traces/azure2023/AzureLLMInferenceTrace_conv_first30min.csv",
    "mooncake-conv": "traces/mooncake/conversation_trace_first30min.jsonl",
}
SERVEGEN_WEEK = ("m-large", "m-mid", "m-small")
SERVEGEN_DAY = ("deepseek-r1", "mm-image")


@dataclass(frozen=True)
class Series:
    """A window series and where its warm-up ends."""

    name: str
    interval_s: float
    windows: tuple[TrafficObservation, ...]
    warm: int  # windows [0, warm) warm the forecaster; the rest are scored


# --- data --------------------------------------------------------------------


def trace_windows(data: Path, rel: str, interval_s: float) -> list[TrafficObservation]:
    return bucket_traffic(trace_arrivals(read_trace(data / rel)), interval_s)


def servegen_windows(data: Path, model: str) -> list[TrafficObservation]:
    """10-minute windows of a ServeGen aggregate curve with its 6-hour ISL/OSL."""
    base = data / "rates" / "servegen"
    with open(base / f"{model}_mean_isl_osl_6h.csv", newline="") as f:
        lengths = {
            int(float(row["window6h_start_s"])): (
                float(row["input_tokens"]),
                float(row["output_tokens"]),
            )
            for row in csv.DictReader(f)
        }
    starts = sorted(lengths)
    windows = []
    with open(base / f"{model}_aggregate_rate_10min.csv", newline="") as f:
        for row in csv.DictReader(f):
            t = float(row["t"])
            n = float(row["rate_rps"]) * SERVEGEN_WINDOW_S
            block = max(s for s in starts if s <= t)
            isl, osl = lengths[block]
            windows.append(
                TrafficObservation(
                    duration_s=SERVEGEN_WINDOW_S,
                    num_req=n,
                    isl=isl if n > 0 else 0.0,
                    osl=osl if n > 0 else 0.0,
                    start_s=t,  # the curve's clock is the time of day (t = 0 at midnight)
                )
            )
    return windows


def client_counts(data: Path, model: str, days: int) -> dict[str, list[float]]:
    """Each client's request count per 10-minute window of ``model`` over the first ``days`` days.

    Every client of the model, windows it was idle in included (zero); they
    sum to the aggregate curve's counts.
    """
    import gzip

    per_day = DAY_S // SERVEGEN_WINDOW_S
    counts: dict[str, list[float]] = {}
    with gzip.open(data / "rates" / "servegen" / "clients_rate_10min_week1.csv.gz", "rt") as f:
        for row in csv.DictReader(f):
            t = float(row["t"])
            if row["model"] != model or t >= days * DAY_S:
                continue
            series = counts.setdefault(row["client"], [0.0] * (days * per_day))
            series[int(t // SERVEGEN_WINDOW_S)] = float(row["rate"]) * SERVEGEN_WINDOW_S
    return counts


def busiest_clients(counts: dict[str, list[float]], top: int, windows: int) -> list[str]:
    """The ``top`` clients with the most requests in the first ``windows`` windows (ties by name)."""
    return sorted(counts, key=lambda c: (-math.fsum(counts[c][:windows]), c))[:top]


def client_windows(data: Path, model: str, days: int, top: int) -> list[list[TrafficObservation]]:
    """The ``top`` busiest clients' 10-minute windows of ``model`` over ``days`` days.

    Single tenants are burstier than the aggregate; ISL/OSL are the model's.
    """
    counts = client_counts(data, model, days)
    lengths = servegen_windows(data, model)
    out = []
    for client in busiest_clients(counts, top, days * (DAY_S // SERVEGEN_WINDOW_S)):
        out.append(
            [
                TrafficObservation(
                    SERVEGEN_WINDOW_S,
                    n,
                    lengths[i].isl if n > 0 else 0.0,
                    lengths[i].osl if n > 0 else 0.0,
                )
                for i, n in enumerate(counts[client])
            ]
        )
    return out


def test_series(data: Path) -> list[Series]:
    out = []
    for name, rel in TRACES.items():
        for interval in (60, 180):
            windows = trace_windows(data, rel, interval)
            out.append(Series(f"{name}-{interval}s", interval, tuple(windows), len(windows) // 2))
    per_day = DAY_S // SERVEGEN_WINDOW_S
    for model in SERVEGEN_WEEK:
        windows = servegen_windows(data, model)
        out.append(Series(f"servegen-{model}-10m", SERVEGEN_WINDOW_S, tuple(windows), 4 * per_day))
    return out


def dev_series(data: Path) -> list[Series]:
    """Data the test split never scores: tune on this, report on test."""
    out = []
    for name, rel in TRACES.items():
        for interval, warm in ((30, 10), (60, 5)):
            windows = trace_windows(data, rel, interval)
            first_half = windows[: len(windows) // 2]  # the test split warms on it
            out.append(Series(f"dev-{name}-{interval}s", interval, tuple(first_half), warm))
    per_day = DAY_S // SERVEGEN_WINDOW_S
    for model in SERVEGEN_WEEK:
        windows = servegen_windows(data, model)[: 4 * per_day]  # the test warm-up
        out.append(
            Series(f"dev-servegen-{model}-d0-3", SERVEGEN_WINDOW_S, tuple(windows), 2 * per_day)
        )
    for model in SERVEGEN_DAY:
        windows = servegen_windows(data, model)
        out.append(
            Series(f"dev-servegen-{model}", SERVEGEN_WINDOW_S, tuple(windows), len(windows) // 2)
        )
    for model in SERVEGEN_WEEK:
        for rank, windows in enumerate(client_windows(data, model, days=4, top=3)):
            name = f"dev-client-{model}-{rank + 1}"
            out.append(Series(name, SERVEGEN_WINDOW_S, tuple(windows), 2 * per_day))
    return out


# --- scoring -----------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    series: str
    kind: str
    windows: int
    loss: float
    mape: float
    under: float
    ms_mean: float
    ms_max: float
    # each scored window's loss, in order: a script that scores fewer of the windows
    # (bench/forecast_bound.py's "sees the next window" cannot score the last) compares
    # with the kinds on the windows it scored
    losses: tuple[float, ...] = ()


def score(kind: str, series: Series) -> Score:
    """One-step-ahead scores of ``kind`` on the scored part of ``series``."""
    forecaster = TrafficForecaster(kind, prophet_interval_s=float(series.interval_s))
    forecaster.warm(series.windows[: series.warm])
    losses, apes, unders, costs = [], [], [], []
    for actual in series.windows[series.warm :]:
        start = time.perf_counter()
        n_hat, isl_hat, osl_hat = forecaster.forecast()
        costs.append((time.perf_counter() - start) * 1e3)
        losses.append(
            window_loss((n_hat, isl_hat, osl_hat), (actual.num_req, actual.isl, actual.osl))
        )
        if actual.num_req > 0:
            apes.append(abs(n_hat - actual.num_req) / actual.num_req)
        unders.append(1.0 if n_hat < actual.num_req else 0.0)
        forecaster.observe(actual)
    return Score(
        series=series.name,
        kind=kind,
        windows=len(losses),
        loss=math.fsum(losses) / len(losses),
        mape=100.0 * math.fsum(apes) / len(apes) if apes else float("nan"),
        under=100.0 * math.fsum(unders) / len(unders),
        ms_mean=statistics.fmean(costs),
        ms_max=max(costs),
        losses=tuple(losses),
    )


def _score_task(args: tuple[str, Series]) -> Score:
    return score(*args)


@dataclass(frozen=True)
class Coverage:
    series: str
    kind: str
    windows: int
    calibrated: bool  # the P90 over HORIZON windows was conformal at the first scored window
    p50: float  # share of windows with n <= P50 (one window ahead), %
    p90: float  # share with n <= P90, %
    p90_h: float  # share with max(n over HORIZON windows) <= P90 of that max, %
    headroom: float  # mean P90 / point forecast
    adapt_rate: float = DEFAULT_ADAPT_RATE  # the quantiles' adaptive-level rate


HORIZON = 3
LONG_SERIES = 50  # scored windows a series needs before its coverage says anything


def coverage(kind: str, series: Series, q: float = 0.9, adapt_rate: float = DEFAULT_ADAPT_RATE) -> Coverage:
    """Held-out coverage of the quantile forecasts of ``kind`` on ``series``."""
    qf = QuantileForecaster(kind, adapt_rate=adapt_rate, prophet_interval_s=float(series.interval_s))
    qf.warm(series.windows[: series.warm])
    calibrated = qf.calibrated(q, HORIZON)
    scored = series.windows[series.warm :]
    counts = [w.num_req for w in scored]
    hits50, hits90, hits90h, headroom, spans = 0, 0, 0, [], 0
    for i, actual in enumerate(scored):
        p50 = qf.quantile(0.5, 1)
        upper = qf.quantiles(q, HORIZON)
        point = qf.forecast()[0]
        hits50 += counts[i] <= p50
        hits90 += counts[i] <= upper[0]
        if i + HORIZON <= len(scored):
            spans += 1
            hits90h += max(counts[i : i + HORIZON]) <= upper[-1]
        if point > 0:
            headroom.append(upper[0] / point)
        qf.observe(actual)
    n = len(scored)
    return Coverage(
        series=series.name,
        kind=kind,
        windows=n,
        calibrated=calibrated,
        p50=100.0 * hits50 / n,
        p90=100.0 * hits90 / n,
        p90_h=100.0 * hits90h / spans if spans else float("nan"),
        headroom=statistics.fmean(headroom) if headroom else float("nan"),
        adapt_rate=adapt_rate,
    )


def _coverage_task(args: tuple[str, Series, float]) -> Coverage:
    kind, series, rate = args
    return coverage(kind, series, adapt_rate=rate)


# --- report ------------------------------------------------------------------


def available_kinds(requested: list[str] | None) -> list[str]:
    known = predictors_module.predictor_kinds()
    if requested:
        unknown = [k for k in requested if k not in known]
        if unknown:
            sys.exit(f"unknown kind(s) {unknown}; known: {', '.join(known)}")
        kinds = requested
    else:
        extra = [k for k in known if k not in REFERENCE_KINDS]
        kinds = [k for k in REFERENCE_KINDS if k in known] + extra
    usable = []
    for kind in kinds:
        try:
            predictors_module.make_predictor(kind)
        except predictors_module.PredictorUnavailable:
            print(f"note: {kind} skipped (optional extra not installed)", file=sys.stderr)
            continue
        usable.append(kind)
    return usable


def markdown(scores: list[Score], kinds: list[str], series: list[Series]) -> str:
    by = {(s.series, s.kind): s for s in scores}
    reference = [k for k in kinds if k in REFERENCE_KINDS]
    lines = [
        "| series | scored | kind | loss | vs arima_frozen | vs best ref | MAPE n % | under % | ms mean | ms max |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in series:
        frozen = by.get((s.name, "arima_frozen"))
        best_ref = min((by[(s.name, k)].loss for k in reference if (s.name, k) in by), default=None)
        for kind in kinds:
            sc = by[(s.name, kind)]
            vs_frozen = f"{sc.loss / frozen.loss:.2f}" if frozen and frozen.loss > 0 else "-"
            vs_best = f"{sc.loss / best_ref:.2f}" if best_ref else "-"
            lines.append(
                f"| {s.name} | {sc.windows} | {kind} | {sc.loss:.4f} | {vs_frozen} | {vs_best} "
                f"| {sc.mape:.1f} | {sc.under:.0f} | {sc.ms_mean:.2f} | {sc.ms_max:.1f} |"
            )
    return "\n".join(lines)


def _mean(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else "-"


def _max(values: list[float]) -> str:
    return f"{max(values):.2f}" if values else "-"


def summary(scores: list[Score], kinds: list[str], series: list[Series]) -> str:
    """One row per kind: the loss ratio to arima_frozen and to the best reference, worst series."""
    by = {(s.series, s.kind): s for s in scores}
    reference = [k for k in kinds if k in REFERENCE_KINDS]
    lines = [
        "| kind | mean loss ratio vs arima_frozen | worst | mean ratio vs best ref | worst | series won |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        r_frozen, r_best, won = [], [], 0
        for s in series:
            sc = by[(s.name, kind)]
            if (s.name, "arima_frozen") in by and by[(s.name, "arima_frozen")].loss > 0:
                r_frozen.append(sc.loss / by[(s.name, "arima_frozen")].loss)
            others = [by[(s.name, k)].loss for k in reference if k != kind and (s.name, k) in by]
            if others:
                r_best.append(sc.loss / min(others))
                won += sc.loss <= min(others)
        lines.append(
            f"| {kind} | {_mean(r_frozen)} | {_max(r_frozen)} "
            f"| {_mean(r_best)} | {_max(r_best)} | {won}/{len(series)} |"
        )
    return "\n".join(lines)


def coverage_markdown(rows: list[Coverage]) -> str:
    lines = [
        f"| series | scored | kind | adapt rate | calibrated | n <= P50 % | n <= P90 % "
        f"| max of next {HORIZON} <= P90 % | P90 / point |",
        "|---|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for c in rows:
        lines.append(
            f"| {c.series} | {c.windows} | {c.kind} | {c.adapt_rate:g} | {'yes' if c.calibrated else 'no'} "
            f"| {c.p50:.0f} | {c.p90:.0f} | {c.p90_h:.0f} | {c.headroom:.2f} |"
        )
    return "\n".join(lines)


def calibration_summary(rows: list[Coverage]) -> str:
    """Per kind and adapt rate, over the series with at least LONG_SERIES scored windows:
    how far the P90s' coverage sits from 90 % on average, and the headroom it costs."""
    groups: dict[tuple[str, float], list[Coverage]] = {}
    for c in rows:
        if c.windows >= LONG_SERIES:
            groups.setdefault((c.kind, c.adapt_rate), []).append(c)
    lines = [
        f"| kind | adapt rate | series | mean abs(P90 coverage − 90) | mean abs(max of next {HORIZON} − 90) "
        "| worst | mean P90 / point |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (kind, rate), cs in sorted(groups.items()):
        gaps = [abs(c.p90 - 90.0) for c in cs]
        gaps_h = [abs(c.p90_h - 90.0) for c in cs]
        lines.append(
            f"| {kind} | {rate:g} | {len(cs)} | {statistics.fmean(gaps):.2f} | {statistics.fmean(gaps_h):.2f} "
            f"| {max(gaps + gaps_h):.1f} | {statistics.fmean(c.headroom for c in cs):.3f} |"
        )
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (traces/, rates/)")
    parser.add_argument("--kinds", help="comma-separated predictor kinds (default: all registered)")
    parser.add_argument("--series", help="comma-separated substrings of series names to keep")
    parser.add_argument("--split", choices=("test", "dev"), default="test")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--json", type=Path, help="also write the scores as JSON")
    parser.add_argument(
        "--quantile-kinds",
        default="ensemble",
        help="kinds whose P50/P90 coverage is measured ('' for none)",
    )
    parser.add_argument(
        "--adapt-rates",
        default=str(DEFAULT_ADAPT_RATE),
        help="comma-separated adaptive-level rates to measure the coverage at (0: plain split conformal)",
    )
    args = parser.parse_args(argv)

    kinds = available_kinds(args.kinds.split(",") if args.kinds else None)
    series = test_series(args.data) if args.split == "test" else dev_series(args.data)
    if args.series:
        keep = args.series.split(",")
        series = [s for s in series if any(k in s.name for k in keep)]
    tasks = [(kind, s) for s in series for kind in kinds]
    started = time.perf_counter()
    quantile_kinds = [k for k in args.quantile_kinds.split(",") if k]
    rates = [float(r) for r in args.adapt_rates.split(",") if r]
    quantile_tasks = [(kind, s, r) for s in series for kind in quantile_kinds for r in rates]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            scores = list(pool.map(_score_task, tasks))
            covered = list(pool.map(_coverage_task, quantile_tasks))
    else:
        scores = [_score_task(t) for t in tasks]
        covered = [_coverage_task(t) for t in quantile_tasks]
    elapsed = time.perf_counter() - started

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# forecast benchmark ({args.split}): {cpu_name()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, load average {load:.1f}, {elapsed:.0f} s\n"
    )
    print(markdown(scores, kinds, series))
    print()
    print(summary(scores, kinds, series))
    if covered:
        print()
        print(coverage_markdown(covered))
        print()
        print(calibration_summary(covered))
    if args.json:
        payload = {
            "scores": [s.__dict__ for s in scores],
            "coverage": [c.__dict__ for c in covered],
        }
        args.json.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
