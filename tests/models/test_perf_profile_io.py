"""Reading profiles from disk (fleetplan.sim.profiles): layouts, TP selection, errors.

Files are written into tmp_path from the bundled profile, so nothing here
reads the shared data folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetplan.sim.profiles import (
    BUNDLED_PROFILES,
    ProfileError,
    bundled_profile_names,
    load_profile,
)

H200 = load_profile("h200-llama3.1-8b")


def prefill_arrays(**overrides):
    arrays = {"prefill_isl": np.asarray(H200.prefill_isl, dtype=np.int64),
              "prefill_ttft": np.asarray(H200.prefill_ttft_ms),
              "prefill_thpt_per_gpu": np.ones(H200.prefill_isl.size)}
    arrays.update(overrides)
    return {k: v for k, v in arrays.items() if v is not None}


def decode_arrays(**overrides):
    arrays = {"x_kv_usage": np.asarray(H200.x_kv_usage),
              "y_context_length": np.asarray(H200.y_context_length),
              "z_itl": np.asarray(H200.z_itl_ms),
              "z_thpt_per_gpu": np.ones(H200.x_kv_usage.size),
              "max_kv_tokens": np.array([H200.max_kv_tokens], dtype=np.int64)}
    arrays.update(overrides)
    return {k: v for k, v in arrays.items() if v is not None}


def same_data(a, b) -> bool:
    return all(
        np.array_equal(getattr(a, f), getattr(b, f))
        for f in ("prefill_isl", "prefill_ttft_ms", "x_kv_usage", "y_context_length", "z_itl_ms")
    ) and a.max_kv_tokens == b.max_kv_tokens


def test_bundled_profiles_come_from_package_data():
    assert bundled_profile_names() == ("h200-llama3.1-8b", "h100-llama3.3-70b")
    assert set(BUNDLED_PROFILES) == set(bundled_profile_names())
    assert (H200.name, H200.gpu, H200.tp, H200.max_kv_tokens) == (
        "h200-llama3.1-8b", "h200_sxm", 1, 945_029)
    assert H200.model == "nvidia/Llama-3.1-8B-Instruct-FP8"
    assert (H200.prefill_isl.size, H200.x_kv_usage.size) == (17, 41)
    import fleetplan.sim
    data_dir = Path(fleetplan.sim.__file__).parent / "profile_data"
    assert (data_dir / "README.md").read_text().count("Dynamo planner profiling data, NVIDIA, Apache-2.0")


def test_stacked_profile_defaults_to_fewest_gpus_and_selects_tp():
    default = load_profile("h100-llama3.3-70b")
    assert default.tp == 2
    assert default.prefill_ttft_ms[-1] == pytest.approx(1957.103563)
    tp8 = load_profile("h100-llama3.3-70b", tp=8)
    assert tp8.tp == 8
    assert tp8.prefill_ttft_ms[-1] == pytest.approx(703.830652)
    assert (tp8.x_kv_usage.size, tp8.max_kv_tokens) == (39, 224_133)
    with pytest.raises(ProfileError) as err:
        load_profile("h100-llama3.3-70b", tp=3)
    assert err.value.key == "tp"
    assert "tp=3" in str(err.value) and "__prefill.npz" in str(err.value)


def test_profiling_results_dir_layout(tmp_path):
    (tmp_path / "selected_prefill_interpolation").mkdir()
    (tmp_path / "selected_decode_interpolation").mkdir()
    np.savez(tmp_path / "selected_prefill_interpolation" / "raw_data.npz", **prefill_arrays())
    np.savez(tmp_path / "selected_decode_interpolation" / "raw_data.npz", **decode_arrays())
    loaded = load_profile(tmp_path)
    assert same_data(loaded, H200)
    assert loaded.name == tmp_path.name and loaded.tp is None
    assert load_profile(tmp_path, tp=1).tp == 1  # no tp metadata: taken on trust
    # either file of the pair finds its partner
    assert same_data(load_profile(tmp_path / "selected_decode_interpolation" / "raw_data.npz"), H200)


def test_json_fallback(tmp_path):
    prefill = {k: v.tolist() for k, v in prefill_arrays().items()}
    decode = {k: v.tolist() for k, v in decode_arrays().items()}
    decode["max_kv_tokens"] = H200.max_kv_tokens  # Dynamo writes a plain int here
    (tmp_path / "prefill_raw_data.json").write_text(json.dumps(prefill))
    (tmp_path / "decode_raw_data.json").write_text(json.dumps(decode))
    assert same_data(load_profile(tmp_path), H200)
    assert same_data(load_profile(tmp_path / "prefill_raw_data.json"), H200)
    # a byte-order mark (a Windows editor's) is not part of the JSON, as in a config file
    bom = tmp_path / "bom"
    bom.mkdir()
    (bom / "prefill_raw_data.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(prefill).encode())
    (bom / "decode_raw_data.json").write_text(json.dumps(decode))
    assert same_data(load_profile(bom), H200)


def test_named_pair_and_single_files(tmp_path):
    np.savez(tmp_path / "gpu__model__prefill.npz", **prefill_arrays())
    np.savez(tmp_path / "gpu__model__decode.npz", **decode_arrays())
    pair = load_profile(tmp_path / "gpu__model__prefill.npz")
    assert same_data(pair, H200) and pair.name == "gpu__model"
    alone = tmp_path / "solo"
    alone.mkdir()
    np.savez(alone / "x_decode.npz", **decode_arrays())
    decode_only = load_profile(alone / "x_decode.npz")
    assert decode_only.has_decode and not decode_only.has_prefill


@pytest.mark.parametrize(
    ("role", "overrides", "key"),
    [
        ("prefill", {"prefill_ttft": None}, "prefill_ttft"),
        ("prefill", {"prefill_ttft": -np.ones(17)}, "prefill_ttft"),
        ("prefill", {"prefill_ttft": np.ones(3)}, "prefill_ttft"),
        ("prefill", {"prefill_isl": np.array(["a"] * 17)}, "prefill_isl"),
        ("decode", {"max_kv_tokens": None}, "max_kv_tokens"),
        ("decode", {"max_kv_tokens": np.array([0])}, "max_kv_tokens"),
        ("decode", {"max_kv_tokens": np.array([1.5])}, "max_kv_tokens"),
        ("decode", {"x_kv_usage": np.full(41, 2.0)}, "x_kv_usage"),
        ("decode", {"z_itl": np.full(41, np.nan)}, "z_itl"),
        ("decode", {"y_context_length": None}, "y_context_length"),
        # metadata that is not a whole number raised a bare "cannot convert float NaN to integer"
        ("prefill", {"tp": np.array([np.nan])}, "tp"),
        ("prefill", {"tp": np.array(["two"])}, "tp"),
        ("prefill", {"tp": np.array([2.5])}, "tp"),
        # a prompt of 1e200 tokens overflowed the prefill fit to NaN: a traceback at the first tick
        ("prefill", {"prefill_isl": np.full(17, 1e200)}, "prefill_isl"),
        ("decode", {"y_context_length": np.full(41, 1e200)}, "y_context_length"),
    ],
)
def test_bad_files_name_file_and_key(tmp_path, role, overrides, key):
    arrays = {"prefill": prefill_arrays, "decode": decode_arrays}
    for r in ("prefill", "decode"):
        np.savez(tmp_path / f"m__{r}.npz", **arrays[r](**(overrides if r == role else {})))
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "m__prefill.npz")
    assert err.value.key == key
    assert f"m__{role}.npz" in err.value.path
    assert repr(key) in str(err.value) and f"m__{role}.npz" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_stacked_file_without_tp_cannot_choose(tmp_path):
    stacked = {k: np.stack([v, v]) for k, v in prefill_arrays().items()}
    np.savez(tmp_path / "s__prefill.npz", **stacked)
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "s__prefill.npz")
    assert err.value.key == "tp"


def test_stacked_file_with_a_tp_that_is_not_a_whole_number(tmp_path):
    stacked = {k: np.stack([v, v]) for k, v in prefill_arrays().items()}
    stacked["tp"] = np.array([[1.0], [np.nan]])
    np.savez(tmp_path / "s__prefill.npz", **stacked)
    for tp in (None, 1):
        with pytest.raises(ProfileError) as err:
            load_profile(tmp_path / "s__prefill.npz", tp=tp)
        assert err.value.key == "tp" and "s__prefill.npz" in str(err.value)


def test_unreadable_and_missing(tmp_path):
    (tmp_path / "junk__prefill.npz").write_bytes(b"not a zip")
    with pytest.raises(ProfileError, match="not a readable NPZ") as err:
        load_profile(tmp_path / "junk__prefill.npz")
    assert err.value.key is None
    # text is not read as a pickle, whose refusal advised allowing pickles
    (tmp_path / "prof.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ProfileError, match=r"not a zip of arrays\); a profile is an NPZ, a \.json") as err:
        load_profile(tmp_path / "prof.csv")
    assert "pickle" not in str(err.value)
    (tmp_path / "prefill_raw_data.json").write_text("[1, 2]")
    with pytest.raises(ProfileError, match="JSON root"):
        load_profile(tmp_path / "prefill_raw_data.json")
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ProfileError, match="no profiling data"):
        load_profile(empty)
    with pytest.raises(ProfileError, match="bundled profiles"):
        load_profile("h300-nonexistent")


def test_the_engines_gpu_count_chooses_the_config_a_stacked_profile_times():
    """A deployment of 8-GPU engines on the 70B profile (TP8, TP4, TP2 rows) was timed on the
    TP2 rows, the fewest GPUs, while the simulator billed 8 GPUs an engine: a quarter of the
    speed it paid for. Without ``profile_tp`` the engines' GPU count now chooses."""
    from fleetplan.bootstrap import load_profile_for
    from fleetplan.models.config import ConfigError, config_from_dict

    def cfg(**fields):
        return config_from_dict({"max_gpu_budget": -1, **fields})

    tp8 = load_profile_for(cfg(prefill_engine_num_gpu=8, decode_engine_num_gpu=8), "h100-llama3.3-70b")
    assert (tp8.tp, tp8.engine_gpus) == (8, 8)
    assert tp8.prefill_ttft_ms[-1] == pytest.approx(703.830652)  # the TP8 row, as load_profile(tp=8)
    assert load_profile_for(cfg(), "h100-llama3.3-70b").tp == 2  # unset: the fewest GPUs, as before
    assert load_profile_for(cfg(profile_tp=4, decode_engine_num_gpu=4), "h100-llama3.3-70b").tp == 4
    # engines the profile did not measure fail at start, naming the field and what would do
    with pytest.raises(ConfigError, match=r"^--profile: .*no config whose engine has 3 GPUs.*have \[8, 4, 2\]"):
        load_profile_for(cfg(decode_engine_num_gpu=3), "h100-llama3.3-70b")
    with pytest.raises(ConfigError, match=r"^decode_engine_num_gpu: 2 GPUs an engine, but the profile "
                                          r"h100-llama3.3-70b measured engines of 4;.*decode_engine_num_gpu: 4$"):
        load_profile_for(cfg(profile_tp=4, decode_engine_num_gpu=2), "h100-llama3.3-70b")
    # prefill on TP8 and decode on TP2 cannot both be one profile's config: the one that is not, named
    with pytest.raises(ConfigError, match=r"^prefill_engine_num_gpu: 8 GPUs an engine.*engines of 2"):
        load_profile_for(cfg(prefill_engine_num_gpu=8, decode_engine_num_gpu=2), "h100-llama3.3-70b")
    with pytest.raises(ConfigError, match=r"^decode_engine_num_gpu: 2 .*engines of 1"):
        load_profile_for(cfg(decode_engine_num_gpu=2), "h200-llama3.1-8b")


