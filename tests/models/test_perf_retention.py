"""Bucketed sample retention: hand-traced cases, batching invariance."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetplan.models.perf import BucketedSamples


def xs_of(samples: BucketedSamples) -> list[float]:
    x, _ = samples.arrays()
    return x[:, 0].tolist()


def test_oldest_sample_of_fullest_bucket_is_dropped_and_bounds_rebucket():
    s = BucketedSamples(ndim=1, max_samples=4, buckets_per_axis=2)
    for v in (0.0, 10.0, 1.0, 2.0):
        s.add((v,), 0.01)
    assert s.bucket_counts() == [3, 1]  # bounds [0, 10]: 0,1,2 low; 10 high
    s.add((3.0,), 0.01)  # low bucket now 4 > 1: its oldest (0) goes
    assert xs_of(s) == [10.0, 1.0, 2.0, 3.0]
    assert s.bounds == ((0.0,), (10.0,))  # bounds are all-time, not of the retained
    s.add((11.0,), 0.01)  # bounds move to [0, 11]: re-bucket, then drop 1 (oldest low)
    assert xs_of(s) == [10.0, 2.0, 3.0, 11.0]
    assert s.bucket_counts() == [2, 2]


def test_tie_between_fullest_buckets_drops_the_oldest_sample():
    s = BucketedSamples(ndim=1, max_samples=3, buckets_per_axis=2)
    for v in (10.0, 0.0, 9.0):  # high: 10, 9; low: 0
        s.add((v,), 0.01)
    s.add((1.0,), 0.01)  # high 2, low 2: tie; the oldest sample (10, high) goes
    assert xs_of(s) == [0.0, 9.0, 1.0]


def test_tie_right_after_an_eviction_in_a_batch_drops_the_oldest_sample():
    """The batched path's shortcut (a row in the bucket just evicted from evicts from
    it again) must not apply when that bucket was tied for fullest. Here, one by one:
    1 makes high [10, 9] and low [0, 1] tie, and 10 goes; the next 9 makes high
    [9, 9] and low [0, 1] tie again, and 0, the oldest, goes (not high's 9)."""
    rows = [10.0, 0.0] + [9.0, 1.0] * 7 + [9.0]  # more than SMALL_BATCH: add_many's batched path
    one_by_one = BucketedSamples(ndim=1, max_samples=3, buckets_per_axis=2)
    for v in rows[:5]:
        one_by_one.add((v,), 0.01)
    assert xs_of(one_by_one) == [9.0, 1.0, 9.0]
    for v in rows[5:]:
        one_by_one.add((v,), 0.01)
    batched = BucketedSamples(ndim=1, max_samples=3, buckets_per_axis=2)
    batched.add_many(np.array(rows).reshape(-1, 1), np.full(len(rows), 0.01))
    assert xs_of(batched) == xs_of(one_by_one) == [9.0, 1.0, 9.0]
    assert batched.to_state() == one_by_one.to_state()


def test_default_grid_is_4x4_in_2d_and_16_in_1d():
    one = BucketedSamples(1, 64, 16)
    two = BucketedSamples(2, 64, 4)
    assert len(one.bucket_counts()) == 16
    assert len(two.bucket_counts()) == 16
    for i in range(4):
        for j in range(4):
            two.add((float(i), float(j)), 0.01)
    assert two.bucket_counts() == [1] * 16


def test_crowded_operating_point_does_not_push_out_the_rest_of_the_range():
    s = BucketedSamples(1, 64, 16)
    spread = [100.0 + 1000.0 * i for i in range(17)]  # like the H200 prefill profile
    for v in spread:
        s.add((v,), 0.01)
    for _ in range(500):
        s.add((3000.0,), 0.06)
    kept = xs_of(s)
    assert len(kept) == 64
    # Bounds [100, 16100] make 1000-token buckets; 3000 shares bucket [2100, 3100)
    # with one seed, the only seed that goes.
    assert [v for v in spread if v not in kept] == [2100.0]
    assert kept.count(3000.0) == 64 - 16


def test_cap_holds_and_fifo_within_bucket():
    s = BucketedSamples(1, 8, 16)
    for i in range(100):
        s.add((5.0,), float(i + 1))
    _, y = s.arrays()
    assert y.tolist() == [float(v) for v in range(93, 101)]


def _sequential(rows, ndim):
    s = BucketedSamples(ndim, 16, 4 if ndim == 2 else 16)
    for *x, w in rows:
        s.add(tuple(x), w)
    return s


sample_rows_1d = st.lists(
    st.tuples(st.sampled_from([0.0, 1.0, 2.0, 7.5, 100.0]) | st.floats(0, 1e4), st.floats(1e-3, 1)),
    max_size=120,
)
sample_rows_2d = st.lists(
    st.tuples(st.integers(0, 300).map(float), st.floats(0, 1e6), st.floats(1e-3, 1)), max_size=120
)


@settings(max_examples=80, deadline=None)
@given(sample_rows_1d, st.lists(st.integers(0, 120), max_size=6))
def test_add_many_equals_add_one_by_one_1d(rows, cuts):
    _check_batching(rows, cuts, ndim=1)


@settings(max_examples=80, deadline=None)
@given(sample_rows_2d, st.lists(st.integers(0, 120), max_size=6))
def test_add_many_equals_add_one_by_one_2d(rows, cuts):
    _check_batching(rows, cuts, ndim=2)


def _check_batching(rows, cuts, ndim):
    expected = _sequential(rows, ndim)
    batched = BucketedSamples(ndim, 16, 4 if ndim == 2 else 16)
    edges = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        chunk = np.array(rows[a:b], dtype=np.float64).reshape(-1, ndim + 1)
        batched.add_many(chunk[:, :ndim], chunk[:, ndim])
    assert batched.to_state() == expected.to_state()
    assert len(batched) <= 16
    assert batched._sizes == batched.bucket_counts()  # the sizes eviction reads stay exact


steady_rows_2d = st.lists(
    st.tuples(st.sampled_from([10.0, 10.0, 10.0, 12.0, 200.0]), st.sampled_from([5e5, 5e5, 5e5, 6e5, 1e3]),
              st.floats(1e-3, 1)),
    min_size=100, max_size=400,
)


@settings(max_examples=60, deadline=None)
@given(steady_rows_2d, st.lists(st.integers(0, 400), max_size=4))
def test_add_many_at_a_steady_operating_point_equals_add_one_by_one(rows, cuts):
    """Most rows at one point, so one bucket stays the only fullest (``_append_run``'s
    shortcut); now and then a row elsewhere, so it stops being so."""
    _check_batching(rows, cuts, ndim=2)


@settings(max_examples=40, deadline=None)
@given(sample_rows_2d)
def test_state_round_trip(rows):
    s = _sequential(rows, 2)
    restored = BucketedSamples.from_state(s.to_state())
    assert restored.to_state() == s.to_state()
    assert restored.bucket_counts() == s.bucket_counts()
    for other in (s, restored):
        other.add((1.0, 2.0), 0.5)
    assert restored.to_state() == s.to_state()
