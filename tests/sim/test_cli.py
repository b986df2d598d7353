"""`fleetplan simulate` end to end, and its one-line errors."""

from __future__ import annotations

import math
import re

import orjson
import pytest
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app
from fleetplan.sim import REVISION
from tests.sim.sim_helpers import CODE, DATA, ROOT

QUICKSTART = ROOT / "examples" / "configs" / "quickstart.yaml"
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def registered():
    _register_optional()


def simulate(*args):
    return runner.invoke(app, ["simulate", *map(str, args)])


def test_simulate_writes_log_summary_and_report(tmp_path):
    out = tmp_path / "run"
    result = simulate(
        "--trace", CODE, "--profile", "h200-llama3.1-8b", "--config", QUICKSTART,
        "--duration", 180, "--rate-scale", 4, "--out", out, "--json", "--oracle-rounds", 2,
    )
    assert result.exit_code == 0, result.output
    summary = orjson.loads(result.stdout)
    assert set(summary["results"]) == {"planner", "oracle", "static-peak", "static-mean"}
    planner = summary["results"]["planner"]
    assert planner["requests"] == summary["requests"] > 0
    assert 0.0 <= planner["sla_attainment"] <= 1.0 and planner["gpu_hours"] > 0
    assert summary["late_events"] == 0
    assert summary["sim_revision"] == REVISION  # which simulator measured it (sim/__init__.py)
    # the forecasts are scored against what then arrived (sim/forecast_check.py)
    forecast = summary["forecast"]
    assert forecast["point"]["scored"] >= 1 and forecast["point"]["mape_pct"] >= 0.0
    assert "sized" not in forecast  # 3 minutes hold no startup horizon after a tick: nothing to score yet
    for name in ("events.jsonl", "summary.json", "report.html"):
        assert (out / name).stat().st_size > 0
    html = (out / "report.html").read_bytes()
    assert b"plotly" in html[:4_000_000]
    # the load panel draws the rate the throughput loop sized for, beside its point forecast
    assert b"predicted rps (planner)" in html and b"sized-for rps (planner)" in html
    # the SLA labels sit on log axes, where an annotation's y is the log of its position
    labels = {m.group(1): float(m.group(2)) for m in re.finditer(
        rb'"text":"(TTFT SLA|ITL SLA)"[^{}]*?"y":([0-9.e+-]+)', html)}
    assert labels == {b"TTFT SLA": pytest.approx(math.log10(500)), b"ITL SLA": pytest.approx(math.log10(50))}
    assert orjson.loads((out / "summary.json").read_bytes())["results"].keys() == summary["results"].keys()


def test_a_planner_held_by_the_gpu_budget_is_flagged():
    # Dynamo's default budget (8 GPUs) binds on Azure code at 50x: the baselines are not held to it
    held = simulate("--trace", CODE, "--duration", 400, "--rate-scale", 50, "--no-baselines", "--json")
    assert held.exit_code == 0, held.output
    assert orjson.loads(held.stdout)["gpu_budget_held_ticks"] > 0
    table = simulate("--trace", CODE, "--duration", 400, "--rate-scale", 50, "--no-baselines")
    assert "the GPU budget held the planner at max_gpu_budget = 8 GPUs" in " ".join(table.stdout.split())
    assert "forecast: point forecast off by" in " ".join(table.stdout.split())
    free = simulate("--trace", CODE, "--duration", 400, "--rate-scale", 4, "--config", QUICKSTART,
                    "--no-baselines", "--json")
    assert orjson.loads(free.stdout)["gpu_budget_held_ticks"] == 0


def test_table_output_and_baseline_policy(tmp_path):
    result = simulate("--trace", CODE, "--duration", 120, "--policy", "static-mean", "--no-baselines")
    assert result.exit_code == 0, result.output
    (row,) = [line for line in result.stdout.splitlines() if line.startswith("│ static-mean")]
    cells = [c.strip() for c in row.strip("│").split("│")]
    # SLA met, TTFT p90, ITL p90, goodput, tok/s/GPU, GPU-h, x oracle, peak, decisions
    assert re.fullmatch(r"\d+\.\d\d%", cells[1]) and float(cells[6]) > 0
    assert cells[8] == "P1 D1" and cells[9] == "0"  # a static baseline makes no decision


