"""The bench scripts refuse what they cannot run with argparse's one line and status 2.

Each is run as a subprocess with options it refuses before reading any data,
so no data folder is needed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.sim_helpers import sizing_tasks

ROOT = Path(__file__).parents[2]


def _bench(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _refused(result: subprocess.CompletedProcess) -> str:
    """The error line of a run argparse refused."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_quality_needs_data_unless_it_only_renders():
    assert _refused(_bench("quality.py")).endswith("error: --data is required unless --render")
    assert "--render: expected at least one argument" in _refused(_bench("quality.py", "--render"))


@pytest.mark.parametrize(("script", "args"), [
    ("quality.py", ["--only", "conv,cnov"]),
    ("sizing.py", ["--only", "conv,cnov"]),
])
def test_a_misspelled_workload_is_refused_not_skipped(script, args):
    """It ran nothing and printed an empty table with status 0."""
    line = _refused(_bench(script, "--data", "/nonexistent", *args))
    assert "--only: workloads of conv, code, mooncake, mooncake-spread, m-large, m-mid" in line
    assert line.endswith("(unknown: cnov)")


@pytest.mark.parametrize(("option", "value"), [("--loops", "boht"), ("--predictors", "arima,ensmble")])
def test_quality_refuses_loops_and_predictors_it_does_not_run(option, value):
    line = _refused(_bench("quality.py", "--data", "/nonexistent", option, value))
    assert f"error: {option}: any of" in line and line.endswith(value.split(",")[-1])


def test_sizing_refuses_a_negative_rate_scale_shift():
    line = _refused(_bench("sizing.py", "--data", "/nonexistent", "--rate-scale-shift", "-1"))
    assert line.endswith("error: --rate-scale-shift: a finite number of seconds >= 0, got -1.0")


def test_a_shifted_trace_spec_keeps_the_traces_minutes():
    """bench/sizing.py --rate-scale-shift S builds the trace as fleetplan simulate
    --rate-scale-shift does: its copies within S seconds, the minutes' shape kept."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from quality import Spec, build_workload
    finally:
        sys.path.remove(str(ROOT / "bench"))
    code = str(ROOT / "examples" / "traces" / "azure_code_10min.csv")
    flat, kept = (build_workload(Spec("code", "trace", code, "h200-llama3.1-8b", scale=20, shift=shift))
                  for shift in (None, 30.0))

    def minutes(workload):
        return np.bincount([int(r.arrival_s // 60) for r in workload.requests()], minlength=10)[:10]

    assert minutes(kept).std() > 2 * minutes(flat).std() and minutes(kept).sum() == minutes(flat).sum()


@pytest.mark.parametrize("sla", ["300/30", "500,50", "fast"])
def test_quality_refuses_an_sla_its_tables_have_no_column_for(sla):
    """A pair outside the two the tables show ran every row and left it out of the table."""
    line = _refused(_bench("quality.py", "--data", "/nonexistent", "--sla", sla))
    assert line.endswith(f"error: --sla: any of 500/50, 200/20, got {sla}")


@pytest.mark.parametrize(("script", "args"), [
    ("held_scale_down.py", ["--scales", "1"]),
    ("decode_fit.py", ["--scale", "1"]),
])
def test_the_one_trace_scripts_name_the_traces(script, args):
    """A name that was not a trace crashed unpacking an empty list of workloads."""
    line = _refused(_bench(script, "--data", "/nonexistent", "--only", "cnov", *args))
    assert "argument --only: invalid choice: 'cnov'" in line and "'mooncake-spread'" in line


@pytest.mark.parametrize("shift", ["-1", "nan", "inf"])
def test_held_scale_down_refuses_a_shift_that_is_not_seconds(shift):
    """Its --rate-scale-shift, as bench/sizing.py's, is refused before any run, naming the option."""
    line = _refused(_bench("held_scale_down.py", "--data", "/nonexistent", "--only", "conv", "--scales", "34",
                           "--rate-scale-shift", shift))
    assert line.endswith(f"--rate-scale-shift: a finite number of seconds >= 0, got {float(shift)}")


