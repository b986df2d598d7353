"""Config: Dynamo's names and defaults, fail-fast errors that name the field."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fleetplan.cli import _register_optional, app
from fleetplan.models.config import (
    PERF_MODEL_FIELDS,
    STARTUP_FIELDS,
    ConfigError,
    PlannerConfig,
    _check_predictor_params,
    check_gpu_budget,
    config_from_dict,
    load_config,
)
from fleetplan.models.config_changes import change_problem
from fleetplan.models.predictor_swap import build_forecaster
from fleetplan.models.predictors import PredictorParams
from tests.sim.sim_helpers import CODE


def test_defaults_match_dynamo():
    c = PlannerConfig()
    assert c.mode == "disagg"
    assert c.throughput_adjustment_interval_seconds == 180
    assert c.load_adjustment_interval_seconds == 5
    assert (c.enable_throughput_scaling, c.enable_load_scaling) == (True, False)
    assert (c.ttft_ms, c.itl_ms) == (500.0, 50.0)
    # fleetplan's one departure outside the sizing fields: Dynamo's default is its ARIMA
    assert c.load_predictor == "ensemble"
    assert c.max_throughput_scaling_replicas == 8
    assert (c.max_num_fpm_samples, c.fpm_sample_bucket_size) == (64, 16)
    assert c.load_scaling_down_sensitivity == 80
    assert (c.min_endpoint, c.max_gpu_budget, c.min_gpu_budget) == (1, 8, -1)
    assert c.ack_timeout_seconds == 1800
    assert c.tick_interval_seconds == 180  # throughput only by default


def test_tick_is_gcd_of_enabled_loops():
    c = config_from_dict({"enable_load_scaling": True, "throughput_adjustment_interval_seconds": 60,
                          "load_adjustment_interval_seconds": 15})
    assert c.tick_interval_seconds == 15
    c = config_from_dict({"enable_load_scaling": True, "load_adjustment_interval_seconds": 7})
    assert c.tick_interval_seconds == 1


def test_threshold_targets_force_load_loop_like_dynamo():
    c = config_from_dict({"optimization_target": "throughput", "context_length": 8192})
    assert c.load_enabled and not c.throughput_enabled


def test_per_role_minimums_and_legacy_aliases():
    c = config_from_dict({"prefill_min_endpoint": 2, "ttft": 200, "itl": 20})
    assert c.min_endpoints("prefill") == 2 and c.min_endpoints("decode") == 1
    assert (c.ttft_ms, c.itl_ms) == (200, 20)


def test_dynamo_runtime_fields_are_accepted_and_ignored():
    c = config_from_dict({"environment": "kubernetes", "backend": "vllm", "metric_reporting_prometheus_port": 9085})
    assert c == PlannerConfig()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"ttft_msec": 3}, "ttft_msec: unknown field"),
        ({"ttft_ms": -1}, "ttft_ms: Input should be greater than 0"),
        ({"mode": "split"}, "mode: Input should be 'disagg', 'prefill', 'decode' or 'agg'"),
        ({"fpm_sample_bucket_size": 15}, "perfect square"),
        ({"load_adjustment_interval_seconds": 200}, "must be less than throughput_adjustment_interval_seconds"),
        ({"load_predictor": "oracle"}, "load_predictor: Input should be"),
        ({"uncalibrated_headroom": "half"}, "uncalibrated_headroom: Input should be 'full' or 'coverage'"),
        ({"burst_sizing": "rate"}, "burst_sizing: Input should be 'both' or 'queueing'"),
        ({"decode_demand": "peak"}, "decode_demand: Input should be 'burst', 'window' or 'weighted'"),
        ({"optimization_target": "load"}, "prefill_scale_{up,down}_queue_tokens"),
        # threshold prefill reads queued tokens per context length: without it prefill never scales
        ({"optimization_target": "throughput"},
         "context_length: optimization_target 'throughput' scales prefill by its queue per context length"),
        ({"optimization_target": "latency", "mode": "prefill"}, "context_length: optimization_target 'latency'"),
        ({"optimization_target": "throughput", "context_length": 8192}, None),
        ({"optimization_target": "throughput", "mode": "agg"}, None),  # agg's KV side still votes
        ({"max_gpu_budget": 2, "min_gpu_budget": 4}, "min_gpu_budget must not exceed"),
        # the regressions keep at most max_num_fpm_samples samples: a model needing more was never
        # ready, and the planner held every tick (model_not_ready, insufficient_data) for good
        ({"load_min_observations": 65},
         "load_min_observations: 65 is more than the max_num_fpm_samples (64) a perf model keeps"),
        ({"load_min_observations": 20, "max_num_fpm_samples": 16}, "load_min_observations: 20 is more than"),
        ({"load_min_observations": 64}, None),
        # bounds that keep a tick's work finite (a set_config past them stalled the worker)
        ({"startup_seconds": 1e300}, "startup_seconds: Input should be less than or equal to 86400"),
        ({"throughput_adjustment_interval_seconds": 10**9},
         "throughput_adjustment_interval_seconds: Input should be less than or equal to 86400"),
        ({"target_utilization": 5e-324}, "target_utilization: Input should be greater than or equal to 0.01"),
        ({"max_gpu_budget": -1, "min_gpu_budget": 10**6}, "min_gpu_budget: Input should be less than or equal to 100000"),
        # no float field takes inf or nan, the SLA and the predictor parameters included
        ({"ttft_ms": float("inf")}, "ttft_ms: Input should be a finite number"),
        ({"kalman_r": float("inf")}, "kalman_r: Input should be a finite number"),
        ({"decode_scale_up_kv_rate": float("nan")}, "decode_scale_up_kv_rate: Input should be a finite number"),
        # replica bounds
        ({"min_endpoint": 5, "max_endpoint": 2}, "min_endpoint: 5 is more than max_endpoint (2)"),
        ({"prefill_min_endpoint": 5, "prefill_max_endpoint": 2},
         "prefill_min_endpoint: 5 is more than prefill_max_endpoint (2)"),
        ({"decode_min_endpoint": 3, "max_endpoint": 2}, "decode_min_endpoint: 3 is more than max_endpoint (2)"),
        ({"max_endpoint": 0}, "max_endpoint: 0 leaves no prefill engine to serve requests"),
        ({"mode": "agg", "decode_max_endpoint": 0, "min_endpoint": 0}, None),  # decode's ceiling is not agg's
        # a budget under one engine of each role keeps a role at 0 engines
        ({"max_gpu_budget": 1, "prefill_engine_num_gpu": 4},
         "max_gpu_budget: 1 GPU is less than one prefill engine (4 GPUs)"),
        ({"max_gpu_budget": 4, "prefill_engine_num_gpu": 4},
         "max_gpu_budget: 4 GPUs cannot hold one engine of each role (prefill 4 GPUs + decode 1 GPU)"),
        # YAML's true is not the number 1 (pydantic's lax mode would take it as 1)
        ({"ttft_ms": True}, "ttft_ms: expected a number, got true"),
        ({"max_num_seqs": True}, "max_num_seqs: expected a number, got true"),
        ({"startup_seconds": False}, "startup_seconds: expected a number, got false"),
        ({"advisory": True}, None),
        # a field and its Dynamo alias: said as such, not as an unknown field
        ({"ttft": 300, "ttft_ms": 800}, "ttft_ms: the same field as ttft, given both"),
        # the state's JSON (the changelog record, a snapshot) carries integers within 64 bits: a
        # config past them was taken, and the worker failed to save its state at every tick
        ({"predictor_history_windows": 2**64}, "predictor_history_windows: an integer within 64 bits"),
        ({"max_throughput_scaling_replicas": 2**70}, "max_throughput_scaling_replicas: an integer within 64 bits"),
        ({"predictor_history_windows": 2**63 - 1}, None),
    ],
)
def test_invalid_config_names_the_field(data, message):
    if message is None:
        config_from_dict(data, source="c.yaml")
        return
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, source="c.yaml")
    assert str(info.value).startswith("c.yaml: ")
    assert message in str(info.value)


def test_load_config_files(tmp_path):
    y = tmp_path / "p.yaml"
    y.write_text("mode: agg\nttft_ms: 300\n")
    assert load_config(y).mode == "agg"
    j = tmp_path / "p.json"
    j.write_text('{"planner": {"itl_ms": 20}}')
    assert load_config(j).itl_ms == 20
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML") as err:
        load_config(bad)
    # one line, with where it stopped and what it was in (PyYAML's own text spans five)
    assert str(err.value) == (f"{bad}: not valid YAML: line 2, column 1: expected ',' or ']', but got "
                              "'<stream end>' (while parsing a flow sequence at line 1, column 7)")
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(lst)


def test_a_refused_predictor_parameter_names_its_config_field():
    # pydantic's bounds are the stricter today; this check keeps make_predictor's from failing a run later
    unchecked = PlannerConfig.model_construct(kalman_r=float("inf"))
    with pytest.raises(ValueError, match="^kalman_r: must be a positive finite number$"):
        _check_predictor_params(unchecked)
    unchecked = PlannerConfig.model_construct(load_predictor_log1p="yes")
    with pytest.raises(ValueError, match="^load_predictor_log1p: must be a bool"):
        _check_predictor_params(unchecked)


def test_predictor_params_are_those_the_forecaster_is_built_with():
    cfg = config_from_dict({"load_predictor": "kalman", "kalman_r": 3.5, "load_predictor_log1p": True,
                            "prophet_window_size": 7, "throughput_adjustment_interval_seconds": 60})
    checked = PredictorParams.from_kwargs(**cfg.predictor_params())
    assert {p.params for p in build_forecaster(cfg).forecaster.predictors} == {checked}


def test_gpu_budget_is_checked_again_with_the_engine_sizes_learnt_later():
    cfg = config_from_dict({"max_gpu_budget": 2})  # fits one 1-GPU engine of each role
    check_gpu_budget(cfg, {"prefill": 1, "decode": 1})
    with pytest.raises(ValueError, match=r"max_gpu_budget: 2 GPUs cannot hold one engine of each role "
                                         r"\(prefill 2 GPUs \+ decode 2 GPUs\)"):
        check_gpu_budget(cfg, {"prefill": 2, "decode": 2})


@pytest.mark.parametrize(("text", "kind"), [("[]\n", "list"), ("false\n", "bool"), ("0\n", "int"), ('""\n', "str")])
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path, text, kind):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{path}: expected a mapping of config fields, got {kind}$"):
        load_config(path)


@pytest.mark.parametrize("text", ["", "# nothing set yet\n"])
def test_an_empty_file_means_all_defaults(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert load_config(path) == PlannerConfig()


def test_a_duplicate_key_names_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# SLA\nttft_ms: 500\nitl_ms: 50\nttft_ms: 300\n")
    with pytest.raises(ConfigError, match=f"^{path}: line 4: ttft_ms: duplicate key \\(first on line 2\\)$"):
        load_config(path)
    nested = tmp_path / "n.yaml"
    nested.write_text("planner:\n  mode: agg\n  mode: disagg\n")
    with pytest.raises(ConfigError, match="line 3: mode: duplicate key"):
        load_config(nested)
    as_json = tmp_path / "c.json"
    as_json.write_text('{"ttft_ms": 500, "ttft_ms": 300}')
    with pytest.raises(ConfigError, match=f"^{as_json}: ttft_ms: duplicate key$"):
        load_config(as_json)


def test_a_byte_order_mark_is_not_part_of_the_file(tmp_path):
    """Windows editors write one; YAML, traces and event logs took it, JSON refused the file."""
    for name, text in (("c.json", '{"ttft_ms": 300}'), ("c.yaml", "ttft_ms: 300\r\n")):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert load_config(path).ttft_ms == 300
    dup = tmp_path / "d.json"
    dup.write_bytes(b'\xef\xbb\xbf{"ttft_ms": 500, "ttft_ms": 300}')
    with pytest.raises(ConfigError, match=f"^{dup}: ttft_ms: duplicate key$"):
        load_config(dup)


def test_a_yaml_merge_key_may_still_be_overridden(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("planner:\n  <<: {ttft_ms: 500, itl_ms: 50}\n  ttft_ms: 300\n")
    assert (load_config(path).ttft_ms, load_config(path).itl_ms) == (300, 50)


def test_a_missing_warmup_trace_fails_at_load_naming_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"load_predictor_warmup_trace: {tmp_path / 'nope.csv'}\n")
    with pytest.raises(ConfigError, match=f"^{path}: load_predictor_warmup_trace: no such file {tmp_path}/nope.csv$"):
        load_config(path)
    path.write_text(f"load_predictor_warmup_trace: {CODE}\n")
    assert load_config(path).load_predictor_warmup_trace == str(CODE)


@pytest.fixture(scope="module")
def simulate_command():
    _register_optional()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]\n", "expected a mapping of config fields, got list"),
        ("ttft_ms: 500\nttft_ms: 300\n", "line 2: ttft_ms: duplicate key (first on line 1)"),
        ("load_predictor_warmup_trace: /nonexistent/trace.csv\n",
         "load_predictor_warmup_trace: no such file /nonexistent/trace.csv"),
    ],
)
def test_simulate_stops_at_start_on_a_bad_config_file(simulate_command, tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["simulate", "--trace", str(CODE), "--config", str(path), "--no-baselines"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"fleetplan: error: {path}: {message}"


def test_with_changes_validates():
    c = PlannerConfig()
    assert c.with_changes({"ttft_ms": 250}).ttft_ms == 250
    with pytest.raises(ConfigError, match="set_config: bogus: unknown field"):
        c.with_changes({"bogus": 1})


def test_a_change_may_name_a_field_by_its_dynamo_alias():
    """Intake takes ``ttft`` (the alias a config file may use); the tick refused it as the same
    field as the ``ttft_ms`` of the config in force, given both, so it never applied."""
    c = PlannerConfig()
    assert change_problem(c, {"ttft": 250}) is None
    assert c.with_changes({"ttft": 250}).ttft_ms == 250
    with pytest.raises(ConfigError, match="set_config: ttft: the same field as ttft_ms, given both"):
        c.with_changes({"ttft_ms": 250, "ttft": 300})
    # wrong on the change alone, so intake refuses it (it passed, and the tick counted it rejected)
    assert change_problem(c, {"ttft_ms": 250, "ttft": 300}) == "set_config: ttft: the same field as ttft_ms, given both"


@pytest.mark.parametrize("name", sorted(STARTUP_FIELDS))
def test_fields_built_at_start_cannot_change_at_run_time(name):
    c = PlannerConfig(max_kv_tokens=100_000, context_length=8192, profile_tp=1, profile_results_dir="p",
                      load_predictor_warmup_trace="t.jsonl")
    other = {"mode": "agg", "prefill_time_model": "quadratic", "profile_results_dir": "q", "fpm_sample_bucket_size": 25,
             "load_predictor_warmup_trace": "u.jsonl"}.get(name, None)
    if other is None:
        other = getattr(c, name) + 1
    refused = f"set_config: {name}: fixed when the deployment starts, which builds"
    with pytest.raises(ConfigError, match=refused):
        c.with_changes({name: other})
    if name in PERF_MODEL_FIELDS:
        # reset_perf changes these, so a restatement would depend on which controls were folded first
        with pytest.raises(ConfigError, match=refused):
            c.with_changes({name: getattr(c, name)})
        assert getattr(c.with_changes({name: other}, command="reset_perf"), name) == other
    else:
        assert c.with_changes({name: getattr(c, name)}) == c  # restating the value is fine
        with pytest.raises(ConfigError, match=f"reset_perf: {name}: fixed when the deployment starts"):
            c.with_changes({name: other}, command="reset_perf")


def test_a_malformed_warmup_trace_names_the_field_and_the_line(tmp_path):
    from fleetplan.bootstrap import build_planner

    trace = tmp_path / "warm.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,x,5\n")
    with pytest.raises(ConfigError, match=rf"^load_predictor_warmup_trace: {trace}:2: ContextTokens: "):
        build_planner(config_from_dict({"load_predictor_warmup_trace": str(trace)}))


@pytest.mark.parametrize("mode", ["disagg", "agg"])
def test_a_threshold_target_with_no_kv_capacity_anywhere_is_refused_when_the_planner_is_built(mode):
    """Decode's threshold rule reads KV use over the cache size: with neither max_kv_tokens nor a
    profile, every decode verdict was insufficient_data and decode never scaled."""
    from fleetplan.bootstrap import build_planner

    cfg = config_from_dict({"mode": mode, "optimization_target": "throughput", "context_length": 8192})
    role = "decode" if mode == "disagg" else "agg"
    with pytest.raises(ConfigError, match=rf"^max_kv_tokens: optimization_target 'throughput' scales {role} by"):
        build_planner(cfg)
    assert build_planner(cfg, "h200-llama3.1-8b").profile.max_kv_tokens == 945029  # the profile measured it
    build_planner(config_from_dict({"mode": mode, "optimization_target": "throughput", "context_length": 8192,
                                    "max_kv_tokens": 100_000}))
    build_planner(config_from_dict({"mode": mode}))  # sla mode sizes decode from its perf model


def test_a_state_of_an_accepted_config_serialises():
    """Whatever config loads, the planner state built from it is one the changelog can store."""
    import orjson

    from fleetplan.models.planner import Planner

    cfg = config_from_dict({"predictor_history_windows": 2**63 - 1, "load_floor_memory_seconds": 2**62})
    orjson.dumps(Planner(cfg).new_state("d").to_data())
    with pytest.raises(ConfigError, match="burst_window_seconds: an integer within 64 bits"):
        config_from_dict({"max_gpu_budget": 64}).with_changes({"burst_window_seconds": 2**64})
