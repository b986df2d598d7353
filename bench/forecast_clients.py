"""Forecast a ServeGen model's traffic client by client and sum, against forecasting the aggregate.

    .venv/bin/python bench/forecast_clients.py --data /work/shared/data [--kind ensemble] [--top 1,3,10,0]

ServeGen's finding (docs/forecasting.md, peers) is that most of a model's
unpredictability comes from a few top clients while the rest are steady,
which argues for forecasting per client. A forecaster of the aggregate
sees only the sum; one per client sees what each client did, information
the aggregate's own past does not hold (so the bound of
``bench/forecast_bound.py``, which is for predictors of a series from its
own past, does not apply to it).

For each week-1 model this runs, on the splits of ``bench/forecast.py``
(``test``: warm on days 0-3, score days 4-6; ``dev``: warm on days 0-1,
score days 2-3), one ``TrafficForecaster`` of ``--kind`` on the aggregate
and, per ``--top`` k, one on each of the k busiest clients (by requests in
the warm-up) and one on the rest of the traffic (k = 0: one per client,
no rest). The bottom-up count is the sum of the parts' forecasts; the ISL
and OSL are the aggregate forecaster's (the curves carry the model's
6-hour means, one for all clients), so only the count differs. Both are
scored by the reference's ``window_loss``. Where the aggregate forecaster
forecasts no requests (the reference's idle rule, after an empty window:
m-mid's recording gaps), so does the sum; a client's own forecaster cannot
tell a gap in the recording from that client going quiet.

Not a test: nothing asserts. Bench code reads the shared data; the
package never does.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast import (  # noqa: E402
    DAY_S,
    SERVEGEN_WEEK,
    SERVEGEN_WINDOW_S,
    busiest_clients,
    client_counts,
    servegen_windows,
)

from fleetplan.models import ensemble  # noqa: E402, F401  (registers the "ensemble" kind)
from fleetplan.models.forecast import TrafficForecaster, TrafficObservation, window_loss  # noqa: E402

PER_DAY = DAY_S // SERVEGEN_WINDOW_S
SPLITS = {"test": (4 * PER_DAY, 7 * PER_DAY), "dev": (2 * PER_DAY, 4 * PER_DAY)}
"""(first scored window, end of the scored windows); the windows before the first warm the forecasters."""


def parts_of(counts: dict[str, list[float]], top: int, warm: int) -> list[list[float]]:
    """The series forecast separately: the ``top`` busiest clients and the rest (0: every client)."""
    if top == 0:
        return [counts[c] for c in sorted(counts)]
    big = busiest_clients(counts, top, warm)
    kept = set(big)
    rest = [math.fsum(window) for window in zip(*(counts[c] for c in counts if c not in kept), strict=True)]
    return [counts[c] for c in big] + [rest]


def summed_count(aggregate: float, parts: list[float]) -> float:
    """The bottom-up count: the parts' forecasts summed, none where the aggregate forecasts none.

    The aggregate's idle rule (no requests in the last window: forecast
    none) holds for the sum; a client's own forecaster cannot tell a gap in
    the recording from its client going quiet.
    """
    return 0.0 if aggregate == 0.0 else math.fsum(parts)


def score(windows: list[TrafficObservation], counts: dict[str, list[float]],
          kind: str, top: int, split: str) -> tuple[float, float, int, float]:
    """(aggregate loss, bottom-up loss, parts, ms per bottom-up forecast) on one split."""
    warm, end = SPLITS[split]
    parts = parts_of(counts, top, warm)

    def window(i: int, n: float) -> TrafficObservation:
        w = windows[i]
        return TrafficObservation(SERVEGEN_WINDOW_S, n, w.isl if n > 0 else 0.0, w.osl if n > 0 else 0.0,
                                  start_s=w.start_s)

    aggregate = TrafficForecaster(kind, prophet_interval_s=float(SERVEGEN_WINDOW_S))
    aggregate.warm(windows[:warm])
    per_part = []
    for series in parts:
        forecaster = TrafficForecaster(kind, prophet_interval_s=float(SERVEGEN_WINDOW_S))
        forecaster.warm([window(i, series[i]) for i in range(warm)])
        per_part.append(forecaster)
    whole, summed, cost = [], [], 0.0
    for i in range(warm, end):
        actual = windows[i]
        truth = (actual.num_req, actual.isl, actual.osl)
        point = aggregate.forecast()
        whole.append(window_loss(point, truth))
        start = time.perf_counter()
        n = summed_count(point[0], [f.forecast()[0] for f in per_part])
        cost += time.perf_counter() - start
        summed.append(window_loss((n, point[1], point[2]), truth))
        aggregate.observe(actual)
        for forecaster, series in zip(per_part, parts, strict=True):
            forecaster.observe(window(i, series[i]))
    scored = end - warm
    return math.fsum(whole) / scored, math.fsum(summed) / scored, len(parts), 1e3 * cost / scored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (rates/)")
    parser.add_argument("--kind", default="ensemble")
    parser.add_argument("--top", default="1,3,10,0",
                        help="comma-separated: forecast the k busiest clients and the rest (0: every client)")
    args = parser.parse_args()
    tops = [int(v) for v in args.top.split(",")]
    print("| split | model | clients | parts | aggregate loss | bottom-up loss | ratio | ms per forecast |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    week = {model: (servegen_windows(args.data, model), client_counts(args.data, model, days=7))
            for model in SERVEGEN_WEEK}  # read once: both splits score the same week
    for split in SPLITS:
        for model, (windows, counts) in week.items():
            for top in tops:
                whole, summed, parts, ms = score(windows, counts, args.kind, top, split)
                label = "every client" if top == 0 else f"top {top} + rest"
                print(f"| {split} | {model} | {label} | {parts} | {whole:.4f} | {summed:.4f} | "
                      f"{summed / whole:.2f} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
