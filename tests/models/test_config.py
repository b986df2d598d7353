"""Config: Dynamo's names and defaults, fail-fast errors that name the field."""

from __future__ import annotations

import pytest

from fleetplan.models.config import (
    STARTUP_FIELDS,
    ConfigError,
    PlannerConfig,
    config_from_dict,
    load_config,
)


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
    c = config_from_dict({"optimization_target": "throughput"})
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
        ({"optimization_target": "load"}, "prefill_scale_{up,down}_queue_tokens"),
        ({"max_gpu_budget": 2, "min_gpu_budget": 4}, "min_gpu_budget must not exceed"),
    ],
)
def test_invalid_config_names_the_field(data, message):
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
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(lst)


def test_with_changes_validates():
    c = PlannerConfig()
    assert c.with_changes({"ttft_ms": 250}).ttft_ms == 250
    with pytest.raises(ConfigError, match="set_config: bogus: unknown field"):
        c.with_changes({"bogus": 1})


@pytest.mark.parametrize("name", sorted(STARTUP_FIELDS))
def test_fields_built_at_start_cannot_change_at_run_time(name):
    c = PlannerConfig(max_kv_tokens=100_000, context_length=8192, profile_tp=1, profile_results_dir="p",
                      load_predictor_warmup_trace="t.jsonl")
    assert c.with_changes({name: getattr(c, name)}) == c  # restating the value is fine
    other = {"mode": "agg", "prefill_time_model": "linear", "profile_results_dir": "q", "fpm_sample_bucket_size": 25,
             "load_predictor_warmup_trace": "u.jsonl"}.get(name, None)
    if other is None:
        other = getattr(c, name) + 1
    with pytest.raises(ConfigError, match=f"set_config: {name}: fixed when the deployment starts, which builds"):
        c.with_changes({name: other})
