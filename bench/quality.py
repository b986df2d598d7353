"""Control quality: SLA attainment and GPU-hours of every contender on real traffic.

Usage (the shared data folder is an argument; nothing is read from a fixed path):

    .venv/bin/python bench/quality.py --data /work/shared/data \\
        [--only conv,code,mooncake,mooncake-spread,m-large,m-mid] [--jobs 1] \\
        [--json bench-quality.json] [--md bench-quality.md] \\
        [--sla 500/50,200/20] [--sizings dynamo,fleetplan] [--loops throughput,load,both] \\
        [--predictors arima,ensemble] [--no-baselines]

Workloads, each rate-scaled with the time axis kept until autoscaling
matters (at their recorded rates every shared trace fits in one prefill and
one decode engine):

- Azure conv, Azure code, Mooncake conversation (30 min each; and
  ``mooncake-spread``, the Mooncake trace with the arrivals it logged in
  3-s steps spread uniformly over their step): the smallest
  whole number of superposed copies whose busiest minute needs at least
  ``--min-engines`` (10) engines on the H200 Llama-3.1-8B profile;
- ServeGen m-large and m-mid, one day (``--hours``), generated per client,
  rate-scaled so the busiest minute needs about ``--servegen-engines`` (24)
  engines of the H100 Llama-3.3-70B TP2 profile at the 200/20 SLA (fewer at
  500/50). The 70B profile keeps a day of traffic to a few million
  requests, so each run takes minutes.

For each workload and each SLA (500 ms / 50 ms, Dynamo's default, and
200 ms / 20 ms) it runs static-peak, static-mean, the hindsight oracle, and
the planner with the throughput loop only, the load loop only and both
loops, twice: with Dynamo's sizing (``REFERENCE_SIZING``: 100 % utilisation,
point forecast, mean request, no queueing floor; rows "dynamo ...") and with
fleetplan's default sizing (docs/sizing.md; rows "fleetplan ..."); each
loop configuration that forecasts once per predictor (constant, arima,
kalman, and ensemble for fleetplan's sizing; prophet is an optional extra,
run if installed). ``--sizings reference-forecast`` adds issue 5's rows:
fleetplan's sizing with the reference's forecasting (the point forecast of
the next window, no startup quantile) and the reference's predictors
(constant, the frozen-order ARIMA, Kalman), so that only the forecast
differs from the "fleetplan" rows. Every other config field is the default except the SLA
and ``max_gpu_budget`` (raised so the budget never binds). All contenders
start from the same warm fleet (sized for the traffic until the first
decision can take effect), except the static and oracle fleets, which start
at their own counts.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

SLAS = ((500.0, 50.0), (200.0, 20.0))
LOOPS = {
    "throughput": {"enable_throughput_scaling": True, "enable_load_scaling": False},
    "load": {"enable_throughput_scaling": False, "enable_load_scaling": True},
    "both": {"enable_throughput_scaling": True, "enable_load_scaling": True},
}


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str  # trace | servegen
    path: str
    profile: str
    scale: float = 1.0
    model: str = ""
    hours: float = 24.0
    router: str = "least-loaded"
    key: str = ""  # what --only calls it
    spread: bool = False  # arrival times spread over the trace's timestamp step
    start_day: int = 0  # ServeGen: the day of the week the run replays
    warm_days: int = 0  # ServeGen: days before it fed to the planner's forecaster first (sim/warm.py)
    shift: float | None = None  # traces: rate-scale copies shifted within this many seconds (None: anywhere)
    seed: int = 0  # the draw: rate-scale copies' shifts, spread arrivals, ServeGen's requests, startup times
    tp: int | None = None  # of a profile stacked over parallel configs, this one (None: the profile's default)
    timing: str = "interp"  # the simulated engine's pass times (sim/timing.py's TIMING_MODES)


PREDICTORS = ("constant", "arima_frozen", "arima", "kalman", "ensemble", "prophet")
"""Every predictor some sizing runs (``predictors``), in the tables' order."""

