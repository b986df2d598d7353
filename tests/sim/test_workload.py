"""Trace transforms and the ServeGen generator."""

from __future__ import annotations

import pytest

from fleetplan.sim.servegen import ServeGenError, servegen_workload
from fleetplan.sim.traces import TraceRequest, read_trace
from fleetplan.sim.workload import (
    rate_scale,
    slice_trace,
    speed,
    spread_arrivals,
    timestamp_step,
    trace_duration,
)
from tests.sim.sim_helpers import CODE, CONV, DATA


@pytest.fixture(scope="module")
def conv():
    return read_trace(CONV)


def per_minute(reqs, minutes=10):
    counts = [0] * minutes
    for r in reqs:
        counts[min(int(r.arrival_s // 60), minutes - 1)] += 1
    return counts


def test_slice_rebases_to_zero(conv):
    part = slice_trace(conv, 120.0, 180.0)
    assert part and part[0].arrival_s >= 0 and part[-1].arrival_s < 60.0
    assert len(part) == sum(1 for r in conv if 120.0 <= r.arrival_s < 180.0)


def test_speed_compresses_the_time_axis(conv):
    fast = speed(conv, 4.0)
    assert len(fast) == len(conv)
    assert fast[-1].arrival_s == pytest.approx(conv[-1].arrival_s / 4)


def test_rate_scale_multiplies_the_rate_and_keeps_the_time_axis(conv):
    k = 5
    scaled = rate_scale(conv, k, seed=3, duration_s=600)
    assert len(scaled) == k * len(conv)
    assert all(0 <= r.arrival_s < 600 for r in scaled)
    assert [r.arrival_s for r in scaled] == sorted(r.arrival_s for r in scaled)
    # the shape over time stays close to k times the original (the copies are shifted)
    base, big = per_minute(conv), per_minute(scaled)
    assert sum(big) == k * sum(base)
    assert max(big) <= k * max(base) and min(big) >= 0.6 * k * min(base)


def test_rate_scale_is_seeded_and_identity_at_one(conv):
    assert rate_scale(conv, 1.0) == conv
    assert rate_scale(conv, 3, seed=7) == rate_scale(conv, 3, seed=7)
    assert rate_scale(conv, 3, seed=7) != rate_scale(conv, 3, seed=8)


def test_fractional_and_thinning_scales(conv):
    n = len(conv)
    assert abs(len(rate_scale(conv, 2.5, seed=1)) - 2.5 * n) < 0.05 * n
    assert abs(len(rate_scale(conv, 0.5, seed=1)) - 0.5 * n) < 0.05 * n


def test_rate_scale_keeps_the_trace_itself_as_copy_zero():
    # A trace logged in whole seconds (Mooncake) ends exactly on its duration (ceil of an
    # integer): its last requests are copy 0's and stay at the end, not wrapped to 0 onto
    # the first ones (Mooncake x6 moved its last 12 requests to t = 0, 22 at one instant).
    rows = [TraceRequest(0.0, 100, 10), TraceRequest(3.0, 100, 10), TraceRequest(6.0, 100, 10),
            TraceRequest(6.0, 100, 10)]
    assert trace_duration(rows) == 6.0
    for factor in (2, 2.5):
        times = [r.arrival_s for r in rate_scale(rows, factor, seed=0)]
        assert times.count(6.0) == 2 and times.count(0.0) == 1


def test_rate_scale_keeps_shared_prefixes_and_renames_private_ones():
    shared = (1, 2)
    rows = [
        TraceRequest(0.0, 1536, 10, shared + (10,)),
        TraceRequest(5.0, 1536, 10, shared + (11,)),
    ]
    out = rate_scale(rows, 2, seed=0, duration_s=10)
    copies = [r.hash_ids for r in out]
    assert all(h[:2] == shared for h in copies)
    private = sorted(h[2] for h in copies)
    assert len(set(private)) == 4  # 10, 11 and two renamed copies


def test_trace_duration_rounds_up_to_the_window():
    assert trace_duration([TraceRequest(599.97, 1, 1)]) == 600.0


def test_servegen_is_seeded_and_follows_the_recorded_rates():
    clients = DATA / "servegen_m-mid_30min_sample.csv"
    lengths = DATA / "m-mid_mean_isl_osl_6h.csv"
    wl = servegen_workload(clients, "m-mid", duration_s=1800, rate_scale=0.05, seed=1, lengths_path=lengths)
    first = list(wl.requests())
    again = list(wl.requests())
    assert first == again  # re-iterable, same seed, same requests
    other = servegen_workload(clients, "m-mid", duration_s=1800, rate_scale=0.05, seed=2, lengths_path=lengths)
    assert list(other.requests()) != first
    assert [r.arrival_s for r in first] == sorted(r.arrival_s for r in first)
    assert all(0 <= r.arrival_s < 1800 for r in first)
    # recorded: about 707 req/s summed over these clients; at 5% about 35 req/s
    rate = len(first) / 1800
    assert 20 < rate < 50
    mean_isl = sum(r.input_tokens for r in first) / len(first)
    assert 0.8 * 596.7 < mean_isl < 1.2 * 596.7  # lognormal around the 6-hour mean


def test_servegen_rejects_unknown_models_and_bad_files(tmp_path):
    clients = DATA / "servegen_m-mid_30min_sample.csv"
    with pytest.raises(ServeGenError, match="no rows for model"):
        servegen_workload(clients, "m-none", lengths_path=DATA / "m-mid_mean_isl_osl_6h.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("t,rate\n0,1\n")
    with pytest.raises(ServeGenError, match=r"bad.csv:1: header"):
        servegen_workload(bad, "m-mid")


@pytest.mark.parametrize(("row", "message"), [
    ("0,-1,1.0,Gamma,1.0,1.0,c1,m-mid", "bad.csv:2: rate: expected requests/s in [0, 100,000], got '-1'"),
    ("0,nan,1.0,Gamma,1.0,1.0,c1,m-mid", "bad.csv:2: rate: expected requests/s"),
    ("0,1e9,1.0,Gamma,1.0,1.0,c1,m-mid", "bad.csv:2: rate: expected requests/s"),
    ("0,5,1.0,Gamma,0,0,c1,m-mid", "bad.csv:2: p1/p2: a Gamma needs a shape and a scale > 0, got '0', '0'"),
    ("0,5,1.0,Weibull,-1,2,c1,m-mid", "bad.csv:2: p1/p2: a Weibull needs a shape and a scale > 0"),
    ("-600,5,1.0,Exponential,0,0,c1,m-mid", "bad.csv:2: t: expected seconds >= 0, got '-600'"),
])
def test_servegen_rows_out_of_range_name_the_line_and_field(tmp_path, row, message):
    bad = tmp_path / "bad.csv"
    bad.write_text(f"t,rate,cv,dist,p1,p2,client,model\n{row}\n")
    with pytest.raises(ServeGenError) as info:
        servegen_workload(bad, "m-mid", lengths_path=DATA / "m-mid_mean_isl_osl_6h.csv")
    assert message in str(info.value)


def test_a_rate_scale_past_what_a_replay_holds_is_refused_before_any_copy(conv):
    # 1e6 for 1.6: the copies were made, 290 bytes a request, until memory ran out
    with pytest.raises(ValueError, match=r"--rate-scale: 1e\+06 × 2,867 requests is 2.87e\+09, more than the "
                                         r"10,000,000 one replay holds"):
        rate_scale(conv, 1e6)


def test_a_servegen_rate_scale_whose_busiest_window_draws_too_many_is_refused():
    # the sample's clients sum to about 707 req/s: 424,000 requests a 10-minute window, drawn at once
    clients, lengths = DATA / "servegen_m-mid_30min_sample.csv", DATA / "m-mid_mean_isl_osl_6h.csv"
    with pytest.raises(ValueError, match=r"--rate-scale: 30 × the 437,633 requests of the window at 1200 s is "
                                         r"1.31e\+07, more than the 10,000,000 one window may draw"):
        servegen_workload(clients, "m-mid", duration_s=1800, rate_scale=30, lengths_path=lengths)
    assert servegen_workload(clients, "m-mid", duration_s=1800, rate_scale=20, lengths_path=lengths).duration_s == 1800


# --- arrival times rounded to a step -----------------------------------------------


def _stepped(step_s: float = 3.0, steps: int = 40, per_step: int = 6) -> list[TraceRequest]:
    """Mooncake-like: every request of a step logged at the step's start."""
    return [TraceRequest(k * step_s, 1000 + j, 100) for k in range(steps) for j in range(per_step)]


def test_the_rounding_step_is_found_and_exact_timestamps_have_none(conv):
    assert timestamp_step(_stepped(3.0)) == 3.0
    assert timestamp_step(conv) is None  # Azure logs 100-ns ticks: one request per timestamp
    assert timestamp_step(_stepped(0.5)) is None  # sub-second clumps are taken as the arrivals themselves
    assert timestamp_step(_stepped(3.0, steps=2)) is None  # too few timestamps to tell


def test_spread_keeps_every_request_inside_its_step_and_is_seeded():
    rows = _stepped(3.0)
    spread = spread_arrivals(rows, 3.0, seed=7)
    assert len(spread) == len(rows)
    assert [r.arrival_s for r in spread] == sorted(r.arrival_s for r in spread)
    assert len({r.arrival_s for r in spread}) == len(rows)  # no two arrive at the same instant
    # each request lands in the step after its recorded time, lengths untouched
    assert sorted((int(r.arrival_s // 3.0), r.input_tokens) for r in spread) == sorted(
        (int(r.arrival_s // 3.0), r.input_tokens) for r in rows)
    assert spread == spread_arrivals(rows, 3.0, seed=7)
    assert spread != spread_arrivals(rows, 3.0, seed=8)
    with pytest.raises(ValueError, match="timestamp step must be > 0"):
        spread_arrivals(rows, 0.0)


def test_servegen_stays_inside_its_duration():
    # 900 s is a window and a half: the second window's arrivals past 900 s are not the run's
    clients = DATA / "servegen_m-mid_30min_sample.csv"
    lengths = DATA / "m-mid_mean_isl_osl_6h.csv"
    wl = servegen_workload(clients, "m-mid", duration_s=900, rate_scale=0.05, seed=1, lengths_path=lengths)
    reqs = list(wl.requests())
    assert all(0 <= r.arrival_s < 900 for r in reqs)
    longer = servegen_workload(clients, "m-mid", duration_s=1200, rate_scale=0.05, seed=1, lengths_path=lengths)
    assert reqs == [r for r in longer.requests() if r.arrival_s < 900]


def test_servegen_starting_inside_a_window_has_that_windows_traffic():
    # --start 300: [300, 600) is the second half of the window that began at 0, not silence
    clients = DATA / "servegen_m-mid_30min_sample.csv"
    lengths = DATA / "m-mid_mean_isl_osl_6h.csv"
    wl = servegen_workload(clients, "m-mid", start_s=300, duration_s=600, rate_scale=0.05, seed=1,
                           lengths_path=lengths)
    whole = servegen_workload(clients, "m-mid", duration_s=1200, rate_scale=0.05, seed=1, lengths_path=lengths)
    expected = [(r.arrival_s - 300, r.input_tokens, r.output_tokens) for r in whole.requests()
                if 300 <= r.arrival_s < 900]
    assert [(r.arrival_s, r.input_tokens, r.output_tokens) for r in wl.requests()] == expected


def test_a_duration_past_the_trace_end_scales_the_trace_not_its_empty_tail(conv):
    """``--duration 1200 --rate-scale 2`` on a 600-s trace: the copies wrapped around the
    1,200 s asked for, so the trace's 600 s got 1.71 times its rate (4,902 requests) and the
    600 s after it, where the trace has none, the other 832. Twice the users is twice the
    trace's own arrivals, over the time it covers."""
    from fleetplan.sim.cli import _workload

    assert trace_duration(conv) == 600
    wl, _ = _workload(CONV, None, None, 0.0, 1200.0, 2.0, 1.0, 0)
    assert wl.duration_s == 1200.0  # the run is as long as asked: the fleet idles after the trace
    arrivals = [r.arrival_s for r in wl.requests()]
    assert len(arrivals) == 2 * len(conv)
    assert max(arrivals) < 600
    assert arrivals == [r.arrival_s for r in _workload(CONV, None, None, 0.0, 600.0, 2.0, 1.0, 0)[0].requests()]
    # a start inside the trace: its remaining 300 s carry both copies
    late, _ = _workload(CONV, None, None, 300.0, 600.0, 2.0, 1.0, 0)
    inside = slice_trace(conv, 300.0)
    assert sum(1 for r in late.requests() if r.arrival_s < 300) == 2 * len(inside)


def test_mean_lengths_are_read_by_column_name(tmp_path):
    """ServeGen's mm-image file puts its modality columns first and ``input_tokens`` last
    (``window6h_start_s,audio_tokens,image_tokens,output_tokens,text_tokens,video_tokens,
    input_tokens``): read by position, its requests got the audio tokens (0) as ISL and the
    image tokens as OSL, so a 1,354-token prompt with a 113-token answer became 1 and 805."""
    from fleetplan.sim.servegen import read_mean_lengths

    image = tmp_path / "mm-image_mean_isl_osl_6h.csv"
    image.write_text(
        "window6h_start_s,audio_tokens,image_tokens,output_tokens,text_tokens,video_tokens,input_tokens\n"
        "0,0.0,804.7242388938341,112.74313413197845,549.3365002185551,0.0,1354.0607391123892\n"
    )
    assert read_mean_lengths(image) == [(0.0, 1354.0607391123892, 112.74313413197845)]
    assert read_mean_lengths(DATA / "m-mid_mean_isl_osl_6h.csv")[0] == (0.0, 596.7314058114935, 109.52919414562292)
    no_input = tmp_path / "no_input.csv"
    no_input.write_text("window6h_start_s,output_tokens\n0,10\n")
    with pytest.raises(ServeGenError, match=r"no_input.csv:1: header: expected columns window6h_start_s, "
                                            r"input_tokens and output_tokens"):
        read_mean_lengths(no_input)


def test_rate_scale_with_a_bounded_shift_keeps_the_shape_over_time():
    """Offsets anywhere in the window turn each copy round by a random phase, so their sum
    flattens toward the mean rate (the 30-minute Azure code trace's per-minute coefficient of
    variation: 0.99 as logged, 0.11 at x50). Offsets within 30 s keep the minutes' shape."""
    import numpy as np

    code = read_trace(CODE)

    def minutes(rows):
        return np.bincount([int(r.arrival_s // 60) for r in rows], minlength=10)[:10].astype(float)

    base = minutes(code)
    flat = minutes(rate_scale(code, 50, seed=0, duration_s=600))
    kept_rows = rate_scale(code, 50, seed=0, duration_s=600, max_shift_s=30)
    kept = minutes(kept_rows)
    cv = lambda x: x.std() / x.mean()  # noqa: E731
    assert cv(flat) < 0.5 * cv(base)
    assert abs(cv(kept) - cv(base)) < 0.2 * cv(base) and np.corrcoef(base, kept)[0, 1] > 0.95
    assert len(kept_rows) == 50 * len(code) and all(0 <= r.arrival_s < 600 for r in kept_rows)
    assert [r.arrival_s for r in kept_rows] == sorted(r.arrival_s for r in kept_rows)
    # the copies still spread: no second holds anywhere near 50 times the trace's busiest
    seconds = np.bincount([int(r.arrival_s) for r in kept_rows])
    assert seconds.max() < 0.5 * 50 * np.bincount([int(r.arrival_s) for r in code]).max()


def test_a_bad_rate_scale_shift_is_refused_naming_the_option(conv):
    with pytest.raises(ValueError, match=r"--rate-scale-shift: a finite number of seconds >= 0, got -1"):
        rate_scale(conv, 2, max_shift_s=-1)


def test_copies_shifted_by_zero_keep_the_traces_last_requests_at_its_end():
    """``--rate-scale-shift 0``: every copy sits on the trace's own times. A trace in whole
    seconds ends on its duration (Mooncake: 1,797 s), and there the copies' last requests
    were wrapped to t = 0, onto the first ones, while the trace's own stayed at the end."""
    rows = [TraceRequest(0.0, 100, 10), TraceRequest(3.0, 100, 10), TraceRequest(6.0, 100, 10),
            TraceRequest(6.0, 100, 10)]
    times = [r.arrival_s for r in rate_scale(rows, 3, seed=0, max_shift_s=0)]
    assert times == [0.0] * 3 + [3.0] * 3 + [6.0] * 6


def test_private_blocks_renamed_per_copy_stay_apart_with_negative_hashes():
    """Trace readers take any integer as a block hash, and a u64 hash written as a signed
    i64 is negative. The renaming stride counted only the largest hash, so copy 2's private
    block -3 became -1, the block both requests share: a cache hit that is no user's prefix."""
    shared = -1
    rows = [TraceRequest(0.0, 1024, 10, (shared, -3)), TraceRequest(5.0, 1024, 10, (shared, 0))]
    out = rate_scale(rows, 3, seed=0, duration_s=10)
    assert all(r.hash_ids[0] == shared for r in out)
    private = [r.hash_ids[1] for r in out]
    assert len(set(private)) == 6 and shared not in private
