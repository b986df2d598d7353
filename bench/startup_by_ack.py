"""The live stack's view: no inventory events, startups timed by the acks (2026-12-05).

fleetplan's live stack has no producer of inventory events, so the planner
knows its engines from their FPMs and, until 2026-12-05, never measured a
startup: the throughput loop's horizon stayed at ``startup_seconds`` (120 s)
whatever the engines took. Since then the ack of a scale-up decision whose
observed counts reach its targets is a startup sample where no inventory
is written (models/startup.py). This runs the default on one rate-scaled
trace with the simulated engines' startup set by ``--startup``, three ways:

- ``inventory``: the simulator's inventory events, as an orchestrator that
  writes them (every other benchmark);
- ``no inventory, untimed``: none, and the ack timing patched out, as the
  live stack was;
- ``no inventory, acks``: none, as the live stack is now.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/startup_by_ack.py --data /work/shared/data \\
        --only code --scale 50 --startup 360
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/startup_by_ack.py --data /work/shared/data \\
        --only m-large --scale 0.1714 --startup 360

For each: the startup samples the planner kept and their median, the
startup horizon of its last throughput tick, SLA attainment and GPU-hours
(docs/sizing.md, "Without inventory, the acks time the startup").
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import WORKLOADS, build_workload, one_workload, one_workload_parser  # noqa: E402
from quality import make_setup as quality_setup  # noqa: E402
from sizing import VARIANTS  # noqa: E402

import fleetplan.models.apply as apply_module  # noqa: E402
from fleetplan.models.planner import Planner  # noqa: E402
from fleetplan.sim.experiment import initial_fleet, size_workload  # noqa: E402
from fleetplan.sim.runner import ClosedLoop, PlannerController  # noqa: E402
from fleetplan.sim.runner import make_setup as setup_of  # noqa: E402
from fleetplan.sim.startup import parse_startup  # noqa: E402

WAYS = (("inventory", True, True), ("no inventory, untimed", False, False), ("no inventory, acks", False, True))


def run(workload, setup, cfg, initial, timed: bool):
    """One run of the default; returns (result, the deployment's state at the end, last horizon)."""
    original = apply_module.ack_startup_sample
    if not timed:
        apply_module.ack_startup_sample = lambda *_: None
    try:
        controller = PlannerController(Planner(cfg, profile=setup.profile))
        result = ClosedLoop(workload, setup, controller, initial).run()
    finally:
        apply_module.ack_startup_sample = original
    horizons = [row["horizon_windows"] for row in controller.ticks if "horizon_windows" in row]
    state = controller.core.states[setup.options.deployment]
    return result, state, horizons[-1] if horizons else None


def main() -> None:
    parser = one_workload_parser(__doc__, choices=WORKLOADS)
    parser.add_argument("--startup", default="360", help="the simulated engines' startup (sim/startup.py spec)")
    args = parser.parse_args()
    try:
        parse_startup(args.startup)
    except ValueError as err:
        parser.error(f"--startup: {err}")
    spec, sla = one_workload(parser, args)
    workload = build_workload(spec)
    cfg, setup = quality_setup(spec, sla, dict(VARIANTS["fleetplan (ensemble)"]))
    initial = None
    print(f"{spec.name} x{args.scale:g}, SLA {args.sla}, engine startup {args.startup}, "
          f"startup_seconds {cfg.startup_seconds:g}")
    print(f"{'way':24s} {'samples':>7s} {'median_s':>9s} {'horizon':>7s} {'attainment_%':>12s} {'gpu_hours':>9s}")
    for name, inventory, timed in WAYS:
        way = setup_of(cfg, setup.profile, replace(setup.options, startup=args.startup, inventory=inventory))
        if initial is None:
            initial = initial_fleet("warm", way, size_workload(workload, way), workload)
        result, state, horizon = run(workload, way, cfg, initial, timed)
        samples = state.startup_samples
        median = f"{statistics.median(samples):9.1f}" if samples else f"{'-':>9s}"
        print(f"{name:24s} {len(samples):7d} {median} {horizon if horizon is not None else '-':>7} "
              f"{100 * result.summary.sla_attainment:12.2f} {result.summary.gpu_hours:9.3f}", flush=True)


if __name__ == "__main__":
    main()