SIZINGS = ("dynamo", "fleetplan")
EXTRA_SIZINGS = ("reference-forecast",)
"""Run only when asked (``--sizings``): fleetplan's sizing, the reference's forecasting."""
REFERENCE_FORECAST = {"throughput_sizing": "point", "prefill_capacity": "best"}
"""fleetplan's sizing with the reference's forecasting: a point forecast of the next window.

Prefill stays rated at its best batch, as when the committed sweeps were run (the default
until 2026-12-07); ``bench/sizing.py``'s ``forecast-frontier-backlog`` sweeps it with the
default's backlogged rate (bench/results/prefill-capacity/reference-backlog)."""


def sizing_overrides(sizing: str) -> dict:
    """Config fields of a sizing: Dynamo's, fleetplan's defaults, or fleetplan's with the reference's forecast."""
    from fleetplan.models.config import REFERENCE_SIZING

    return {"dynamo": dict(REFERENCE_SIZING), "fleetplan": {},
            "reference-forecast": dict(REFERENCE_FORECAST)}[sizing]


def predictors(sizing: str = "dynamo") -> list[str]:
    if sizing == "reference-forecast":
        return ["constant", "arima_frozen", "kalman"] + _prophet()
    return ["constant", "arima", "kalman"] + (["ensemble"] if sizing == "fleetplan" else []) + _prophet()


def _prophet() -> list[str]:
    """Prophet is an optional extra: a row only where it is installed."""
    try:
        import prophet  # noqa: F401
    except ImportError:
        return []
    return ["prophet"]


def build_workload(spec: Spec):
    from fleetplan.sim.servegen import servegen_workload
    from fleetplan.sim.traces import read_trace
    from fleetplan.sim.workload import (
        Workload,
        rate_scale,
        spread_arrivals,
        timestamp_step,
        trace_duration,
    )

    if spec.kind == "servegen":
        return servegen_workload(spec.path, spec.model, start_s=spec.start_day * DAY_S, duration_s=spec.hours * 3600,
                                 rate_scale=spec.scale, seed=spec.seed)
    reqs = read_trace(spec.path)
    if spec.spread:
        step = timestamp_step(reqs)
        if step is None:
            raise ValueError(f"{spec.path}: arrival times are not rounded to a step; nothing to spread")
        reqs = spread_arrivals(reqs, step, seed=spec.seed)
    # after spreading, as `fleetplan simulate` takes it: the last step is part of the trace
    # (Mooncake: 1,800 s, not 1,797), or the copies wrap short and the last step runs past the end
    duration = trace_duration(reqs)
    scaled = rate_scale(reqs, spec.scale, seed=spec.seed, duration_s=duration, max_shift_s=spec.shift)
    return Workload.from_requests(spec.name, scaled, duration)


DAY_S = 86_400.0


def warm_history(spec: Spec, cfg) -> list[list] | None:
    """The throughput windows of the ``spec.warm_days`` before its day, to seed the
    planner's forecaster with (None: start cold).

    A deployed planner keeps its forecaster across restarts, so a run on
    day 4 of a week is the planner's fifth day, not its first.
    """
    if not spec.warm_days:
        return None
    return _history_windows(spec, cfg.throughput_adjustment_interval_seconds, cfg.burst_seconds)


@functools.lru_cache(maxsize=4)
def _history_windows(spec: Spec, interval_s: float, burst_s: int) -> list[list]:
    """The throughput windows of the days before ``spec``'s (``sim/warm.py``), generated once per worker:
    every variant run on the same day is warmed on the same traffic."""
    from fleetplan.sim.servegen import servegen_workload
    from fleetplan.sim.warm import history_windows

    span = spec.warm_days * DAY_S
    history = servegen_workload(spec.path, spec.model, start_s=spec.start_day * DAY_S - span, duration_s=span,
                                rate_scale=spec.scale, seed=spec.seed)
    return history_windows(history.requests(), span_s=span, interval_s=interval_s, burst_s=burst_s)


