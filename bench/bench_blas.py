"""What BLAS threads cost the ARIMA predictor on a busy machine.

    .venv/bin/python bench/bench_blas.py --data /work/shared/data [--model m-large] [--busy 1]

The planner's ARIMA fits multiply matrices of at most four rows
thousands of times per selection. OpenBLAS starts a thread per core and
hands work to them; when the other cores are busy (a planner pod beside
others, a benchmark beside another) each hand-off waits for a core, and a
fit that takes a few milliseconds takes tens. ``models/predictors.py`` therefore runs every
statsmodels call on one BLAS thread (``statsmodels_run``).

This feeds the re-selecting ARIMA the ServeGen week's 10-minute request
counts of one model (the series ``bench/forecast.py`` scores), forecasting
after every point, twice: as the planner runs it (one thread), and with the
limit lifted (the process's default pools). ``--busy N`` starts N
processes that spin for the whole run, standing in for the neighbours.
Prints wall time per forecast for both and the number of forecasts over
50 ms (issue 5's budget). Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast import cpu_name, servegen_windows  # noqa: E402

from fleetplan.models import predictors  # noqa: E402

BUDGET_S = 0.050


class _Unlimited:
    """Stands in for the thread-pool controller: the pools keep their default size."""

    def limit(self, **_):
        return contextlib.nullcontext()


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def forecast_times(values: list[float], warm: int) -> list[float]:
    """Wall seconds of each forecast after the first ``warm`` points."""
    p = predictors.make_predictor("arima")
    times = []
    for i, v in enumerate(values):
        if i >= warm:
            t0 = time.perf_counter()
            p.predict_next()
            times.append(time.perf_counter() - t0)
        p.add_data_point(v)
    return times


def report(label: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    over = sum(1 for t in times if t > BUDGET_S)
    return (f"| {label} | {sum(times):.1f} | {statistics.median(ms):.1f} | {p99:.1f} | {ms[-1]:.1f} | "
            f"{over} of {len(times)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--model", default="m-large", help="ServeGen language model (m-large, m-mid, ...)")
    parser.add_argument("--busy", type=int, default=1, help="spinning processes beside the run")
    parser.add_argument("--warm", type=int, default=5, help="points fed before the first timed forecast")
    args = parser.parse_args()
    values = [w.num_req for w in servegen_windows(args.data, args.model)]
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for s in spinners:
        s.start()
    try:
        forecast_times(values[:40], args.warm)  # imports and the first selections out of the way
        controller = predictors._blas_controller
        predictors._blas_controller = _Unlimited
        try:
            default = forecast_times(values, args.warm)
        finally:
            predictors._blas_controller = controller
        one = forecast_times(values, args.warm)
    finally:
        stop.set()
        for s in spinners:
            s.join()
    print(f"{cpu_name()}, {os.cpu_count()} cores, {args.busy} busy; ServeGen {args.model}: "
          f"{len(values)} ten-minute points, the re-selecting ARIMA, a forecast after each\n")
    print("| BLAS threads | total s | median ms | p99 ms | max ms | over 50 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    print(report("one (the planner)", one))
    print(report("OpenBLAS default", default))


if __name__ == "__main__":
    main()
