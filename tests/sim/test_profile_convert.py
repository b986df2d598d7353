"""Splitwise and DistServe tables become profiles the planner and the simulator read."""

from __future__ import annotations

import json

import pytest

from fleetplan.sim.profile_convert import (
    ProfileConvertError,
    distserve_profile,
    profile_from_spec,
    splitwise_profile,
    write_profile_json,
)
from fleetplan.sim.profiles import load_profile
from fleetplan.sim.timing import engine_timing

SPLITWISE = """model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,token_time,e2e_time,tensor_parallel
m,h100,512,1,128,1,1,50.0,20.0,0,4
m,h100,512,1,128,1,1,52.0,20.0,0,4
m,h100,1024,1,128,1,1,90.0,21.0,0,4
m,h100,512,8,128,1,1,300.0,24.0,0,4
m,h100,2048,1,128,1,1,170.0,22.0,0,4
other,h100,512,1,128,1,1,1.0,1.0,0,4
"""

DISTSERVE = {"facebook/opt-13b": {"1": {
    "decoding_large_small_bs_threshold": 95,
    "prefill": [20.0, 0.1, 1e-5],
    "decoding_smallbs": [20.0, 0.0005, 0.05],
    "decoding_largebs": [10.0, 0.0005, 0.1],
}}}


def test_splitwise_rows_become_prefill_and_decode_points(tmp_path):
    path = tmp_path / "perf_model.csv"
    path.write_text(SPLITWISE)
    profile = splitwise_profile(path, "m", "h100", 4)
    assert profile.tp == 4
    points = dict(zip(profile.prefill_isl.tolist(), profile.prefill_ttft_ms.tolist(), strict=True))
    assert points[512] == pytest.approx(51.0)  # duplicates averaged
    assert points[4096] == pytest.approx(300.0)  # 8 prompts of 512 in one pass
    timing = engine_timing(profile)
    assert timing.prefill_s(1024) == pytest.approx(0.090)
    assert timing.decode_s(8, 8 * 576) == pytest.approx(0.024)
    with pytest.raises(ProfileConvertError, match="no rows for m/a100/tp4"):
        splitwise_profile(path, "m", "a100", 4)


def test_distserve_coefficients_are_sampled(tmp_path):
    path = tmp_path / "profiler.json"
    path.write_text(json.dumps(DISTSERVE))
    profile = distserve_profile(path, "facebook/opt-13b", 1, max_kv_tokens=60_000)
    timing = engine_timing(profile)
    assert timing.prefill_s(512) * 1000 == pytest.approx(20 + 51.2 + 2.62144)
    assert timing.decode_s(8, 8 * 512) * 1000 == pytest.approx(20 + 0.0005 * 4096 + 0.4)


def test_spec_strings_and_json_round_trip(tmp_path):
    path = tmp_path / "profiler.json"
    path.write_text(json.dumps(DISTSERVE))
    profile = profile_from_spec(f"distserve:{path}:facebook/opt-13b:1")
    assert profile is not None and profile.max_kv_tokens == 66_144
    assert profile_from_spec("h200-llama3.1-8b") is None
    with pytest.raises(ProfileConvertError, match="expected splitwise"):
        profile_from_spec("splitwise:only-a-file")
    back = load_profile(write_profile_json(profile, tmp_path / "profile.json"))
    assert back.max_kv_tokens == profile.max_kv_tokens
    assert back.z_itl_ms.tolist() == profile.z_itl_ms.tolist()