def on_day(spec: Spec, day: int, warm_days: int) -> Spec:
    """``spec`` (a ServeGen day) moved to ``day`` of the week, its forecaster warmed on the ``warm_days`` before."""
    if spec.kind != "servegen":
        raise ValueError(f"{spec.name}: --day and --warm-days are for ServeGen days, not traces")
    if not 0 <= warm_days <= day:
        raise ValueError(f"--warm-days: 0 to --day ({day}) days of the week before the run, got {warm_days}")
    name = f"{spec.name}-day{day}" + (f"-warm{warm_days}d" if warm_days else "")
    return replace(spec, name=name, start_day=day, warm_days=warm_days)


def add_engine_options(parser: argparse.ArgumentParser, profile_help: str) -> None:
    """``--profile`` (a bundled engine profile, ``profile_help`` saying what the script does with it) and
    ``--tp`` (one of its parallel configs), which :func:`held_out_engine` checks."""
    from fleetplan.sim.profiles import BUNDLED_PROFILES

    parser.add_argument("--profile", choices=sorted(BUNDLED_PROFILES), default=None, help=profile_help)
    parser.add_argument("--tp", type=int, default=None,
                        help="with --profile: of its parallel configs, the one at this tensor parallelism "
                             "(the 70B holds TP2, TP4 and TP8; without it the fewest GPUs an engine)")
    parser.add_argument("--engine-timing", choices=tuple(TIMING_SUFFIX), default="interp",
                        help="the simulated engine's pass times (fleetplan simulate --engine-timing); "
                             "interp-extend carries each decode level on past its measured usage, and "
                             "names the workloads with -extend")


def on_engine(spec: Spec, args: argparse.Namespace) -> Spec:
    """``spec`` on the engine :func:`add_engine_options` named: its timing, and its profile and TP if given."""
    spec = replace(spec, timing=args.engine_timing)
    return spec if args.profile is None else replace(spec, profile=args.profile, tp=args.tp)


def engine_suffix(profile: str, tp: int | None) -> str:
    """How bench/sizing.py names a trace run on a held-out engine: ``-PROFILE``, or ``-PROFILE-tpN``
    (bench/remeasure.py reads it back)."""
    return f"-{profile}" + ("" if tp is None else f"-tp{tp}")


TIMING_SUFFIX = {"interp": "", "interp-extend": "-extend"}
"""How bench/sizing.py names a workload run on each engine timing (``--engine-timing``)."""


def held_out_engine(parser: argparse.ArgumentParser, profile: str | None, tp: int | None) -> str | None:
    """The suffix of the traces' workloads on ``--profile`` (:func:`engine_suffix`), or None without it;
    a TP the profile does not hold is refused here, naming the ones it does, before any run."""
    from fleetplan.sim.profiles import ProfileError, load_profile

    if profile is None:
        if tp is not None:
            parser.error("--tp: picks one of --profile's parallel configs; give --profile too")
        return None
    if tp is not None:
        try:
            load_profile(profile, tp=tp)
        except ProfileError as err:
            parser.error(f"--tp {tp}: {err}")
    return engine_suffix(profile, tp)


def make_setup(spec: Spec, sla, overrides=None):
    from fleetplan.models.config import config_from_dict
    from fleetplan.sim.profiles import load_profile
    from fleetplan.sim.runner import SimOptions
    from fleetplan.sim.runner import make_setup as setup_of

    cfg = config_from_dict({"ttft_ms": sla[0], "itl_ms": sla[1], "max_gpu_budget": 4096, **(overrides or {})})
    profile = load_profile(spec.profile, tp=spec.tp)
    options = SimOptions(router=spec.router, window_s=60.0, seed=spec.seed, timing=spec.timing)
    return cfg, setup_of(cfg, profile, options)


def peak_need(spec: Spec, sla=SLAS[0]) -> tuple[int, dict]:
    """Engines the busiest window needs (capacity search on the true engine)."""
    from fleetplan.sim.experiment import size_workload

    _, setup = make_setup(spec, sla)
    sizing = size_workload(build_workload(spec), setup)
    peak = max(sizing.capacity_needs, key=lambda n: sum(n.values()))
    return sum(peak.values()), peak


