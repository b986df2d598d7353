"""How much of a trace's shape over time survives ``rate_scale``.

Usage:

    .venv/bin/python bench/rate_shape.py --data /work/shared/data [--shifts none,30,60]

For each 30-minute trace of ``bench/quality.py`` at its recorded rate scale,
prints the per-minute counts' coefficient of variation as logged and after
scaling, and the correlation of the scaled minutes with the logged ones, for
copies shifted anywhere in the window (``none``, the default of
``fleetplan simulate --rate-scale``) and within S seconds either way
(``--rate-scale-shift S``). docs/simulate.md quotes its figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fleetplan.sim.traces import read_trace
from fleetplan.sim.workload import rate_scale, spread_arrivals, timestamp_step, trace_duration

TRACES = (  # (name, path under --data, the rate scale bench/quality.py records)
    ("code", "traces/azure2023/AzureLLMInferenceTrace_code_first30min.csv", 50),
    ("conv", "traces/azure2023/AzureLLMInferenceTrace_conv_first30min.csv", 34),
    ("mooncake-spread", "traces/mooncake/conversation_trace_first30min.jsonl", 6),
)


def per_minute(rows, minutes: int) -> np.ndarray:
    return np.bincount([int(r.arrival_s // 60) for r in rows], minlength=minutes)[:minutes].astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--shifts", default="none,30,60")
    args = parser.parse_args()
    shifts = [None if s == "none" else float(s) for s in args.shifts.split(",")]
    print("| trace | scale | shift | CV logged | CV scaled | correlation |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, path, scale in TRACES:
        rows = read_trace(args.data / path)
        step = timestamp_step(rows)
        if step is not None:  # as fleetplan simulate --spread-arrivals auto
            rows = spread_arrivals(rows, step, seed=0)
        duration = trace_duration(rows)
        minutes = int(duration // 60)
        logged = per_minute(rows, minutes)
        for shift in shifts:
            scaled = per_minute(rate_scale(rows, scale, seed=0, duration_s=duration, max_shift_s=shift), minutes)
            cv = [float(x.std() / x.mean()) for x in (logged, scaled)]
            corr = float(np.corrcoef(logged, scaled)[0, 1])
            print(f"| {name} | ×{scale} | {'anywhere' if shift is None else f'{shift:g} s'} | {cv[0]:.2f} | "
                  f"{cv[1]:.2f} | {corr:.2f} |")


if __name__ == "__main__":
    main()