def test_host_cost_per_sequence_adds_to_every_decode_step(tmp_path):
    path = tmp_path / "profiler.json"
    path.write_text(json.dumps(DISTSERVE))
    plain = engine_timing(distserve_profile(path, "facebook/opt-13b", 1, max_kv_tokens=60_000))
    host = engine_timing(distserve_profile(path, "facebook/opt-13b", 1, max_kv_tokens=60_000, host_ms_per_seq=0.5))
    assert (host.decode_s(8, 8 * 512) - plain.decode_s(8, 8 * 512)) * 1000 == pytest.approx(8 * 0.5)
    assert host.prefill_s(512) == plain.prefill_s(512)  # a prompt pass is not a decode step
    spec = profile_from_spec(f"distserve:{path}:facebook/opt-13b:1:60000:0.5")
    assert spec is not None and spec.z_itl_ms.tolist() == distserve_profile(
        path, "facebook/opt-13b", 1, 60_000, 0.5).z_itl_ms.tolist()
    for bad in ("-1", "nan", "x"):
        with pytest.raises(ProfileConvertError, match="host_ms_per_seq|HOST_MS_PER_SEQ"):
            profile_from_spec(f"distserve:{path}:facebook/opt-13b:1:60000:{bad}")


# --- a bad table names its file, line and field; the spec is not blamed ---------

SPLITWISE_HEADER = "model,hardware,tensor_parallel,batch_size,prompt_size,token_size,prompt_time,token_time\n"
SPLITWISE_ROW = "m,h,1,1,128,32,1.28,5.1\n"


@pytest.mark.parametrize(
    "row,message",
    [
        ("m,h,1,1,128,32,1.28,nan\n", "line 3: token_time: a finite number > 0, got 'nan'"),
        ("m,h,1,1,128,32,-1.28,5.1\n", "line 3: prompt_time: a finite number > 0, got '-1.28'"),
        ("m,h,1,0,128,32,1.28,5.1\n", "line 3: batch_size: a positive integer, got '0'"),
        ("m,h,1,1,abc,32,1.28,5.1\n", "line 3: prompt_size: a positive integer, got 'abc'"),
    ],
)
def test_splitwise_bad_row_names_file_line_and_column(tmp_path, row, message):
    path = tmp_path / "sw.csv"
    path.write_text(SPLITWISE_HEADER + SPLITWISE_ROW + row)
    with pytest.raises(ProfileConvertError) as err:
        profile_from_spec(f"splitwise:{path}:m:h:1")
    assert str(err.value) == f"{path}: {message}"


def test_splitwise_non_utf8_names_line_and_byte(tmp_path):
    path = tmp_path / "sw_latin1.csv"
    path.write_bytes((SPLITWISE_HEADER + SPLITWISE_ROW + "m\xe9,h,1,1,128,32,1.28,5.1\n").encode("latin-1"))
    with pytest.raises(ProfileConvertError) as err:
        profile_from_spec(f"splitwise:{path}:m:h:1")
    assert str(err.value) == f"{path}: line 3: not UTF-8 (byte 0xe9)"


def _distserve_with(**params) -> dict:
    block = {**DISTSERVE["facebook/opt-13b"]["1"], **params}
    return {"facebook/opt-13b": {"1": block}}


@pytest.mark.parametrize(
    "params,message",
    [
        ({"decoding_smallbs": [20.0, 0.0005]}, "decoding_smallbs: three numbers, got [20.0, 0.0005]"),
        ({"prefill": ["a", "b", "c"]}, "prefill: three numbers, got ['a', 'b', 'c']"),
        ({"prefill": None}, "prefill: three numbers, got None"),
        ({"decoding_large_small_bs_threshold": "x"}, "decoding_large_small_bs_threshold: a number (a batch size), got 'x'"),
        ({"prefill": [-100.0, 0, 0]}, "prefill: coefficients that give a time > 0 ms, got -100 ms at 16 tokens"),
        ({"decoding_largebs": [-50.0, 0, 0]}, "decoding_largebs: coefficients that give a time > 0 ms, got -50 ms at batch 96 at context 64"),
    ],
)  # fmt: skip
def test_distserve_bad_coefficients_name_file_model_and_key(tmp_path, params, message):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(_distserve_with(**params)))
    with pytest.raises(ProfileConvertError) as err:
        profile_from_spec(f"distserve:{path}:facebook/opt-13b:1")
    assert str(err.value) == f"{path}: facebook/opt-13b tp1 {message}"