def choose_scale(spec: Spec, target: int, integer: bool, sla=SLAS[0]) -> Spec:
    """Smallest copies (or scale) whose busiest window needs ``target`` engines at ``sla``."""

    def at(scale: float) -> Spec:
        return Spec(**{**spec.__dict__, "scale": scale})

    if not integer:
        need, _ = peak_need(spec, sla)
        return at(round(spec.scale * target / max(need, 1), 4))
    hi = 1
    while peak_need(at(float(hi)), sla)[0] < target and hi < 1024:
        hi *= 2
    lo = hi // 2
    while hi - lo > 1:  # need(lo) < target <= need(hi)
        mid = (lo + hi) // 2
        if peak_need(at(float(mid)), sla)[0] >= target:
            hi = mid
        else:
            lo = mid
    return at(float(hi))


def run_baselines(spec: Spec, sla) -> list[dict]:
    from fleetplan.sim.experiment import run_oracle, run_static, size_workload

    _, setup = make_setup(spec, sla)
    workload = build_workload(spec)
    sizing = size_workload(workload, setup)
    rows = []
    t0 = time.perf_counter()
    oracle = run_oracle(workload, setup, sizing, goal=0.99, rounds=5)
    rows.append(_row(spec, sla, "oracle", oracle, time.perf_counter() - t0, rounds=sizing.refine_rounds,
                     setup=setup))
    for how in ("peak", "mean"):
        t0 = time.perf_counter()
        result = run_static(workload, setup, sizing, how)
        rows.append(_row(spec, sla, f"static-{how}", result, time.perf_counter() - t0, setup=setup))
    return rows


def run_planner_config(spec: Spec, sla, loops: str, predictor: str, sizing: str = "dynamo") -> list[dict]:
    from fleetplan.models.planner import Planner
    from fleetplan.sim.experiment import initial_fleet, run_planner, size_workload

    cfg, setup = make_setup(spec, sla, {**sizing_overrides(sizing), **LOOPS[loops], "load_predictor": predictor})
    workload = build_workload(spec)
    initial = initial_fleet("warm", setup, size_workload(workload, setup), workload)
    t0 = time.perf_counter()
    result = run_planner(workload, setup, Planner(cfg, profile=setup.profile), initial)
    name = f"{sizing} {loops}" + ("" if loops == "load" else f" ({predictor})")
    return [_row(spec, sla, name, result, time.perf_counter() - t0, setup=setup)]


def _row(spec, sla, policy, result, wall, rounds=None, setup=None) -> dict:
    from fleetplan.sim import REVISION
    from fleetplan.sim.experiment import feasible_attainment

    s = result.summary
    row = {
        "sim_revision": REVISION,
        "workload": spec.name, "scale": spec.scale, "profile": spec.profile, "sla": list(sla),
        **({} if spec.tp is None else {"tp": spec.tp}),
        **({} if spec.timing == "interp" else {"timing": spec.timing}),
        "policy": policy, "attainment": s.sla_attainment, "gpu_hours": s.gpu_hours,
        "ttft_p90_ms": s.ttft_p90_ms, "itl_p90_ms": s.itl_p90_ms, "requests": s.requests,
        "peak": s.peak_replicas, "mean_ready": s.mean_replicas, "decisions": s.decisions,
        "wall_s": wall, "sim_per_wall": result.end_s / wall if wall else None, "late_events": result.late_events,
    }
    if setup is not None:
        row["feasible_attainment"] = feasible_attainment(result, setup)
    if rounds is not None:
        row["oracle_rounds"] = rounds
    return row


def _task(args):
    kind, spec, sla, extra = args
    if kind == "baselines":
        return run_baselines(spec, sla)
    return run_planner_config(spec, sla, *extra)


WORKLOADS = ("conv", "code", "mooncake", "mooncake-spread", "m-large", "m-mid")
EVERY_WORKLOAD = frozenset(WORKLOADS)
"""What ``specs`` can be asked for (its ``only``)."""

TRACES = WORKLOADS[:4]
"""The 30-minute traces (the rest are ServeGen days): what the one-trace scripts take."""