@pytest.mark.parametrize(("args", "message"), [
    (["--vary", "decode=x"], "--vary 'decode=x': expected ROLE=N[,N...] with whole numbers >= 0"),
    (["--vary", "decode=3 prefill=4"], "--vary 'decode=3 prefill=4': one role and its counts"),
    (["--fleet", "prefill=2,3"], "--fleet 'prefill=2,3': one count per role"),
    # ran the last one's counts only
    (["--vary", "decode=3 decode=5"], "--vary 'decode=5': decode is given twice"),
    (["--fleet", "prefill=24;prefill=2"], "--fleet 'prefill=2': prefill is given twice"),
    (["--scales", "6,-1"], "--scales: positive numbers separated by commas, got '6,-1'"),
    (["--scales", "6,inf"], "--scales: positive numbers separated by commas, got '6,inf'"),  # a traceback
    (["--workload", "mooncake"], "--workload: one of azure-conv-30min, azure-code-30min, mooncake-conv-30min, "
                                 "mooncake-conv-30min-spread (the 30-minute traces), got 'mooncake'"),
    (["--fleet", "agg=2"], "--fleet and --vary: a count for each of prefill, decode, got agg, decode"),
    # a traceback: not two numbers, and a target the config refuses
    (["--sla", "500"], "--sla: TTFT,ITL in ms, two numbers > 0, got '500'"),
    (["--sla", "500,x"], "--sla: TTFT,ITL in ms, two numbers > 0, got '500,x'"),
    (["--sla", "500,-50"], "--sla: TTFT,ITL in ms, two numbers > 0, got '500,-50'"),
    # run: random.Random(-1) is random.Random(1), so the table was seed 1's draw
    (["--seed", "-1"], "--seed: a whole number >= 0, got -1"),
    (["--tp", "4"], "--tp: picks one of --profile's parallel configs; give --profile too"),
    (["--profile", "h100-llama3.3-70b", "--tp", "3"], "--tp 3:"),
])
def test_fixed_fleet_refuses_before_running_anything(args, message):
    """Each refusal names its option and what was expected, before a workload is read and before
    the table's header (a refused run printed the header of a table it never filled)."""
    given = {"--workload": "mooncake-conv-30min", "--scales": "6", "--fleet": "prefill=24", "--vary": "decode=3,4"}
    given.update(zip(args[::2], args[1::2], strict=True))
    result = _bench("fixed_fleet.py", "--data", "/nonexistent", *(x for kv in given.items() for x in kv))
    assert message in _refused(result), result.stderr
    assert result.stdout == ""


def _runs(path: Path, *policies: str) -> Path:
    rows = [{"workload": "azure-code-30min", "scale": 1.0, "sla": [500.0, 50.0], "policy": p,
             "attainment": 0.5, "gpu_hours": 9.0} for p in policies]
    path.write_text(json.dumps({"sla": [500.0, 50.0], "rows": rows}))
    return path


def test_remeasure_refuses_a_policy_the_file_does_not_hold(tmp_path):
    """It re-ran nothing and rewrote the file as it was."""
    runs = _runs(tmp_path / "runs.json", "oracle", "fleetplan (ensemble)")
    before = runs.read_text()
    line = _refused(_bench("remeasure.py", str(runs), "--data", "/nonexistent",
                           "--only-policies", "fleetplan (ensembel)"))
    assert line.endswith(f"--only-policies: no row of {runs} is 'fleetplan (ensembel)'; "
                         "its policies: fleetplan (ensemble), oracle")
    assert runs.read_text() == before
    line = _refused(_bench("remeasure.py", str(runs), "--data", "/nonexistent", "--only-workloads", "azure-cdoe-30min"))
    assert line.endswith(f"--only-workloads: no row of {runs} is 'azure-cdoe-30min'; its workloads: azure-code-30min")
    assert runs.read_text() == before


@pytest.mark.parametrize("pool", [[], ["--pool"]])
def test_frontier_refuses_a_default_no_run_holds(tmp_path, pool):
    runs = _runs(tmp_path / "runs.json", "oracle", "fleetplan (ensemble)")
    line = _refused(_bench("frontier.py", str(runs), "--default", "fleetplan (ensembel)", *pool))
    assert line.endswith("--default: no row of the runs is 'fleetplan (ensembel)'; their policies: "
                         "fleetplan (ensemble), oracle")


def test_bench_queueing_describes_itself_on_help_and_refuses_unknown_flags():
    """Without a parser, --help ran the benchmark."""
    shown = _bench("bench_queueing.py", "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: bench_queueing.py")
    assert "What the queueing models cost" in shown.stdout and "erlang_c(1024" not in shown.stdout
    assert "unrecognized arguments: --bogus" in _refused(_bench("bench_queueing.py", "--bogus"))


@pytest.mark.parametrize("script", ["forecast.py", "forecast_bound.py", "forecast_clients.py", "forecast_gap.py"])
def test_the_forecast_benches_need_the_data_folder_named(script):
    """As every other bench script does: their default was a folder beside the author's checkout."""
    assert "the following arguments are required: --data" in _refused(_bench(script))


