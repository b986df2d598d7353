"""Predictors one step ahead on the windows a planner sees over a ServeGen day.

    .venv/bin/python bench/forecast_day.py --data /work/shared/data \
        [--model m-large] [--scale S] [--interval 180] [--kinds constant,arima_frozen,arima]

``bench/forecast.py`` scores predictors on 10-minute curves; the planner
forecasts the throughput interval's windows (180 s by default) of the
traffic it is sized for. This generates the same day the quality bench
runs (``bench/quality.py --only m-large``: per-client arrivals, seed 0,
its rate scale unless ``--scale`` says otherwise), cuts it into windows, feeds each kind's
``TrafficForecaster`` one window at a time, and reports per kind: MAPE of
the count, how many windows were under-forecast by more than 20 %, and,
for the ARIMA kinds, the order the model ended with (the first window is
not scored: its forecast, 0, is made from nothing). It explains rows of
the quality table (why a predictor under-sizes a day), not a score to
optimise. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import Spec, build_workload, specs  # noqa: E402
from sizing import SCALES  # noqa: E402

from fleetplan.models.forecast import TrafficForecaster, bucket_traffic  # noqa: E402

UNDER = 0.8  # a window counts as under-forecast below 80 % of what arrived


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--model", default="m-large")
    parser.add_argument("--scale", type=float, default=None, help="rate scale (default: the quality bench's)")
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--interval", type=float, default=180.0, help="window length, s (the throughput interval)")
    parser.add_argument("--kinds", default="constant,arima_frozen,arima")
    args = parser.parse_args()
    (spec,) = specs(args.data, {args.model}, 10, 24, args.hours, choose=False)
    spec = Spec(**{**spec.__dict__, "scale": args.scale or SCALES.get(spec.name, spec.scale)})
    arrivals = [(r.arrival_s, r.input_tokens, r.output_tokens) for r in build_workload(spec).requests()]
    windows = bucket_traffic(arrivals, args.interval)
    print(f"{args.model} x{spec.scale:g}: {len(arrivals):,} requests, {len(windows)} windows of {args.interval:g} s\n")
    print(f"| kind | MAPE n % | windows under-forecast by > {1 - UNDER:.0%} | first of them | order at the end |")
    print("|---|---:|---:|---|---|")
    for kind in args.kinds.split(","):
        forecaster = TrafficForecaster(kind, prophet_interval_s=args.interval)
        errors, under = [], []
        for i, window in enumerate(windows):
            predicted = forecaster.forecast()[0]
            if i > 0 and window.num_req > 0:  # the first window's forecast is of nothing seen
                errors.append(abs(predicted - window.num_req) / window.num_req)
                if predicted < UNDER * window.num_req:
                    under.append(i)
            forecaster.observe(window)
        order = getattr(forecaster.predictors[0], "order", None)
        print(f"| {kind} | {100 * sum(errors) / len(errors):.1f} | {len(under)} | "
              f"{', '.join(map(str, under[:6]))} | {order if order is not None else ''} |")


if __name__ == "__main__":
    main()
