"""What an outage of the planner does to the ensemble's daily cycle.

    .venv/bin/python bench/forecast_gap.py --data /work/shared/data [--hours 6]

A planner that is down (or a deployment with no ticks) for some hours
never sees those windows. The ensemble's daily members read the phase of
the day from the window's start time (``TrafficObservation.start_s``,
which the planner sets); fed without it, the phase is a count of windows
and an outage moves the learned cycle by its length. On the ServeGen
week-1 curves of ``bench/forecast.py`` (10-minute windows, warm-up days
0-3, days 4-6 scored) the windows of the last ``--hours`` of day 3 are
dropped, and the loss on days 4-6 is compared: every window fed, the
outage with start times, the outage counted. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast import SERVEGEN_WINDOW_S, Series, score, servegen_windows  # noqa: E402

PER_DAY = int(86_400 // SERVEGEN_WINDOW_S)


def scored_loss(windows, warm: int, kind: str) -> float:
    """Mean one-step window loss of ``kind`` on ``windows[warm:]`` (bench/forecast.py's ``score``)."""
    return score(kind, Series("gap", SERVEGEN_WINDOW_S, tuple(windows), warm)).loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (rates/)")
    parser.add_argument("--hours", type=float, default=6.0, help="length of the outage before day 4")
    parser.add_argument("--kind", default="ensemble")
    args = parser.parse_args()
    dropped = round(args.hours * 3600 / SERVEGEN_WINDOW_S)
    print(f"| series | every window | {args.hours:g} h outage, start times | the outage, counted windows |")
    print("|---|---:|---:|---:|")
    for model in ("m-large", "m-mid", "m-small"):
        windows = servegen_windows(args.data, model)
        warm = 4 * PER_DAY
        gap = windows[: warm - dropped] + windows[warm:]
        counted = [dataclasses.replace(w, start_s=None) for w in gap]
        full = scored_loss(windows, warm, args.kind)
        timed = scored_loss(gap, warm - dropped, args.kind)
        blind = scored_loss(counted, warm - dropped, args.kind)
        print(f"| servegen-{model}-10m | {full:.4f} | {timed:.4f} | {blind:.4f} |", flush=True)


if __name__ == "__main__":
    main()
