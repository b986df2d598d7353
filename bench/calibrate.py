"""Calibration: does a simulated engine reproduce what was measured?

Usage (the shared data folder is an argument):

    .venv/bin/python bench/calibrate.py --data /work/shared/data [--md calibration.md]

Three checks, printed as markdown tables (docs/calibration.md holds a run):

1. **Profile points, one engine at a time.** Each prefill NPZ row: one
   prompt of that ISL on an idle simulated prefill engine (chunked at
   ``max_num_batched_tokens`` = 8192), TTFT against the measured TTFT. Each
   decode NPZ row: the batch the row describes (``kv_usage·max_kv / ctx``
   sequences at that context) on an idle simulated decode engine, ITL over
   50 steps against the measured ITL. For contrast, the planner's own linear
   fit of the same profile (``--engine-timing fit``) at the same points.
2. **Between context levels, held out.** The simulated engine interpolates
   decode ITL between the measured context levels linearly in 1/context
   (linear in the batch at a fixed KV usage). Each inner level is dropped in
   turn and predicted from its two neighbours, in 1/context and, for
   contrast, linearly in the context itself; mean and largest error against
   the measured rows.
3. **A measured serving curve.** DistServe's vLLM runs of OPT-13B on one
   A100 (37 runs with Poisson arrivals, one JSON line per request): each run
   replayed request for request (same issue times, prompt and output
   lengths) against one simulated aggregated engine whose profile is
   DistServe's fitted vLLM coefficients, as given and with the host's cost
   per running sequence per decode step fitted on TPOT below the knee; TTFT
   and TPOT percentiles against the measured ones, and the rate at which
   TTFT p90 breaks (not fitted: the check).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path

import numpy as np

from fleetplan.models.config import config_from_dict
from fleetplan.models.perf import EngineLimits
from fleetplan.sim.baselines import StaticPolicy
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.engines import Engine, SimRequest
from fleetplan.sim.experiment import run_policy
from fleetplan.sim.profile_convert import distserve_profile
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.runner import SimOptions, make_setup
from fleetplan.sim.timing import engine_timing
from fleetplan.sim.traces import TraceRequest
from fleetplan.sim.workload import Workload


class _Sink:
    def __init__(self):
        self.done = []

    def request_finished(self, req, engine, now):
        req.end = now
        self.done.append(req)

    def prompt_done(self, req, engine, now):
        req.prefill_end = now
        self.done.append(req)

    def engine_drained(self, engine):
        pass


def _engine(role, timing, limits):
    clock = VirtualClock()
    sink = _Sink()
    engine = Engine(f"{role}-0", role, 1, timing, limits, clock, sink, 0.0)
    engine.state = "ready"
    return engine, clock, sink


def lone_prompt_ttft(timing, limits, isl: int) -> float:
    engine, clock, sink = _engine("prefill", timing, limits)
    engine.enqueue(SimRequest(0, 0.0, isl, 2))
    while clock.step():
        pass
    return sink.done[0].prefill_end


def batch_itl(timing, limits, seqs: int, ctx: float, steps: int = 50) -> float:
    engine, clock, sink = _engine("decode", timing, limits)
    isl = max(1, int(round(ctx)) - steps // 2)  # mid-run context = the row's context
    for i in range(seqs):
        req = SimRequest(i, 0.0, isl, steps + 1)
        req.first_token = 0.0
        engine.enqueue(req)
    while clock.step():
        pass
    return max(r.end for r in sink.done) / steps


def profile_points(name: str, tp: int | None) -> str:
    profile = load_profile(name, tp=tp)
    limits = EngineLimits(max_kv_tokens=profile.max_kv_tokens)
    interp = engine_timing(profile, "interp")
    fit = engine_timing(profile, "fit", limits)
    # The profiler ran each prompt in one pass; the default 8,192-token budget chunks longer ones.
    unchunked = EngineLimits(max_num_batched_tokens=32_768, max_kv_tokens=profile.max_kv_tokens)
    lines = [f"#### {name} (TP{profile.tp}), prefill: TTFT of one prompt on an idle engine\n",
             "| ISL | measured ms | simulated ms | error | chunked at 8,192 ms | error | planner's linear fit ms | fit error |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errs, chunk_errs = [], []
    for isl, ttft in zip(profile.prefill_isl.tolist(), profile.prefill_ttft_ms.tolist(), strict=True):
        sim = lone_prompt_ttft(interp, unchunked, int(isl)) * 1000
        chunked = lone_prompt_ttft(interp, limits, int(isl)) * 1000
        lin = lone_prompt_ttft(fit, unchunked, int(isl)) * 1000
        errs.append(abs(sim / ttft - 1))
        chunk_errs.append(abs(chunked / ttft - 1))
        lines.append(
            f"| {int(isl):,} | {ttft:.1f} | {sim:.1f} | {sim / ttft - 1:+.1%} | {chunked:.1f} | "
            f"{chunked / ttft - 1:+.1%} | {lin:.1f} | {lin / ttft - 1:+.1%} |"
        )
    lines.append(
        f"\nLargest simulated error: {max(errs):.1%} in one pass (as profiled); {max(chunk_errs):.1%} "
        "when prompts above 8,192 tokens are chunked at the default budget.\n"
    )
    lines += [f"#### {name} (TP{profile.tp}), decode: ITL of a batch on an idle engine\n",
              "| KV usage | context | sequences | measured ms | simulated ms | error | linear fit ms | fit error |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errs = []
    skipped = 0
    for u, ctx, itl in zip(profile.x_kv_usage.tolist(), profile.y_context_length.tolist(), profile.z_itl_ms.tolist(), strict=True):
        seqs = u * profile.max_kv_tokens / ctx
        if seqs < 0.5 or round(seqs) > 4096:
            skipped += 1
            continue
        seqs = max(1, round(seqs))
        sim = batch_itl(interp, EngineLimits(max_num_seqs=4096, max_kv_tokens=profile.max_kv_tokens), seqs, ctx) * 1000
        lin = batch_itl(fit, EngineLimits(max_num_seqs=4096, max_kv_tokens=profile.max_kv_tokens), seqs, ctx) * 1000
        errs.append(abs(sim / itl - 1))
        lines.append(f"| {u:.3f} | {ctx:,.0f} | {seqs} | {itl:.2f} | {sim:.2f} | {sim / itl - 1:+.1%} | {lin:.2f} | {lin / itl - 1:+.1%} |")
    lines.append(f"\nLargest simulated error: {max(errs):.1%} over {len(errs)} rows"
                 + (f" ({skipped} rows with under half a sequence skipped)" if skipped else "") + ".\n")
    return "\n".join(lines)


def held_out_levels(name: str, tp: int | None) -> str:
    """Predict each inner context level from its neighbours: in 1/context and in context."""
    profile = load_profile(name, tp)
    rows = profile.decode_levels()
    levels = list(rows)
    lines = [f"#### {name} (TP{profile.tp})\n",
             "| held-out context | from | rows | in 1/context: mean | max | in context: mean | max |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for below, ctx, above in zip(levels[:-2], levels[1:-1], levels[2:], strict=True):
        (usage, itl), (u0, t0), (u1, t1) = rows[ctx], rows[below], rows[above]
        inside = (usage >= max(u0[0], u1[0])) & (usage <= min(u0[-1], u1[-1]))
        if not inside.any():
            continue
        lo, hi = np.interp(usage[inside], u0, t0), np.interp(usage[inside], u1, t1)
        w_inverse = (1 / below - 1 / ctx) / (1 / below - 1 / above)
        w_linear = (ctx - below) / (above - below)
        e_inv = np.abs((lo + (hi - lo) * w_inverse) / itl[inside] - 1)
        e_lin = np.abs((lo + (hi - lo) * w_linear) / itl[inside] - 1)
        lines.append(f"| {ctx:,.0f} | {below:,.0f} and {above:,.0f} | {int(inside.sum())} | {e_inv.mean():.1%} | "
                     f"{e_inv.max():.1%} | {e_lin.mean():.1%} | {e_lin.max():.1%} |")
    return "\n".join(lines) + "\n"


KNEE_MS = 1000.0  # TTFT p90 above this is where the serving curve "breaks"
HOST_GRID = np.round(np.arange(0.0, 1.501, 0.05), 2)  # ms per running sequence per decode step


def vllm_runs(folder: Path) -> list[dict]:
    """DistServe's vLLM runs, by rate: the summary row and the replayable
    requests (``raw/RUN.jsonl``, or ``.jsonl.gz`` as the tests bundle them)."""
    summary = [line.split(",") for line in (folder / "summary_ttft_tpot_vs_rate.csv").read_text().splitlines()]
    header, rows = summary[0], summary[1:]
    col = {h: i for i, h in enumerate(header)}
    runs = []
    for r in sorted((r for r in rows if r[col["system"]] == "vllm"), key=lambda r: float(r[col["nominal_rate"]])):
        path = folder / "raw" / f"{r[col['file']]}.jsonl"
        text = path.read_text() if path.exists() else gzip.decompress(path.with_suffix(".jsonl.gz").read_bytes()).decode()
        raw = [json.loads(x) for x in text.splitlines() if x.strip()]
        t0 = min(x["issue_time"] for x in raw)
        reqs = sorted((TraceRequest(x["issue_time"] - t0, int(x["prompt_len"]), int(x["output_len"])) for x in raw),
                      key=lambda q: q.arrival_s)
        runs.append({
            "file": r[col["file"]], "rate": float(r[col["nominal_rate"]]),
            "ttft": [float(r[col[k]]) for k in ("ttft_p50", "ttft_p90", "ttft_p99")],
            "tpot": [float(r[col[k]]) for k in ("tpot_p50", "tpot_p90")],
            "workload": Workload.from_requests(r[col["file"]], reqs, math.ceil(reqs[-1].arrival_s) + 1),
        })
    return runs


def replay_vllm(runs: list[dict], profile) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each run request for request on one simulated vLLM engine: (TTFT p50/p90/p99, TPOT p50/p90) in ms."""
    cfg = config_from_dict({
        "mode": "agg", "max_num_batched_tokens": 2560, "max_num_seqs": 256, "max_kv_tokens": profile.max_kv_tokens,
        "max_gpu_budget": 64,
    })
    # The measured runs predate chunked prefill: prompts run in passes of their own.
    setup = make_setup(cfg, profile, SimOptions(agg_scheduler="prefill-first"))
    out = []
    for run in runs:
        a = run_policy(run["workload"], setup, StaticPolicy({"agg": 1}), "vllm", {"agg": 1}).requests.arrays()
        itl = a["itl"][~np.isnan(a["itl"])]
        out.append((np.percentile(a["ttft"], [50, 90, 99]) * 1000, np.percentile(itl, [50, 90]) * 1000))
    return out