@pytest.mark.parametrize(("args", "message"), [
    (["--only", "cnov", "--scale", "1"], "argument --only: invalid choice: 'cnov'"),
    (["--scale", "1", "--startup", "lognormal:300"], "--startup: "),
    (["--scale", "1", "--sla", "500/50"], "--sla: TTFT,ITL in ms, two numbers > 0, got '500/50'"),  # a traceback before
    (["--scale", "0"], "--scale: a rate scale > 0, got 0"),  # a traceback after reading the trace
    (["--scale", "nan"], "--scale: a rate scale > 0, got nan"),
])
def test_startup_by_ack_refuses_before_reading_data(args, message):
    assert message in _refused(_bench("startup_by_ack.py", "--data", "/nonexistent", *args))


@pytest.mark.parametrize(("args", "message"), [
    (["--scale", "1", "--sla", "500/50"], "--sla: TTFT,ITL in ms, two numbers > 0, got '500/50'"),  # a traceback until 2026-12-05
    (["--scale", "-1"], "--scale: a rate scale > 0, got -1"),  # one after reading the trace
])
def test_decode_fit_takes_the_same_checks_of_its_workload(args, message):
    """bench/quality.py one_workload: the one-workload scripts check --scale and --sla alike."""
    assert message in _refused(_bench("decode_fit.py", "--data", "/nonexistent", *args))


