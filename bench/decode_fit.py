"""How far the decode fit's capacity is from the simulated engine's, tick by tick.

The throughput loop sizes decode with the rate one engine sustains at its
batch limit, which the online fit (wall time linear in sequences and KV
tokens, as Dynamo's) extrapolates from the batches it has seen. This runs
the default on one rate-scaled trace and prints, at every throughput
tick, that rate from the fit and from the simulated engine's own pass
times (``sim/timing.py``) in the same capacity search, as decode tokens
per second per engine, with where that rate is read: the batch it is
taken at and the share of the KV cache that batch fills, against the
most sequences and KV tokens any engine's forward pass carried so far
(the profile's seed rows left out). A batch past what the engines ran is
a rate no live sample measured. ``--exact`` then runs the default again with the
engine's own capacity in place of the fit's, to see what an exact decode
model would decide:

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/decode_fit.py --data /work/shared/data \\
        --only conv --scale 35.7 --exact        # ~1.5 min
        # [--profile h100-llama3.3-70b [--tp 4]]: a held-out engine (bench/sizing.py --profile)
        # [--engine-timing interp-extend]: past the profile's rows, the other guess (docs/calibration.md)

(docs/forecasting.md, "Decode's slot count on the window's P90").
"""

from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quality import (  # noqa: E402
    add_engine_options,
    build_workload,
    held_out_engine,
    make_setup,
    on_engine,
    one_workload,
    one_workload_parser,
)
from sizing import VARIANTS  # noqa: E402

from fleetplan.models.perf.capacity import decode_capacity, decode_context_length  # noqa: E402
from fleetplan.models.perf.decode import DecodePerfModel  # noqa: E402
from fleetplan.models.planner import Planner  # noqa: E402
from fleetplan.sim.experiment import initial_fleet, run_planner, size_workload  # noqa: E402


class EngineTimes:
    """The simulated engine's decode pass times, in the fit's interface."""

    def __init__(self, timing) -> None:
        self.timing = timing

    def predict_many(self, seqs: np.ndarray, kv: np.ndarray) -> np.ndarray:
        return np.array([self.timing.decode_s(int(n), float(k)) for n, k in zip(seqs, kv, strict=True)])


def engine_capacity(model: DecodePerfModel, times: EngineTimes, isl: int, osl: int, itl_ms: float):
    return decode_capacity(times, model.limits, isl, osl, itl_ms, None, kv_fallback=model.max_observed_kv)


class LiveReach:
    """The most sequences and KV tokens a live decode forward pass carried, seed rows left out.

    The perf model is seeded with the profile's rows through the same
    ``observe_batch`` as live FPMs, so :meth:`watching` tells the two apart
    by wrapping ``seed`` as well.
    """

    OBSERVERS = ("seed", "observe_batch", "observe")

    def __init__(self) -> None:
        self.seqs = 0
        self.kv = 0.0
        self._seeding = False

    @contextmanager
    def watching(self):
        """Count every decode model's live passes while the block runs; the methods restored after."""
        originals = {name: getattr(DecodePerfModel, name) for name in self.OBSERVERS}

        def seed(model, columns):
            self._seeding = True
            try:
                originals["seed"](model, columns)
            finally:
                self._seeding = False

        def observe_batch(model, columns):
            if not self._seeding and len(columns):
                self._reach(int(columns.num_decode_requests.max()), float(columns.sum_decode_kv_tokens.max()))
            originals["observe_batch"](model, columns)

        def observe(model, fpm):
            if not self._seeding:
                self._reach(int(fpm.scheduled.num_decode_requests), float(fpm.scheduled.sum_decode_kv_tokens))
            originals["observe"](model, fpm)

        DecodePerfModel.seed, DecodePerfModel.observe_batch, DecodePerfModel.observe = seed, observe_batch, observe
        try:
            yield self
        finally:
            for name, method in originals.items():
                setattr(DecodePerfModel, name, method)

    def _reach(self, seqs: int, kv: float) -> None:
        self.seqs = max(self.seqs, seqs)
        self.kv = max(self.kv, kv)


def run(spec, cfg, setup, workload, on_tick=None, reach: LiveReach | None = None):
    tick = Planner.tick

    def observed_tick(self, state, now):
        report = tick(self, state, now)
        if on_tick is not None and report.predicted is not None:
            on_tick(state, report)
        return report

    Planner.tick = observed_tick
    try:
        with reach.watching() if reach is not None else nullcontext():
            sizing = size_workload(workload, setup)
            return run_planner(workload, setup, Planner(cfg, profile=setup.profile),
                               initial_fleet("warm", setup, sizing, workload))
    finally:
        Planner.tick = tick


def main() -> None:
    parser = one_workload_parser(__doc__, default="conv")
    parser.add_argument("--exact", action="store_true", help="also run with the engine's own decode capacity")
    add_engine_options(parser, "run on this bundled engine profile (bench/sizing.py --profile), at --scale")
    args = parser.parse_args()
    held_out_engine(parser, args.profile, args.tp)
    spec, sla = one_workload(parser, args)
    spec = on_engine(spec, args)
    workload = build_workload(spec)
    cfg, setup = make_setup(spec, sla, dict(VARIANTS["fleetplan (ensemble)"]))
    times = EngineTimes(setup.timing)

    print("tick_s  decode_ready  fit_tok_s  engine_tok_s  fit_error_%  batch  batch_kv_%  "
          "live_seqs  live_kv_%  decode_target")
    reach = LiveReach()

    def on_tick(state, report):
        model = state.perf["decode"]
        isl, osl = max(round(report.predicted.isl), 1), max(round(report.predicted.osl), 1)
        fit = model.capacity_rps(isl, osl, itl_ms=cfg.itl_ms)
        own = engine_capacity(model, times, isl, osl, cfg.itl_ms)
        ready = sum(1 for w in state.workers.values() if w.role == "decode" and w.state == "ready")
        cache = model.limits.max_kv_tokens or model.max_observed_kv
        batch_kv = 100 * fit.batch * decode_context_length(isl, osl) / cache
        print(f"{report.time:6.0f}  {ready:12d}  {fit.rps * osl:9.0f}  {own.rps * osl:12.0f}  "
              f"{100 * (fit.rps / own.rps - 1):+11.1f}  {fit.batch:5d}  {batch_kv:10.1f}  "
              f"{reach.seqs:9d}  {100 * reach.kv / cache:9.1f}  {report.targets.get('decode'):13d}")

    result = run(spec, cfg, setup, workload, on_tick, reach)
    print(f"default: {100 * result.summary.sla_attainment:.2f} % met, {result.summary.gpu_hours:.3f} GPU-hours, "
          f"decode decisions {[d.targets.get('decode') for d in result.decisions]}")
    if args.exact:
        fitted = DecodePerfModel.capacity_rps

        def exact(self, isl, osl, ttft_ms=None, itl_ms=None, kv_hit_rate=None, accept_length=None):
            return None if self.fit() is None else engine_capacity(self, times, isl, osl, itl_ms)

        DecodePerfModel.capacity_rps = exact
        try:
            result = run(spec, cfg, setup, workload)
        finally:
            DecodePerfModel.capacity_rps = fitted
        print(f"exact decode capacity: {100 * result.summary.sla_attainment:.2f} % met, "
              f"{result.summary.gpu_hours:.3f} GPU-hours, decode decisions "
              f"{[d.targets.get('decode') for d in result.decisions]} at {[d.time for d in result.decisions]}")


if __name__ == "__main__":
    main()