def test_names_in_the_table_are_printed_as_given(tmp_path):
    # file names are not rich markup or emoji codes: '[/b]' in --out raised MarkupError after
    # the run, and a trace named code[red]:fire: was titled "code🔥"
    trace = tmp_path / "code[red]:fire:.csv"
    trace.write_bytes(CODE.read_bytes())
    out = tmp_path / "o[/b]"
    result = simulate("--trace", trace, "--duration", 60, "--no-baselines", "--out", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "code[red]:fire:: " in text
    assert f"wrote {out / 'events.jsonl'}" in text


@pytest.mark.parametrize(
    "args,message",
    [
        (["--trace", "BAD"], "BAD.csv:3: ContextTokens: a non-negative integer"),
        (["--trace", CODE, "--profile", "no-such-profile"], "--profile: profile no-such-profile: no such file or directory (bundled profiles"),
        (["--trace", CODE, "--config", "NOPROF"], "profile_results_dir: profile nope: no such file"),
        (["--trace", CODE, "--config", "CFG"], "ttft_ms"),
        (["--trace", CODE, "--policy", "nope"], "expected MODULE:CLASS"),
        (["--trace", CODE, "--router", "random"], "--router: expected one of"),
        (["--trace", CODE, "--startup", "gamma:1:2"], "--startup"),
        # NaN passed `< 0` (engines started at NaN, or --initial was blamed); inf raised a traceback
        (["--trace", CODE, "--startup", "uniform:nan:5"], "--startup: startup: parameters must be finite"),
        (["--trace", CODE, "--startup", "lognormal:nan:1"], "--startup: startup: parameters must be finite"),
        (["--trace", CODE, "--startup", "inf"], "--startup: startup time must be a finite number"),
        (["--trace", CODE, "--startup", "uniform:0:inf"], "--startup: startup: parameters must be finite"),
        (["--trace", CODE, "--initial", "prefill=x"], "--initial"),
        # a role given twice ran on the last count without a word
        (["--trace", CODE, "--initial", "prefill=2,decode=1,prefill=3"], "--initial: prefill: given twice"),
        (["--trace", CODE, "--initial", "agg=3"], "--initial: agg: not a role of mode disagg (its roles: prefill, decode)"),
        (["--trace", CODE, "--initial", "prefill=2,decode=1000"], "--initial: 1002 GPUs, more than max_gpu_budget (8)"),
        (["--trace", CODE, "--config", "NOBUDGET", "--initial", "decode=100000"], "--initial: decode=100000: more engines than 10,000"),
        # the 70B profile's engines take 2 GPUs each (TP2): 5 engines are 10 GPUs, not 5
        (["--trace", CODE, "--profile", "h100-llama3.3-70b", "--initial", "prefill=3,decode=2"],
         "--initial: 10 GPUs, more than max_gpu_budget (8)"),
        # 8-GPU engines timed on the 8B profile's 1-GPU engine: billed 8 GPUs for one GPU's speed
        (["--trace", CODE, "--config", "TP8"], "TP8.yaml: decode_engine_num_gpu: 8 GPUs an engine, but the profile "
         "h200-llama3.1-8b measured engines of 1"),
        (["--trace", CODE, "--profile", "h100-llama3.3-70b", "--config", "TP3"],
         "no config whose engine has 3 GPUs, as the config's *_engine_num_gpu say (have [8, 4, 2])"),
        (["--trace", CODE, "--spread-arrivals", "soon"], "--spread-arrivals: expected auto, off or a step"),
        ([], "give exactly one of --trace FILE or --servegen FILE"),
        (["--trace", CODE, "--goal", 2], "--goal: a fraction in (0, 1], got 2"),
        (["--trace", CODE, "--oracle-rounds", -1], "--oracle-rounds: must be >= 0, got -1"),
        (["--trace", CODE, "--window", "1e-9"], "--window: at least 1 s, got 1e-09"),
        (["--trace", CODE, "--fpm-interval", "1e-9"], "--fpm-interval: at least 0.01 s, got 1e-09"),
        (["--trace", CODE, "--duration", -10], "--duration: must be > 0, got -10.0"),
        (["--trace", CODE, "--start", -5], "--start: must be a finite number of seconds >= 0, got -5.0"),
        (["--trace", CODE, "--speed", "inf"], "--speed: must be a finite number, got inf"),
        # 1e6 for 1.6: the copies of the trace used to be made until memory ran out
        (["--trace", CODE, "--rate-scale", "1e6"], "--rate-scale: 1e+06 × 1,482 requests is 1.48e+09, more than"),
        (["--trace", CODE, "--speed", "1e-300"], "--speed: 1e-300 stretches"),
        (["--trace", CODE, "--rate-scale", 4, "--rate-scale-shift", -1],
         "--rate-scale-shift: a finite number of seconds >= 0, got -1.0"),
        # no copy to shift: the run was the trace itself (or thinned), and summary.json said shifted
        (["--trace", CODE, "--rate-scale-shift", 30], "--rate-scale-shift: shifts the copies a --rate-scale above 1"),
        (["--trace", CODE, "--rate-scale", 0.5, "--rate-scale-shift", 30], "got --rate-scale 0.5"),
        (["--trace", CODE, "--start", 99999, "--duration", 60], "--start/--duration: "),
        # thinned to nothing: the run replayed no request and reported it as a result
        (["--trace", CODE, "--duration", 60, "--rate-scale", "1e-9"],
         "--rate-scale: 1e-09 kept none of the slice's "),
        # Python's random takes a seed's absolute value (-1 replayed --seed 1) and numpy's
        # generator refuses it (a ServeGen run ended in a traceback)
        (["--trace", CODE, "--seed", -1], "--seed: must be >= 0, got -1"),
        (["--servegen", "SERVEGEN", "--servegen-model", "m-mid", "--seed", -1], "--seed: must be >= 0, got -1"),
        (["--trace", CODE, "--warm-up", 0], "--warm-up: must be > 0, got 0.0"),
        (["--trace", CODE, "--start", 60, "--warm-up", 120], "--warm-up: 120 s of traffic before --start, which is 60 s"),
        (["--trace", CODE, "--start", 240, "--warm-up", 100], "--warm-up: no full throughput window (180 s) of traffic"),
        (["--trace", CODE, "--start", 180, "--warm-up", 30], f"--warm-up: {CODE}: no requests in [150, 180) s"),
        (["--trace", CODE, "--policy", "static-peak", "--start", 120, "--warm-up", 60],
         "--warm-up: warms the planner's forecaster, not --policy static-peak"),
        (["--trace", CODE, "--config", "WARM", "--start", 120, "--warm-up", 120],
         "--warm-up: cannot seed the forecaster: the forecaster has been fed"),
        (["--trace", CODE, "--config", QUICKSTART, "--start", 300, "--warm-up", 240, "--publish", "tcp://127.0.0.1:1"],
         "--warm-up: not with --publish"),
        (["--trace", "DIR"], "--trace: cannot read DIR_PATH (Is a directory)"),
        (["--trace", CODE, "--out", "FILE"], "--out: cannot write"),
        (["--trace", CODE, "--out", "FILE/sub"], "--out: cannot write"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path, args, message):
    bad_trace = tmp_path / "BAD.csv"
    bad_trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0,-3,10\n")
    bad_config = tmp_path / "CFG.yaml"
    bad_config.write_text("ttft_ms: -5\n")
    a_file = tmp_path / "FILE"
    a_file.write_text("not a directory")
    warm_config = tmp_path / "WARM.yaml"
    warm_config.write_text(f"throughput_adjustment_interval_seconds: 60\nload_predictor_warmup_trace: {CODE}\n")
    no_profile = tmp_path / "NOPROF.yaml"
    no_profile.write_text("profile_results_dir: nope\n")
    no_budget = tmp_path / "NOBUDGET.yaml"
    no_budget.write_text("max_gpu_budget: -1\n")
    tp8 = tmp_path / "TP8.yaml"
    tp8.write_text("decode_engine_num_gpu: 8\nmax_gpu_budget: -1\n")
    tp3 = tmp_path / "TP3.yaml"
    tp3.write_text("decode_engine_num_gpu: 3\nmax_gpu_budget: -1\n")
    named = {"SERVEGEN": DATA / "servegen_m-mid_30min_sample.csv", "TP8": tp8, "TP3": tp3, "NOBUDGET": no_budget, "BAD": bad_trace, "CFG": bad_config, "WARM": warm_config, "FILE": a_file, "FILE/sub": a_file / "sub",
             "NOPROF": no_profile}
    named["DIR"] = tmp_path
    message = message.replace("DIR_PATH", str(tmp_path))
    args = [named.get(a, a) if isinstance(a, str) else a for a in args]
    result = simulate(*args, "--no-baselines")
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("fleetplan: error:")
    assert message in lines[0]


def test_a_baseline_as_the_main_policy_writes_its_log(tmp_path):
    out = tmp_path / "oracle"
    result = simulate("--trace", CODE, "--policy", "oracle", "--rate-scale", 4, "--duration", 240,
                      "--out", out, "--json", "--no-baselines")
    assert result.exit_code == 0, result.output
    lines = (out / "events.jsonl").read_bytes().splitlines()
    assert any(b'"type":"request"' in line for line in lines)
    decisions = [line for line in lines if b'"type":"decision"' in line]
    acks = [line for line in lines if b'"type":"ack"' in line]
    assert len(decisions) == orjson.loads(result.stdout)["results"]["oracle"]["decisions"] == len(acks)


def _stepped_trace(path):
    """A Mooncake-format trace whose arrival times come in 3 s steps, 8 requests each."""
    rows = [{"timestamp": k * 3000, "input_length": 600 + 37 * j, "output_length": 40, "hash_ids": [k * 8 + j]}
            for k in range(60) for j in range(8)]
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    return path


@pytest.mark.parametrize("spread,expected", [("auto", 3.0), ("off", None), ("1.5", 1.5)])
def test_rounded_arrival_times_are_spread_over_their_step(tmp_path, spread, expected):
    trace = _stepped_trace(tmp_path / "stepped.jsonl")
    result = simulate("--trace", trace, "--spread-arrivals", spread, "--json", "--no-baselines",
                      "--policy", "static-mean")
    assert result.exit_code == 0, result.output
    summary = orjson.loads(result.stdout)
    assert summary["spread_arrivals_s"] == expected and summary["requests"] == 480
    # auto says what it did, and how to keep the recorded times
    assert ("3 s steps" in result.stderr and "--spread-arrivals off" in result.stderr) == (spread == "auto")


def test_a_load_only_run_reports_its_measured_floor(tmp_path):
    config = tmp_path / "load_only.yaml"
    config.write_text("enable_load_scaling: true\nenable_throughput_scaling: false\nload_predictor: constant\n")
    out = tmp_path / "run"
    result = simulate("--trace", CODE, "--profile", "h200-llama3.1-8b", "--config", config, "--duration", 180,
                      "--rate-scale", 4, "--out", out, "--no-baselines")
    assert result.exit_code == 0, result.output
    # a minute into the traffic the load loop sizes what it measured: the report draws it per role
    assert b"measured floor (prefill)" in (out / "report.html").read_bytes()


def test_a_warm_up_is_logged_as_a_seed_and_the_log_folds_to_the_same_decisions(tmp_path):
    out = tmp_path / "warm"
    result = simulate(
        "--trace", CODE, "--config", QUICKSTART, "--start", 300, "--warm-up", 240, "--duration", 240,
        "--rate-scale", 4, "--out", out, "--json", "--no-baselines",
    )
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["warm_up_windows"] == 4  # 240 s of 60 s windows
    log = out / "events.jsonl"
    first = orjson.loads(log.read_bytes().splitlines()[0])
    assert first["type"] == "control" and first["body"]["command"] == "seed_traffic"
    assert [w["start_s"] for w in first["body"]["windows"]] == [-240.0, -180.0, -120.0, -60.0]
    assert all(w["num_req"] > 0 and w["peak"] >= w["num_req"] for w in first["body"]["windows"])

    folded = runner.invoke(app, ["plan", "--events", str(log), "--config", str(QUICKSTART),
                                 "--profile", "h200-llama3.1-8b", "--reports", str(tmp_path / "ticks.jsonl")])
    assert folded.exit_code == 0, folded.output
    logged = [orjson.loads(line) for line in log.read_bytes().splitlines() if b'"type":"decision"' in line]
    assert [orjson.loads(line) for line in folded.stdout.splitlines() if line.strip()] == logged
    ticks = [orjson.loads(line) for line in (tmp_path / "ticks.jsonl").read_bytes().splitlines()]
    assert ticks[-1]["rejected_controls"] == 0

    cold = simulate("--trace", CODE, "--config", QUICKSTART, "--start", 300, "--duration", 240,
                    "--rate-scale", 4, "--json", "--no-baselines")
    assert cold.exit_code == 0, cold.output
    assert orjson.loads(cold.stdout)["warm_up_windows"] is None

    table = simulate("--trace", CODE, "--config", QUICKSTART, "--start", 300, "--warm-up", 240, "--duration", 240,
                     "--rate-scale", 4, "--no-baselines")
    assert table.exit_code == 0, table.output
    assert "warm-up: the forecaster was seeded with 4 windows (0.1 h) of the traffic before --start" in table.stdout


def test_no_inventory_runs_the_live_stacks_view(tmp_path):
    out = tmp_path / "live-view"
    result = simulate("--trace", CODE, "--config", QUICKSTART, "--duration", 240, "--rate-scale", 4,
                      "--no-inventory", "--out", out, "--json", "--no-baselines")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["inventory"] is False
    kinds = {orjson.loads(line)["type"] for line in (out / "events.jsonl").read_bytes().splitlines()}
    assert "inventory" not in kinds and {"fpm", "request", "decision"} <= kinds
    default = simulate("--trace", CODE, "--config", QUICKSTART, "--duration", 60, "--json", "--no-baselines")
    assert orjson.loads(default.stdout)["inventory"] is True


def test_the_configs_profile_is_used_without_the_flag(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(QUICKSTART.read_text() + "\nprofile_results_dir: h100-llama3.3-70b\n")
    result = simulate("--trace", CODE, "--config", config, "--duration", 180, "--rate-scale", 2,
                      "--no-baselines", "--json", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["profile"] == "h100-llama3.3-70b"



def test_the_reports_last_window_is_its_arrivals_over_the_time_it_covers(tmp_path):
    out = tmp_path / "run"
    result = simulate("--trace", CODE, "--config", QUICKSTART, "--duration", 150, "--rate-scale", 2,
                      "--no-baselines", "--json", "--out", out)
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    bars = re.search(r'"name":"arrivals\\u002fs"[^{}]*?"y":\[([^\]]*)\]', html)
    rates = [float(x) for x in bars.group(1).split(",")]
    arrivals = [orjson.loads(line) for line in (out / "events.jsonl").read_bytes().splitlines()
                if b'"type":"arrival"' in line]
    start = min(a["time"] for a in arrivals)
    last = sum(1 for a in arrivals if a["time"] - start >= 120)
    assert len(rates) == 3 and rates[2] == pytest.approx(last / 30)  # [120, 150) s, not / 60


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "80-column terminal"])
def test_the_tables_numbers_are_printed_whole(tmp_path, monkeypatch, terminal):
    # squeezed to its console's width, rich cut every column to fit: `make run` on an 80-column
    # terminal printed SLA met "10…" and GPU-h "…", and the compose demo fleet's policy name
    # (fleetplan.sim.follow:FollowDecisions) cut GPU-h to "0.…" in its log
    (tmp_path / "a_long_package_name_for_scalers.py").write_text(
        "class KeepTheFleet:\n    def decide(self, view):\n        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("COLUMNS", "80")
    result = simulate("--trace", CODE, "--duration", 120, "--no-baselines",
                      "--policy", "a_long_package_name_for_scalers:KeepTheFleet")
    assert result.exit_code == 0, result.output
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout)  # colours, as a terminal gets them
    (row,) = [line for line in text.splitlines() if line.startswith("│ a_long_package_name_for_scalers")]
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert "…" not in row, row
    assert cells[0] == "a_long_package_name_for_scalers:KeepTheFleet"
    assert re.fullmatch(r"\d+\.\d\d%", cells[1]) and float(cells[6]) > 0 and cells[8] == "P1 D1"


def _dynamo_trace(path):
    """Two 1,024-token prompts hashed in Dynamo's 16-token blocks that share their first two."""
    def row(rid, ms, hashes):
        request = {"request_id": rid, "input_tokens": 1024, "output_tokens": 10, "request_received_ms": ms,
                   "replay": {"trace_block_size": 16, "input_length": 1024, "input_sequence_hashes": hashes}}
        return orjson.dumps({"event": {"schema": "dynamo.request.trace.v1", "event_type": "request_end",
                                       "request": request}})
    path.write_bytes(row("a", 0, list(range(64))) + b"\n" + row("b", 1000, [0, 1, *range(1000, 1062)]) + b"\n")
    return path


def test_a_dynamo_traces_hashes_are_blocks_of_its_own_size(tmp_path):
    # read as 512-token blocks (the default for Mooncake), the 32 shared tokens were a hit on 1,023
    trace = _dynamo_trace(tmp_path / "dynamo.jsonl")
    out = tmp_path / "run"
    result = simulate("--trace", trace, "--no-baselines", "--initial", "prefill=1,decode=1", "--out", out)
    assert result.exit_code == 0, result.output
    records = [orjson.loads(line) for line in (out / "events.jsonl").read_bytes().splitlines()
               if b'"type":"request"' in line]
    assert {r["request_id"]: r["cached_tokens"] for r in records} == {"r0": 0, "r1": 32}
    result = simulate("--trace", trace, "--no-baselines", "--prefix-block-tokens", 512)
    assert result.exit_code == 2
    assert "--prefix-block-tokens: 512, but" in result.output and "blocks of 16 tokens" in result.output


def test_rate_scale_shift_keeps_the_traces_minutes_and_is_in_the_summary(tmp_path):
    """--rate-scale 20 with copies shifted anywhere flattens the code trace's minutes; with
    --rate-scale-shift 30 their shape stays, and the summary says which was run."""
    import numpy as np

    def minutes(name, args):
        out = tmp_path / name
        result = simulate("--trace", CODE, "--duration", 300, "--rate-scale", 20, "--policy", "static-peak",
                          "--no-baselines", "--json", "--out", out, *args)
        assert result.exit_code == 0, result.output
        arrivals = [e["request_received_ms"] / 1000.0 for e in map(orjson.loads, (out / "events.jsonl").open("rb"))
                    if e["type"] == "request"]
        return orjson.loads(result.stdout), np.bincount(np.array(arrivals, dtype=int) // 60)[:5].astype(float)

    flat_summary, flat = minutes("flat", [])
    kept_summary, kept = minutes("kept", ["--rate-scale-shift", 30])
    assert flat_summary["rate_scale_shift_s"] is None and kept_summary["rate_scale_shift_s"] == 30.0
    assert kept.sum() == flat.sum()
    assert kept.std() / kept.mean() > 2 * flat.std() / flat.mean()


@pytest.mark.parametrize(("extra", "label"), [
    ("burst_window_seconds: 20\n", "sized-for rps (planner; requests or prefill's prompt tokens, the more)"),
    ("burst_window_seconds: 20\nquantile_basis: requests\n", "sized-for rps (planner)"),
    # the quickstart's: a burst sub-window as long as its 60-s ticks, so no queueing floor takes the
    # burst apart from the rate count, and floor_tokens sizes as requests does
    ("", "sized-for rps (planner)"),
])
def test_the_reports_sized_line_says_what_the_run_sized_for(tmp_path, extra, label):
    """The default, floor_tokens, sizes prefill's queueing floor for the larger of the count and
    its prompt tokens, and the report's sized-for line says so where the planner applied it."""
    config = tmp_path / "c.yaml"
    config.write_text(QUICKSTART.read_text() + "\n" + extra)
    out = tmp_path / "run"
    result = simulate("--trace", CODE, "--config", config, "--duration", 180, "--rate-scale", 2,
                      "--no-baselines", "--json", "--out", out)
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text().replace("\\u0027", "'")
    assert label in html
    others = {"sized-for rps (planner; requests or prefill's prompt tokens, the more)",
              "sized-for rps (planner; tokens, the most any role's)"} - {label}
    assert not any(other in html for other in others)


def test_a_token_basis_runs_report_says_its_sized_line_is_of_tokens(tmp_path):
    """The run's quantile_basis reaches the report: its sized-for line is of the roles' tokens."""
    config = tmp_path / "c.yaml"
    config.write_text(QUICKSTART.read_text() + "\nquantile_basis: tokens\n")
    out = tmp_path / "run"
    result = simulate("--trace", CODE, "--config", config, "--duration", 180, "--rate-scale", 2,
                      "--no-baselines", "--json", "--out", out)
    assert result.exit_code == 0, result.output
    html = (out / "report.html").read_text()
    assert "sized-for rps (planner; tokens, the most any role's)" in html.replace("\\u0027", "'")


def test_interp_extend_runs_and_agrees_where_no_pass_goes_past_the_measured_rows(tmp_path):
    """--engine-timing interp-extend differs from interp only past a decode level's last measured usage
    (docs/calibration.md); a light code trace on the 8B decodes well inside them, so the two runs agree."""
    runs = {}
    for timing in ("interp", "interp-extend"):
        result = simulate("--trace", CODE, "--profile", "h200-llama3.1-8b", "--config", QUICKSTART,
                          "--duration", 180, "--rate-scale", 4, "--out", tmp_path / timing, "--json",
                          "--no-baselines", "--engine-timing", timing)
        assert result.exit_code == 0, result.output
        summary = orjson.loads(result.stdout)
        assert summary["engine_timing"] == timing  # which engine measured it, beside sim_revision
        planner = summary["results"]["planner"]
        runs[timing] = {k: v for k, v in planner.items() if k not in ("wall_s", "sim_per_wall")}
    assert runs["interp"]["requests"] > 0
    assert runs["interp-extend"] == runs["interp"]