def test_a_shape_kept_trace_is_scaled_for_its_own_busiest_window():
    """bench/sizing.py --choose-scale: quality.py's rule (the fewest copies whose busiest window
    needs 10 engines) on the trace as it runs; with its shape kept the busiest minute is busier,
    so fewer copies reach it than the flattened trace needs."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from quality import Spec, choose_scale, peak_need
    finally:
        sys.path.remove(str(ROOT / "bench"))
    code = str(ROOT / "examples" / "traces" / "azure_code_10min.csv")
    flat, kept = (choose_scale(Spec("code", "trace", code, "h200-llama3.1-8b", shift=shift), 10, integer=True)
                  for shift in (None, 30.0))
    assert kept.scale < 0.6 * flat.scale
    assert peak_need(kept)[0] >= 10 > peak_need(Spec(**{**kept.__dict__, "scale": kept.scale - 1}))[0]


@pytest.mark.parametrize("chosen", [False, True])
def test_choose_scale_runs_the_shape_kept_trace_at_its_own_scale_times_the_load_factors(monkeypatch, chosen):
    """bench/sizing.py --choose-scale --rate-scale-shift S: the scale is chosen on the trace as it
    runs (shifted by S), and the rows run at it times each --load-factors, named -shiftS; without
    it, at the recorded scale chosen for the flattened trace. A ServeGen day keeps its recorded
    scale either way. (The runs are not made here.)"""
    from dataclasses import replace

    asked = []

    def choose(spec, target, integer):
        asked.append((spec.name, spec.shift, target, integer))
        return replace(spec, scale=7.0)

    variant = "fleetplan (ensemble) tokens"
    tasks = sizing_tasks(monkeypatch, "--only", "conv,m-mid", "--no-oracle", "--variants", variant,
                          "--load-factors", "1,2", "--rate-scale-shift", "30",
                          *(["--choose-scale"] if chosen else []), choose=choose)
    assert asked == ([("azure-conv-30min", 30.0, 10, True)] if chosen else [])
    scales = {"azure-conv-30min": 34.0, "servegen-m-mid-24h": 0.0667}
    base = 7.0 if chosen else scales["azure-conv-30min"]
    assert [(s.name, s.scale, s.shift, n) for s, _, n in tasks] == [
        *(("azure-conv-30min-shift30", base * f, 30.0, variant) for f in (1.0, 2.0)),
        *(("servegen-m-mid-24h", scales["servegen-m-mid-24h"] * f, None, variant) for f in (1.0, 2.0))]


def test_seeds_run_each_workload_at_each_draw_named_by_it(monkeypatch):
    """bench/sizing.py --seeds: every workload and load level at every draw; seed 0 keeps the
    name the committed rows have, another is named -seedN, after the other suffixes."""
    tasks = sizing_tasks(monkeypatch, "--only", "conv", "--no-oracle", "--variants", "fleetplan (ensemble)",
                          "--load-factors", "1,1.05", "--rate-scale-shift", "30", "--seeds", "0,3")
    assert [(s.name, s.scale, s.seed) for s, _, _ in tasks] == [
        ("azure-conv-30min-shift30", 34.0, 0), ("azure-conv-30min-shift30-seed3", 34.0, 3),
        ("azure-conv-30min-shift30", 34.0 * 1.05, 0), ("azure-conv-30min-shift30-seed3", 34.0 * 1.05, 3)]


def test_profile_runs_the_traces_on_another_engine_at_a_scale_chosen_for_it(monkeypatch):
    """bench/sizing.py --profile P: each trace runs on P, named -P, at the scale quality.py's rule
    chooses on P (the recorded scales are the H200 8B's), times the load factors; a ServeGen day
    keeps its own profile and recorded scale."""
    from dataclasses import replace

    asked = []

    def choose(spec, target, integer):
        asked.append((spec.name, spec.profile, target, integer))
        return replace(spec, scale=7.0)

    tasks = sizing_tasks(monkeypatch, "--only", "code,m-mid", "--no-oracle", "--variants", "fleetplan (ensemble)",
                          "--load-factors", "1,1.1", "--profile", "h100-llama3.3-70b", choose=choose)
    code = "azure-code-30min-h100-llama3.3-70b"
    assert asked == [(code, "h100-llama3.3-70b", 10, True)]
    assert [(s.name, s.profile, s.scale) for s, _, _ in tasks] == [
        (code, "h100-llama3.3-70b", 7.0), (code, "h100-llama3.3-70b", 7.0 * 1.1),
        ("servegen-m-mid-24h", "h100-llama3.3-70b", 0.0667), ("servegen-m-mid-24h", "h100-llama3.3-70b", 0.0667 * 1.1)]


def test_tp_runs_the_traces_on_one_parallel_config_of_the_profile(monkeypatch):
    """bench/sizing.py --profile P --tp N: the traces run on P's TP-N engine, named -P-tpN, at the scale
    chosen on it; a ServeGen day keeps its own engine (its profile's default config)."""
    from dataclasses import replace

    asked = []

    def choose(spec, target, integer):
        asked.append((spec.name, spec.profile, spec.tp))
        return replace(spec, scale=5.0)

    tasks = sizing_tasks(monkeypatch, "--only", "conv,m-mid", "--no-oracle", "--variants", "fleetplan (ensemble)",
                          "--profile", "h100-llama3.3-70b", "--tp", "4", choose=choose)
    conv = "azure-conv-30min-h100-llama3.3-70b-tp4"
    assert asked == [(conv, "h100-llama3.3-70b", 4)]
    assert [(s.name, s.profile, s.tp, s.scale) for s, _, _ in tasks] == [
        (conv, "h100-llama3.3-70b", 4, 5.0), ("servegen-m-mid-24h", "h100-llama3.3-70b", None, 0.0667)]


def test_engine_timing_runs_every_workload_on_that_engine_named_extend(monkeypatch):
    """bench/sizing.py --engine-timing interp-extend: every workload runs on the engine whose decode
    levels carry on past their measured usage, named -extend after the engine's suffix, at the scale
    the workload runs at on interp: chosen on that engine for a held-out one, a ServeGen day's recorded."""
    from dataclasses import replace

    asked = []

    def choose(spec, target, integer):
        asked.append((spec.name, spec.timing))
        return replace(spec, scale=5.0)

    tasks = sizing_tasks(monkeypatch, "--only", "conv,m-mid", "--no-oracle", "--variants", "fleetplan (ensemble)",
                          "--profile", "h100-llama3.3-70b", "--tp", "4", "--engine-timing", "interp-extend",
                          choose=choose)
    conv = "azure-conv-30min-h100-llama3.3-70b-tp4"
    assert asked == [(conv, "interp-extend")]
    assert [(s.name, s.timing, s.scale) for s, _, _ in tasks] == [
        (f"{conv}-extend", "interp-extend", 5.0), ("servegen-m-mid-24h-extend", "interp-extend", 0.0667)]
    _, setup = sys.modules["quality"].make_setup(tasks[0][0], (500.0, 50.0))
    assert setup.timing.mode == "interp-extend"


@pytest.mark.parametrize(("argv", "message"), [
    (["--tp", "4"], "--tp: picks one of --profile's parallel configs; give --profile too"),
    (["--profile", "h100-llama3.3-70b", "--tp", "3"], "--tp 3: .*no config with tp=3 \\(have \\[8, 4, 2\\]\\)"),
    (["--profile", "h200-llama3.1-8b", "--tp", "4"], "--tp 4: .*file is tp=1, asked for tp=4"),
])
def test_sizing_refuses_a_tp_the_profile_does_not_hold(argv, message):
    line = _refused(_bench("sizing.py", "--data", "/nonexistent", *argv))
    assert re.search(message, line), line


@pytest.mark.parametrize(("argv", "message"), [
    (["--profile", "h100-llama3.3-70b"], "--profile: give --scale too, the rate scale the row ran at on that engine"),
    (["--tp", "4", "--scale", "12"], "--tp: picks one of --profile's parallel configs; give --profile too"),
    (["--profile", "h100-llama3.3-70b", "--tp", "3", "--scale", "12"], "--tp 3: .*no config with tp=3"),
    (["--scale", "0"], "--scale: a positive number, got 0.0"),
])
def test_per_minute_refuses_an_engine_it_cannot_run_a_held_out_row_on(argv, message):
    """bench/per_minute.py --profile P [--tp N] --scale S: a row of bench/results/other-engine, per tick;
    the recorded scales are the 8B's, so --profile wants the row's own scale."""
    line = _refused(_bench("per_minute.py", "--data", "/nonexistent", "--workload", "azure-conv-30min", *argv))
    assert re.search(message, line), line


def test_decode_fit_refuses_a_tp_without_a_profile():
    line = _refused(_bench("decode_fit.py", "--data", "/nonexistent", "--scale", "12", "--tp", "4"))
    assert "--tp: picks one of --profile's parallel configs; give --profile too" in line


def test_sizing_refuses_a_profile_it_does_not_bundle():
    line = _refused(_bench("sizing.py", "--data", "/nonexistent", "--profile", "a100-opt-13b"))
    assert "--profile: invalid choice: 'a100-opt-13b'" in line


@pytest.mark.parametrize("seeds", ["-1", "one", "1,1", ","])
def test_sizing_refuses_seeds_that_are_not_draws(seeds):
    line = _refused(_bench("sizing.py", "--data", "/nonexistent", "--seeds", seeds))
    assert line.endswith(f"error: --seeds: distinct whole numbers >= 0, comma-separated, got {seeds!r}")


def test_a_spec_drawn_at_a_seed_is_the_workload_simulate_draws_at_it():
    """A Spec's seed is fleetplan simulate --seed: the rate-scale copies' shifts (the same
    requests, moved) and the simulator's own draws."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from quality import Spec, build_workload, make_setup
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from fleetplan.sim.traces import read_trace
    from fleetplan.sim.workload import rate_scale, trace_duration

    code = str(ROOT / "examples" / "traces" / "azure_code_10min.csv")
    trace = read_trace(code)
    for seed in (0, 1):
        spec = Spec("code", "trace", code, "h200-llama3.1-8b", scale=3, seed=seed)
        drawn = rate_scale(trace, 3, seed=seed, duration_s=trace_duration(trace))
        assert [r.arrival_s for r in build_workload(spec).requests()] == sorted(r.arrival_s for r in drawn)
        assert make_setup(spec, (500, 50))[1].options.seed == seed
    one, other = (sorted(r.arrival_s for r in build_workload(Spec("c", "trace", code, "h200-llama3.1-8b",
                                                                     scale=3, seed=n)).requests()) for n in (0, 1))
    assert len(one) == len(other) and one != other


@pytest.mark.parametrize("script", ["sizing.py", "per_minute.py", "held_scale_down.py", "decode_fit.py", "fixed_fleet.py"])
@pytest.mark.parametrize("sla", ["500/50", "500", "500,0", "500,50,5", "500,inf"])
def test_every_script_that_takes_an_sla_refuses_one_that_is_not_two_positive_numbers(script, sla):
    """bench/quality.py sla_pair: sizing.py, per_minute.py and held_scale_down.py split --sla unchecked
    ('500/50' a traceback, '500' one after the traces were read); decode_fit.py took only 500,50 and 200,20."""
    needed = {"per_minute.py": ["--workload", "azure-conv-30min"], "decode_fit.py": ["--scale", "34"],
              "held_scale_down.py": ["--scales", "34"],
              "fixed_fleet.py": ["--workload", "azure-conv-30min", "--scales", "34", "--fleet", "decode=4",
                                 "--vary", "prefill=6"]}.get(script, [])
    line = _refused(_bench(script, "--data", "/nonexistent", *needed, "--sla", sla))
    assert line.endswith(f"--sla: TTFT,ITL in ms, two numbers > 0, got {sla!r}")