def knee(rates: list[float], ttft_p90: list[float]) -> tuple[float | None, float | None]:
    ok = [r for r, t in zip(rates, ttft_p90, strict=True) if t <= KNEE_MS]
    bad = [r for r, t in zip(rates, ttft_p90, strict=True) if t > KNEE_MS]
    return (max(ok) if ok else None, min(bad) if bad else None)


def host_sweep(runs: list[dict], coefficients: Path) -> dict[float, list[tuple[np.ndarray, np.ndarray]]]:
    """Every run replayed at every host cost of ``HOST_GRID``: the fit and the knee read the same replays."""
    return {
        float(host): replay_vllm(runs, distserve_profile(coefficients, "facebook/opt-13b", 1, host_ms_per_seq=host))
        for host in HOST_GRID
    }


def fit_host_ms(
    runs: list[dict], coefficients: Path, sweep: dict | None = None,
) -> tuple[float, list[float], list[int]]:
    """The host's cost per running sequence per decode step, fitted on TPOT.

    The smallest mean |log(simulated / measured TPOT p50)| on ``HOST_GRID``
    over the runs whose *measured* TTFT p90 is under the knee. Returns the
    fit, the error at each grid point and the runs it used. The knee itself
    (TTFT p90, at higher rates) is not fitted: it is the check. ``sweep``
    is :func:`host_sweep`'s replays, when the caller has them.
    """
    sweep = sweep if sweep is not None else host_sweep(runs, coefficients)
    below = [i for i, r in enumerate(runs) if r["ttft"][1] <= KNEE_MS]
    errors = [
        float(np.mean([abs(math.log(sim[i][1][0] / runs[i]["tpot"][0])) for i in below]))
        for sim in sweep.values()
    ]
    return float(HOST_GRID[int(np.argmin(errors))]), errors, below