def test_distserve_tolerates_a_negative_coefficient_whose_times_stay_positive(tmp_path):
    path = tmp_path / "ds.json"  # DistServe's own OPT-66B TP2 fit has a negative quadratic term
    path.write_text(json.dumps(_distserve_with(prefill=[58.38, 0.3826, -7.11e-06])))
    profile = profile_from_spec(f"distserve:{path}:facebook/opt-13b:1")
    isl = profile.prefill_isl
    # the negative term is used as given at every sampled length, not clipped, and stays positive
    assert profile.prefill_ttft_ms.tolist() == pytest.approx((58.38 + 0.3826 * isl - 7.11e-06 * isl**2).tolist())
    assert isl.max() >= 2048 and (profile.prefill_ttft_ms > 0).all()


@pytest.mark.parametrize(
    "suffix,message",
    [
        ("1:0", "MAX_KV: a positive integer, got '0'"),
        ("1:-5", "MAX_KV: a positive integer, got '-5'"),
        ("1:10", "MAX_KV: at least 64 tokens"),
        ("two", "TP: a positive integer, got 'two'"),
    ],
)
def test_a_bad_number_in_the_spec_blames_the_spec_part(tmp_path, suffix, message):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(DISTSERVE))
    spec = f"distserve:{path}:facebook/opt-13b:{suffix}"
    with pytest.raises(ProfileConvertError) as err:
        profile_from_spec(spec)
    assert str(err.value).startswith(f"{spec}: {message}")


@pytest.mark.parametrize(
    "model,tp,kv",
    [
        ("facebook/opt-13b", 1, 66_144),
        ("facebook/opt-13b", 2, 163_008),  # was 66,144: two A100s given one's cache
        ("facebook/opt-66b", 2, 11_600),  # was 66,144: 5.7x the cache OPT-66B leaves on two
    ],
)
def test_distserve_kv_capacity_defaults_to_the_figure_of_that_model_and_tp(tmp_path, model, tp, kv):
    """Without MAX_KV every model and TP got OPT-13B's one-A100 cache (66,144 tokens), though
    the KV-usage axis of the converted rows and the simulated engine's cache are per engine;
    the default is now DistServe's own figure (max_num_tokens.csv) for that model and TP."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({model: {str(tp): DISTSERVE["facebook/opt-13b"]["1"]}}))
    assert profile_from_spec(f"distserve:{path}:{model}:{tp}").max_kv_tokens == kv
    assert distserve_profile(path, model, tp).max_kv_tokens == kv


def test_distserve_without_a_known_kv_capacity_asks_for_max_kv(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"my/model": {"1": DISTSERVE["facebook/opt-13b"]["1"]}}))
    spec = f"distserve:{path}:my/model:1"
    with pytest.raises(ProfileConvertError, match=r"MAX_KV: .*no KV capacity for my/model tp1"):
        profile_from_spec(spec)
    assert profile_from_spec(spec + ":50000").max_kv_tokens == 50_000


def test_splitwise_batches_beyond_a_given_kv_capacity_are_left_out(tmp_path):
    """With MAX_KV below a measured batch's KV, that batch was kept at KV usage 1.0: 8 prompts
    of 576 tokens (4,608 KV) became a full 3,000-token cache, so the planner was seeded with
    "5 sequences take the 8-sequence time" and the simulated engine read it there. Batches
    that do not fit are now left out, as the DistServe conversion does."""
    path = tmp_path / "perf_model.csv"
    path.write_text(SPLITWISE)
    profile = profile_from_spec(f"splitwise:{path}:m:h100:4:3000")
    kv = profile.x_kv_usage * profile.max_kv_tokens
    assert sorted(zip(kv.round().tolist(), profile.y_context_length.tolist(), strict=True)) == [
        (576, 576), (1088, 1088), (2112, 2112)]
    with pytest.raises(ProfileConvertError, match="max_kv_tokens: 100 .*576"):
        splitwise_profile(path, "m", "h100", 4, max_kv_tokens=100)