def one_workload_parser(doc: str, choices=TRACES, default: str = "code") -> argparse.ArgumentParser:
    """The options of a script that runs one workload at one rate scale: --data, --only, --scale, --sla."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (traces/)")
    parser.add_argument("--only", default=default, choices=choices, help="one workload of bench/quality.py")
    parser.add_argument("--scale", type=float, required=True, help="the rate scale")
    parser.add_argument("--sla", default="500,50", help="TTFT,ITL in ms")
    return parser


def one_workload(parser: argparse.ArgumentParser, args) -> tuple[Spec, tuple[float, float]]:
    """The workload at ``--scale`` and the SLA pair, each refused with argparse's line if wrong.

    Checked before any data is read: a bad scale failed after the trace
    was, and an SLA that is not two numbers in a traceback.
    """
    if not (math.isfinite(args.scale) and args.scale > 0):
        parser.error(f"--scale: a rate scale > 0, got {args.scale:g}")
    sla = sla_pair(parser, args.sla)
    (base,) = specs(args.data, {args.only}, 10, 10, 24.0, choose=False)
    return replace(base, scale=args.scale), sla


def sla_pair(parser: argparse.ArgumentParser, text: str) -> tuple[float, float]:
    """``--sla TTFT,ITL`` in ms, refused before any run unless it is two finite numbers > 0.

    Every bench script that takes an SLA reads it here: some split it
    unchecked (``500/50`` was a traceback, ``500`` one after the traces were
    read), one took only the two pairs bench/sizing.py records.
    """
    try:
        pair = tuple(float(v) for v in text.split(","))
    except ValueError:
        pair = ()
    if len(pair) != 2 or not all(0 < v < float("inf") for v in pair):
        parser.error(f"--sla: TTFT,ITL in ms, two numbers > 0, got {text!r}")
    return pair


def rate_scale_shift(parser: argparse.ArgumentParser, value: float | None) -> float | None:
    """``--rate-scale-shift``, refused before any run unless it is a finite number of seconds >= 0."""
    if value is not None and not (0 <= value < float("inf")):
        parser.error(f"--rate-scale-shift: a finite number of seconds >= 0, got {value}")
    return value


def draw_seed(parser: argparse.ArgumentParser, value: int) -> int:
    """``--seed``, the draw of a workload, refused before any run unless it is a whole number >= 0
    (``random.Random(-1)`` is ``random.Random(1)``: a negative seed ran another draw under its name)."""
    if value < 0:
        parser.error(f"--seed: a whole number >= 0, got {value}")
    return value


def only_workloads(parser: argparse.ArgumentParser, value: str) -> set[str]:
    """``--only`` as workload names, refusing one ``specs`` does not know.

    ``specs`` skips a name it does not know, so a misspelled one ran
    nothing and printed an empty table with status 0.
    """
    asked = {w.strip() for w in value.split(",") if w.strip()}
    unknown = sorted(asked - EVERY_WORKLOAD)
    if unknown or not asked:
        parser.error(f"--only: workloads of {', '.join(WORKLOADS)}, comma-separated, got {value!r}"
                     + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    return asked


TRACE_KEYS = frozenset({"conv", "code", "mooncake", "mooncake-spread"})  # the 30-minute traces' --only keys


def trace_specs(data: Path) -> list[Spec]:
    """The 30-minute trace workloads, at scale 1."""
    return specs(data, set(TRACE_KEYS), 10, 24, 24.0, choose=False)


def named_trace_spec(parser: argparse.ArgumentParser, data: Path, name: str) -> Spec:
    """The 30-minute trace workload called ``name``, at scale 1; a usage error names the choices."""
    found = {s.name: s for s in trace_specs(data)}
    if name not in found:
        parser.error(f"--workload: one of {', '.join(found)} (the 30-minute traces), got {name!r}")
    return found[name]


def specs(
    data: Path, only: set[str], min_engines: int, servegen_engines: int, hours: float, choose: bool = True,
) -> list[Spec]:
    """The workloads named in ``only``, rate-scaled (``choose``) or at scale 1."""
    traces = data / "traces"
    mooncake = str(traces / "mooncake" / "conversation_trace_first30min.jsonl")
    base = [
        Spec("azure-conv-30min", "trace", str(traces / "azure2023" / "AzureLLMInferenceTrace_conv_first30min.csv"), "h200-llama3.1-8b", key="conv"),
        Spec("azure-code-30min", "trace", str(traces / "azure2023" / "AzureLLMInferenceTrace_code_first30min.csv"), "h200-llama3.1-8b", key="code"),
        Spec("mooncake-conv-30min", "trace", mooncake, "h200-llama3.1-8b", router="prefix", key="mooncake"),
        # the same trace with its 3-s timestamp steps spread (sim/workload.py: spread_arrivals)
        Spec("mooncake-conv-30min-spread", "trace", mooncake, "h200-llama3.1-8b", router="prefix",
             key="mooncake-spread", spread=True),
    ]
    clients = str(data / "rates" / "servegen" / "clients_rate_10min_week1.csv.gz")
    gen = [
        Spec(f"servegen-{m}-{hours:g}h", "servegen", clients, "h100-llama3.3-70b", 0.1, m, hours)
        for m in ("m-large", "m-mid")  # m-small: 34 M requests a day at this rule, ~45 min a run here
    ]
    out = []
    for s in base:
        if s.key in only:
            out.append(choose_scale(s, min_engines, integer=True) if choose else s)
    for s in gen:
        if s.model in only:
            # sized at the tight SLA, where the fleet is largest (decode-bound on the 70B)
            out.append(choose_scale(s, servegen_engines, integer=False, sla=SLAS[1]) if choose else s)
    return out


def markdown(rows: list[dict], scales: dict) -> str:
    lines = []
    by_workload: dict[str, list[dict]] = {}
    for r in rows:
        by_workload.setdefault(r["workload"], []).append(r)
    for name, wrows in by_workload.items():
        info = scales[name]
        lines.append(f"### {name}\n")
        lines.append(
            f"Rate scale {info['scale']:g} ({info['requests']:,} requests), profile {info['profile']}; "
            f"the busiest minute needs {info['peak_need']} engines {info['peak_roles']} at 500/50"
            + (f" and {info['peak_need_tight']} {info['peak_roles_tight']} at 200/20" if "peak_need_tight" in info else "")
            + " (capacity search on the true engine).\n"
        )
        lines.append("| policy | attain. 500/50 | feasible | GPU-h | × oracle "
                     "| attain. 200/20 | feasible | GPU-h | × oracle |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        policies = []
        for r in wrows:
            if r["policy"] not in policies:
                policies.append(r["policy"])
        order = ["static-peak", "static-mean", "oracle"] + [
            f"{sizing} {loops}" + ("" if loops == "load" else f" ({p})")
            for sizing in SIZINGS + EXTRA_SIZINGS for loops in LOOPS
            for p in (["constant"] if loops == "load" else PREDICTORS)
        ]
        policies = [p for p in order if p in policies] + sorted(p for p in policies if p not in order)
        for p in policies:
            cells = [p]
            for sla in SLAS:
                match = [r for r in wrows if r["policy"] == p and tuple(r["sla"]) == sla]
                oracle = [r for r in wrows if r["policy"] == "oracle" and tuple(r["sla"]) == sla]
                if not match:
                    cells += ["", "", "", ""]
                    continue
                r = match[0]
                ratio = r["gpu_hours"] / oracle[0]["gpu_hours"] if oracle and oracle[0]["gpu_hours"] else float("nan")
                feasible = r.get("feasible_attainment")
                cells += [f"{r['attainment']:.2%}", "" if feasible is None else f"{feasible:.2%}",
                          f"{r['gpu_hours']:.1f}", f"{ratio:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, help="the shared data folder (traces/, rates/); required unless --render")
    parser.add_argument("--only", default="conv,code,mooncake,m-large,m-mid",
                        help=f"workloads, comma-separated: {', '.join(WORKLOADS)}")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--min-engines", type=int, default=10)
    parser.add_argument("--servegen-engines", type=int, default=24)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    parser.add_argument("--render", type=Path, nargs="+", default=None, help="only render these JSON results as markdown")
    parser.add_argument("--sla", default="500/50,200/20", help="SLAs to run, TTFT/ITL in ms, comma-separated")
    parser.add_argument("--sizings", default=",".join(SIZINGS),
                        help=f"any of {', '.join(SIZINGS + EXTRA_SIZINGS)} (default: {', '.join(SIZINGS)})")
    parser.add_argument("--loops", default=",".join(LOOPS))
    parser.add_argument("--predictors", default="", help="only these predictors (default: every one)")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="skip static-peak, static-mean and the oracle (e.g. already measured)")
    args = parser.parse_args()
    if args.render:
        rows, scales = [], {}
        for path in args.render:
            data = json.loads(path.read_text())
            rows += data["rows"]
            scales.update(data["scales"])
        print(markdown(rows, scales))
        return
    if args.data is None:
        parser.error("--data is required unless --render")
    only = only_workloads(parser, args.only)
    for option, value, known in (("--loops", args.loops, tuple(LOOPS)), ("--predictors", args.predictors, PREDICTORS)):
        unknown = sorted({v for v in value.split(",") if v} - set(known))
        if unknown:
            parser.error(f"{option}: any of {', '.join(known)}, got {', '.join(unknown)}")
    try:
        slas = [tuple(float(v) for v in pair.split("/")) for pair in args.sla.split(",")]
    except ValueError:
        slas = []
    if not slas or any(sla not in SLAS for sla in slas):
        # the tables have a column pair for each of SLAS only: another SLA ran and was never shown
        parser.error(f"--sla: any of {', '.join(f'{t:g}/{i:g}' for t, i in SLAS)}, got {args.sla}")
    unknown = set(args.sizings.split(",")) - set(SIZINGS + EXTRA_SIZINGS)
    if unknown:
        parser.error(f"--sizings: one of {', '.join(SIZINGS + EXTRA_SIZINGS)}, got {', '.join(sorted(unknown))}")
    started = time.time()
    chosen = specs(args.data, only, args.min_engines, args.servegen_engines, args.hours)
    scales = {}
    for s in chosen:
        need, peak = peak_need(s)
        tight, tight_roles = peak_need(s, SLAS[1])
        scales[s.name] = {"scale": s.scale, "profile": s.profile, "peak_need": need, "peak_roles": peak,
                          "peak_need_tight": tight, "peak_roles_tight": tight_roles,
                          "requests": sum(1 for _ in build_workload(s).requests())}
        print(f"{s.name}: scale {s.scale:g}, busiest window needs {need} engines {peak} at 500/50, "
              f"{tight} {tight_roles} at 200/20", flush=True)
    wanted = set(args.predictors.split(",")) if args.predictors else None
    tasks = []
    for s in chosen:
        for sla in slas:
            if args.baselines:
                tasks.append(("baselines", s, sla, None))
            for sizing in args.sizings.split(","):
                for loops in args.loops.split(","):
                    for predictor in (["constant"] if loops == "load" else predictors(sizing)):
                        if wanted is None or predictor in wanted:
                            tasks.append(("planner", s, sla, (loops, predictor, sizing)))
    rows: list[dict] = []
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            for out in pool.map(_task, tasks):
                rows.extend(out)
                _progress(out, started)
    else:
        for t in tasks:
            out = _task(t)
            rows.extend(out)
            _progress(out, started)
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "jobs": args.jobs}
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "scales": scales, "rows": rows}, indent=1))
    table = markdown(rows, scales)
    if args.md:
        args.md.write_text(table)
    print(table)
    print(f"total wall {time.time() - started:.0f} s; {machine}")


def _progress(rows, started):
    for r in rows:
        print(
            f"[{time.time() - started:6.0f}s] {r['workload']} {r['sla']} {r['policy']}: "
            f"{r['attainment']:.2%} {r['gpu_hours']:.2f} GPU-h ({r['wall_s']:.0f} s, "
            f"{r['sim_per_wall'] or 0:.0f}x)", flush=True,
        )


if __name__ == "__main__":
    main()