def distserve_curve(data: Path) -> str:
    """Replay DistServe's vLLM runs on its fitted coefficients, as given and
    with the host's per-sequence step cost (:func:`fit_host_ms`) added."""
    folder = data / "profiles" / "distserve"
    runs = vllm_runs(folder)
    rates = [r["rate"] for r in runs]
    coefficients = folder / "profiler-a100-80g.vllm.json"
    sweep = host_sweep(runs, coefficients)
    fitted, errors, below = fit_host_ms(runs, coefficients, sweep)
    lines = [
        f"Host cost per running sequence per decode step, fitted on TPOT p50 of the {len(below)} runs whose "
        f"measured TTFT p90 is under {KNEE_MS:,.0f} ms (rates {', '.join(f'{rates[i]:g}' for i in below)} req/s), "
        f"grid 0–{HOST_GRID[-1]:g} ms by 0.05: **{fitted:g} ms** (mean |log error| {min(errors):.3f}; "
        f"{errors[0]:.3f} without it).\n",
        "| run | rate req/s | measured TTFT p50 / p90 / p99 ms | simulated, coefficients as given | "
        f"simulated, + {fitted:g} ms/seq/step | measured TPOT p50 / p90 ms | as given | + {fitted:g} ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    given, host = sweep[0.0], sweep[fitted]

    def ms(v) -> str:
        return " / ".join(f"{x:,.0f}" for x in v)

    for run, (g_ttft, g_tpot), (h_ttft, h_tpot) in zip(runs, given, host, strict=True):
        lines.append(f"| {run['file']} | {run['rate']:g} | {ms(run['ttft'])} | {ms(g_ttft)} | {ms(h_ttft)} | "
                     f"{ms(run['tpot'])} | {ms(g_tpot)} | {ms(h_tpot)} |")
    for label, p90 in (("measured", [r["ttft"][1] for r in runs]), ("simulated, coefficients as given", [g[0][1] for g in given]),
                       (f"simulated, + {fitted:g} ms/seq/step", [h[0][1] for h in host])):
        lo, hi = knee(rates, p90)
        lines.append(f"\nTTFT p90 breaks (first rate above {KNEE_MS / 1000:g} s), {label}: between {lo} and {hi} req/s.")
    measured = knee(rates, [r["ttft"][1] for r in runs])
    matching = [h for h, sim in sweep.items() if knee(rates, [x[0][1] for x in sim]) == measured]
    lines.append(f"\nGrid host costs whose simulated knee is the measured one: "
                 f"{', '.join(f'{h:g}' for h in matching) or 'none'} ms.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--md", type=Path, default=None,
                        help="also write the tables (not the page: docs/calibration.md quotes them) to this file")
    args = parser.parse_args()
    parts = [
        "### Profile points\n",
        profile_points("h200-llama3.1-8b", None),
        profile_points("h100-llama3.3-70b", 2),
        "### Decode between context levels (each inner level held out)\n",
        held_out_levels("h200-llama3.1-8b", None),
        held_out_levels("h100-llama3.3-70b", 2),
        "### DistServe vLLM OPT-13B, one A100\n",
        distserve_curve(args.data),
    ]
    text = "\n".join(parts)
    if args.md:
        args.md.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