def test_a_profile_without_parallel_metadata_is_taken_on_trust(tmp_path):
    from fleetplan.bootstrap import load_profile_for
    from fleetplan.models.config import config_from_dict

    np.savez(tmp_path / "prefill.npz", **prefill_arrays())
    np.savez(tmp_path / "decode.npz", **decode_arrays())
    loaded = load_profile_for(config_from_dict({"decode_engine_num_gpu": 4, "prefill_engine_num_gpu": 4,
                                                "max_gpu_budget": -1}), tmp_path)
    assert (loaded.tp, loaded.engine_gpus) == (None, None)


@pytest.mark.parametrize("missing", ["prefill_ttft", "prefill_isl"])
def test_one_file_with_half_the_prefill_keys_names_the_missing_one(tmp_path, missing):
    """A single file with both roles (what ``write_profile_json`` writes) that lost one prefill
    key loaded as a decode-only profile without a word: the prefill rows it did hold were
    dropped, the planner's prefill model started unseeded, and the simulator refused the
    profile for having no prefill rows, naming no key. A decode key missing was named."""
    arrays = {**prefill_arrays(), **decode_arrays()}
    del arrays[missing]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({k: v.tolist() for k, v in arrays.items()}))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert err.value.key == missing and "profile.json" in err.value.path
