"""How bursty are arrivals? Index of dispersion of arrivals per bin, per throughput window.

Usage:

    .venv/bin/python bench/dispersion.py --data /work/shared/data [--window 180] [--bins 1,5]

For the rate-scaled quality traces of ``bench/quality.py`` (scales in
``bench/sizing.py``'s ``SCALES``), the variance over the mean of the
arrival counts per bin (1 for Poisson arrivals) in each window of the
first 30 minutes: what the planner measures at 1-s bins for the queueing
floor (docs/sizing.md, "Arrivals come in clusters").
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from quality import Spec, build_workload, trace_specs
from sizing import SCALES


def dispersions(arrivals: np.ndarray, window_s: float, bin_s: float, duration_s: float) -> list[float]:
    counts = np.bincount((arrivals // bin_s).astype(np.int64), minlength=int(np.ceil(duration_s / bin_s)))
    per_window = int(window_s // bin_s)
    out = []
    for start in range(0, len(counts) - per_window + 1, per_window):
        c = counts[start:start + per_window]
        out.append(float(c.var() / c.mean()) if c.mean() > 0 else float("nan"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--window", type=float, default=180.0)
    parser.add_argument("--bins", default="1,5")
    args = parser.parse_args()
    bins = [float(b) for b in args.bins.split(",")]
    print("| trace | " + " | ".join(f"dispersion at {b:g} s, min–max over windows" for b in bins) + " |")
    print("|---|" + "---|" * len(bins))
    for s in trace_specs(args.data):
        spec = Spec(**{**s.__dict__, "scale": SCALES[s.name]})
        workload = build_workload(spec)
        arrivals = np.array([r.arrival_s for r in workload.requests()])
        cells = []
        for b in bins:
            d = dispersions(arrivals, args.window, b, workload.duration_s)
            cells.append(f"{min(d):.1f}–{max(d):.1f}")
        print(f"| {spec.name} ×{spec.scale:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
