"""Profile data and seeding (Dynamo's NPZ bootstrap)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetplan.models.perf import (
    FpmColumns,
    InvalidProfile,
    ProfileData,
    seed_samples,
    seeded_perf_model,
)
from fleetplan.sim.profiles import load_profile


def small_profile(**overrides) -> ProfileData:
    fields = dict(
        prefill_isl=[100, 1000, 2000],
        prefill_ttft_ms=[20.0, 40.0, 60.0],
        x_kv_usage=[0.0, 0.25, 0.5],
        y_context_length=[350.0, 1000.0, 0.0],
        z_itl_ms=[4.0, 10.0, 20.0],
        max_kv_tokens=10_001,
    )
    fields.update(overrides)
    return ProfileData(**fields)


def test_prefill_rows_become_single_request_passes():
    cols = seed_samples(small_profile(), "prefill")
    assert cols.wall_time.tolist() == [0.02, 0.04, 0.06]
    assert cols.num_prefill_requests.tolist() == [1, 1, 1]
    assert cols.sum_prefill_tokens.tolist() == [100, 1000, 2000]
    assert cols.sum_decode_kv_tokens.tolist() == [0, 0, 0]


def test_decode_rows_become_kv_and_request_counts():
    cols = seed_samples(small_profile(), "decode")
    # kv = round(usage·10001): 0, round(2500.25) = 2500, round(5000.5) = 5000 (half to even)
    assert cols.sum_decode_kv_tokens.tolist() == [0, 2500, 5000]
    # requests = max(1, round(kv/ctx)); ctx 0 -> 1
    assert cols.num_decode_requests.tolist() == [1, 2, 1]
    assert cols.wall_time.tolist() == [0.004, 0.01, 0.02]


def test_agg_gets_both_kinds_of_rows():
    cols = seed_samples(small_profile(), "agg")
    assert len(cols) == 6
    assert cols.sum_prefill_tokens.tolist() == [100, 1000, 2000, 0, 0, 0]
    assert cols.sum_decode_kv_tokens.tolist() == [0, 0, 0, 0, 2500, 5000]
    with pytest.raises(ValueError, match="unknown role 'encode'"):
        seed_samples(small_profile(), "encode")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"prefill_ttft_ms": [20.0, 40.0]}, "prefill_ttft_ms"),
        ({"prefill_ttft_ms": [20.0, -1.0, 3.0]}, "prefill_ttft_ms"),
        ({"x_kv_usage": [0.0, 1.5, 0.5]}, "x_kv_usage"),
        ({"z_itl_ms": [4.0, float("nan"), 1.0]}, "z_itl_ms"),
        ({"z_itl_ms": [[4.0, 1.0, 1.0]]}, "z_itl_ms"),
        ({"max_kv_tokens": None}, "max_kv_tokens"),
        ({"prefill_isl": ["a", "b", "c"]}, "prefill_isl"),
    ],
)
def test_invalid_profiles_name_the_field(overrides, key):
    with pytest.raises(InvalidProfile) as err:
        small_profile(**overrides)
    assert err.value.key == key


def test_profile_arrays_are_read_only():
    profile = small_profile()
    with pytest.raises(ValueError, match="read-only"):
        profile.prefill_isl[0] = 5


def test_one_role_profiles_are_allowed():
    prefill_only = small_profile(x_kv_usage=[], y_context_length=[], z_itl_ms=[], max_kv_tokens=None)
    assert prefill_only.has_prefill and not prefill_only.has_decode
    assert len(seed_samples(prefill_only, "decode")) == 0
    with pytest.raises(InvalidProfile):
        small_profile(prefill_isl=[], prefill_ttft_ms=[], x_kv_usage=[], y_context_length=[], z_itl_ms=[])


def test_every_seed_is_retained_and_feeds_the_averages():
    profile = load_profile("h200-llama3.1-8b")
    assert seeded_perf_model(profile, "prefill").num_samples == 17
    decode = seeded_perf_model(profile, "decode")
    assert decode.num_samples == 41
    assert decode.limits.max_kv_tokens == 945_029
    assert seeded_perf_model(profile, "agg").num_samples == 58
    assert seeded_perf_model(profile, "prefill").avg_isl == float(np.mean(profile.prefill_isl))


def test_live_traffic_replaces_seeds_only_where_it_runs():
    """64-sample retention keeps the profile's shape away from the operating point."""
    profile = load_profile("h200-llama3.1-8b")
    model = seeded_perf_model(profile, "prefill")
    before = model.fit().predict(3000.0)
    seeds = set(profile.prefill_isl.tolist())
    # 500 live passes at 3000 tokens, measured a little slower than the profile says
    n = 500
    live = FpmColumns(np.full(n, 0.070), np.ones(n), np.full(n, 3000.0), np.zeros(n), np.zeros(n))
    model.observe_batch(live)
    x, _ = model.regression.samples.arrays()
    kept = set(x[:, 0].tolist()) & seeds
    assert model.num_samples == 64
    assert seeds - kept == {2134.0}  # the one seed sharing the live bucket [2134, 3151)
    after = model.fit().predict(3000.0)
    # the live correction moves the pass time toward what the engine measures (70 ms)
    assert before < after <= 0.0705
    # and the slope still comes from the profile's spread, not from a single point
    assert model.fit().coef[0] == pytest.approx(2.2e-5, rel=0.1)


def test_decode_levels_group_the_rows_by_context_shortest_first():
    profile = ProfileData(
        prefill_isl=[100.0], prefill_ttft_ms=[20.0],
        x_kv_usage=[0.5, 0.1, 0.2, 0.3], y_context_length=[3000.0, 3000.0, 350.0, 350.0],
        z_itl_ms=[30.0, 10.0, 12.0, 15.0], max_kv_tokens=100_000,
    )
    levels = profile.decode_levels()
    assert list(levels) == [350.0, 3000.0]
    assert [u.tolist() for u, _ in levels.values()] == [[0.2, 0.3], [0.1, 0.5]]
    assert [t.tolist() for _, t in levels.values()] == [[12.0, 15.0], [10.0, 30.0]]
