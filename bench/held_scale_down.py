"""The default with every scale-down held for a tick, HPA-style (tried 2026-12-04, not kept).

Kubernetes' HPA scales down only when every recommendation of its
stabilization window allows it. The same rule for the throughput loop:
each role's target is the largest count of this tick and the ``--hold``
ticks before it (the window must span a tick, 180 s, to hold anything).
This runs the default with that rule on one rate-scaled trace at several
load levels, beside the default itself:

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/held_scale_down.py --data /work/shared/data \\
        --only code --scales 45,50,55        # and --only conv --scales 30.6,34,35.7,37.4
    # the conv trace with its shape kept (docs/forecasting.md, "the traces with their shape kept"):
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/held_scale_down.py --data /work/shared/data \\
        --only conv --scales 34 --rate-scale-shift 30

(docs/forecasting-history.md, "A scale-down held for a tick"). The rule is a
patch of ``Planner._throughput_loop`` for the length of a run, not a
config field: it was measured and not kept.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import TRACES, build_workload, make_setup, rate_scale_shift, sla_pair, specs  # noqa: E402
from sizing import VARIANTS  # noqa: E402

from fleetplan.models.planner import Planner  # noqa: E402
from fleetplan.sim.experiment import initial_fleet, run_planner, size_workload  # noqa: E402


def held(hold: int):
    """``Planner._throughput_loop`` with each role's target held at the largest of the last ``hold`` + 1."""
    loop = Planner._throughput_loop
    past: dict[int, list[dict]] = {}

    def throughput_loop(self, state, now, baseline, minimums, kv_hit, accept, scratch):
        loop(self, state, now, baseline, minimums, kv_hit, accept, scratch)
        targets = scratch.throughput_targets
        if targets is None:
            return
        seen = past.setdefault(id(state), [])
        scratch.throughput_targets = {r: max([n] + [p.get(r, 0) for p in seen[-hold:]]) for r, n in targets.items()}
        seen.append(dict(targets))

    return throughput_loop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (traces/)")
    parser.add_argument("--only", default="code", choices=TRACES, help="one trace of bench/quality.py")
    parser.add_argument("--scales", required=True, help="rate scales, comma-separated")
    parser.add_argument("--sla", default="500,50", help="TTFT,ITL in ms")
    parser.add_argument("--hold", type=int, default=1, help="ticks a scale-down waits for")
    parser.add_argument("--rate-scale-shift", type=float, default=None, metavar="S",
                        help="shift each rate-scale copy within S seconds either way, keeping the trace's "
                             "shape (as bench/sizing.py's option). Default: anywhere in the window")
    args = parser.parse_args()
    rate_scale_shift(parser, args.rate_scale_shift)
    sla = sla_pair(parser, args.sla)
    (base,) = [s for s in specs(args.data, {args.only}, 10, 10, 24.0, choose=False)]
    print("scale  policy    attainment_%  gpu_hours")
    for scale in (float(x) for x in args.scales.split(",")):
        spec = replace(base, scale=scale, shift=args.rate_scale_shift)
        workload = build_workload(spec)
        cfg, setup = make_setup(spec, sla, dict(VARIANTS["fleetplan (ensemble)"]))
        sizing = size_workload(workload, setup)
        for name, patch in (("default", None), (f"held {args.hold}", held(args.hold))):
            original = Planner._throughput_loop
            if patch is not None:
                Planner._throughput_loop = patch
            try:
                result = run_planner(workload, setup, Planner(cfg, profile=setup.profile),
                                     initial_fleet("warm", setup, sizing, workload))
            finally:
                Planner._throughput_loop = original
            print(f"{scale:5g}  {name:8s}  {100 * result.summary.sla_attainment:12.2f}  {result.summary.gpu_hours:9.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
