"""What a ``seed_traffic`` control costs: its record, its decode, and the tick that applies it.

    .venv/bin/python bench/bench_seed.py [--predictor ensemble] [--repeat 3] [--windows 480,2880,4096]

For seeds of a day, six days and the largest one accepted (480, 2,880 and
4,096 windows of 180 s; synthetic counts with a daily swing), it reports
the record's size, the time to decode it (what the worker's intake pays)
and the time of the first tick of a fresh deployment, which applies it:
the forecaster rebuilt from every window (docs/planner.md). The size of
the forecaster's state after it shows that a seed does not grow the
changelog record.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import orjson

from fleetplan.models.config import config_from_dict
from fleetplan.models.planner import Planner
from fleetplan.models.predictor_swap import seed_control
from fleetplan.models.sequencer import advance, offer
from fleetplan.schemas import decode_event, encode_event
from fleetplan.schemas.events import MAX_SEED_WINDOWS

T0 = 1_800_000_000.0
INTERVAL = 180.0


def seed_rows(n: int) -> list[list]:
    """``n`` windows ending at T0: a daily cycle between 1,000 and 5,000 requests."""
    rows = []
    for i in range(n):
        start = T0 - INTERVAL * (n - i)
        count = 3000.0 + 2000.0 * math.sin(2 * math.pi * start / 86_400.0) + (i * 7919) % 97
        rows.append([start, INTERVAL, count, 2000.0 + i % 13, 200.0 + i % 7, None, None, count * 1.2])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--predictor", default="ensemble", help="load_predictor")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--windows", default=f"480,2880,{MAX_SEED_WINDOWS}",
                        help="seed sizes, comma-separated (the ARIMA kinds take minutes past a day)")
    args = parser.parse_args()
    planner = Planner(config_from_dict({"load_predictor": args.predictor, "mode": "agg"}))
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"predictor {args.predictor}, best and median of {args.repeat}")
    print("windows  record_KB  decode_ms (best/median)  applying_tick_s (best/median)  forecaster_state_KB")
    for n in (int(w) for w in args.windows.split(",")):
        raw = encode_event(seed_control("d", T0, seed_rows(n)))
        decodes, ticks = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            event = decode_event(raw)
            decodes.append(time.perf_counter() - t0)
            state = planner.new_state("d")
            offer(state, event)
            t0 = time.perf_counter()
            (report,) = advance(planner, state, T0 + INTERVAL)  # the first tick: the seed applied, no traffic yet
            ticks.append(time.perf_counter() - t0)
            assert report.rejected_controls == 0 and state.forecaster.windows_seen == n
        size = len(orjson.dumps(state.forecaster.to_state())) / 1024
        print(f"{n:7d}  {len(raw) / 1024:9.0f}  {1000 * min(decodes):9.1f} / {1000 * statistics.median(decodes):<9.1f}"
              f"      {min(ticks):9.3f} / {statistics.median(ticks):<9.3f}            {size:8.1f}")


if __name__ == "__main__":
    main()
