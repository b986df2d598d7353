"""A ``seed_traffic`` control starts a new deployment's forecaster from the traffic it had before."""

from __future__ import annotations

import math

import orjson
import pytest

from fleetplan.models.forecast import TrafficObservation
from fleetplan.models.planner import Planner
from fleetplan.models.predictor_swap import seed_control
from fleetplan.models.state import DeploymentState
from fleetplan.schemas import MAX_EVENT_BYTES, ControlEvent, SchemaError, decode_event, encode_event
from fleetplan.schemas.events import MAX_SEED_WINDOWS
from tests.models.factories import T0, ready, requests

RATES = (20, 26, 18, 31, 24, 35, 22, 29, 40, 27)  # requests a second in each 180-s window


def _traffic(first: int = 0, t_ready: float = T0 + 0.1):
    out = [ready("p0", "prefill", t=t_ready), ready("d0", "decode", t=t_ready)]
    for i, rate in enumerate(RATES[first:], start=first):
        start = T0 + 1 + 180 * i
        out += requests(rate, start, start + 179, isl=2000 + 100 * i, osl=150 + 5 * i, tag=f"w{i}-")
    return out


def _seed(t: float, rows) -> ControlEvent:
    return seed_control("d", t, rows)


def _forecasts(out) -> list[float]:
    return [o.predicted.num_req for o in out if getattr(o, "predicted", None) is not None]


@pytest.fixture
def live(make_fleet):
    """A deployment that saw all ten windows, and what it kept of them."""
    fleet = make_fleet(load_predictor="ensemble")
    out = fleet.run(_traffic())
    return out, fleet.state("d").traffic_history


def test_a_seed_gives_the_forecasts_of_a_deployment_that_saw_the_windows_live(make_fleet, live):
    out, history = live
    seeded = make_fleet(load_predictor="ensemble")
    late = seeded.run(sorted([_seed(T0 + 900, history[:5]), *_traffic(first=5, t_ready=T0 + 900.1)],
                             key=lambda e: e.time))
    state = seeded.state("d")
    assert state.rejected_controls == 0 and state.config_version == 1
    assert state.traffic_history[:5] == history[:5]
    # from its first tick on (the sixth window), the seeded planner forecasts as the live one did
    assert _forecasts(late) == _forecasts(out)[5:]
    cold = make_fleet(load_predictor="ensemble").run(_traffic(first=5, t_ready=T0 + 900.1))
    assert _forecasts(cold) != _forecasts(late)


def test_a_deployment_that_has_been_fed_refuses_a_seed(make_fleet, live):
    _, history = live
    traffic = [e for e in _traffic() if e.time < T0 + 560]
    fed, unseeded = make_fleet(load_predictor="ensemble"), make_fleet(load_predictor="ensemble")
    # two windows fed by T0 + 400, when the seed comes
    fed.run(sorted([_seed(T0 + 400, history[:2]), *traffic], key=lambda e: e.time))
    unseeded.run(traffic)
    state = fed.state("d")
    assert state.rejected_controls == 1 and state.config_version == 0
    assert state.to_data() == {**unseeded.state("d").to_data(), "rejected_controls": 1}


def test_a_seed_of_other_windows_than_the_throughput_loops_is_refused(make_fleet):
    fleet = make_fleet(load_predictor="ensemble")
    minutes = [[T0 - 60 * (3 - i), 60.0, 500.0, 2000.0, 150.0, None, None, None] for i in range(3)]
    fleet.run([_seed(T0, minutes), *[e for e in _traffic() if e.time < T0 + 200]])
    state = fleet.state("d")
    assert state.last_tick == T0 + 180
    assert state.rejected_controls == 1 and state.forecaster.windows_seen == 1  # its own first window


def test_a_warm_up_trace_has_fed_the_forecaster_already(make_fleet, h200, live):
    _, history = live
    base = make_fleet(load_predictor="ensemble").planner.config
    warmup = [TrafficObservation(duration_s=180, num_req=3600.0, isl=2000.0, osl=150.0)]
    fleet = type(make_fleet())(Planner(base, profile=h200, warmup=warmup))
    fleet.run([_seed(T0 + 900, history[:5]), *_traffic(first=5, t_ready=T0 + 900.1)])
    assert fleet.state("d").rejected_controls == 1


def test_a_seeded_state_round_trips_and_keeps_its_bounded_history(make_fleet, live):
    _, history = live
    fleet = make_fleet(load_predictor="ensemble", predictor_history_windows=3)
    fleet.run([_seed(T0 + 900, history[:5]), *[e for e in _traffic(first=5, t_ready=T0 + 900.1) if e.time < T0 + 1100]])
    state = fleet.state("d")
    assert state.last_tick == T0 + 1080 and state.forecaster.windows_seen == 6  # five seeded, one live
    assert state.traffic_history[:2] == history[3:5] and len(state.traffic_history) == 3
    assert DeploymentState.from_data(state.to_data()).to_data() == state.to_data()


# --- the schema ----------------------------------------------------------------


def _raw(windows, t: float = 0.0) -> bytes:
    return orjson.dumps({"type": "control", "deployment": "d", "time": t,
                         "body": {"command": "seed_traffic", "windows": windows}})


def _window(start: float, duration: float = 60.0, **extra) -> dict:
    return {"start_s": start, "duration_s": duration, "num_req": 5, "isl": 100, "osl": 10, **extra}


@pytest.mark.parametrize(
    "windows,time,field,expected",
    [
        ([_window(-120), _window(-90)], 0.0, "body.windows.1.start_s", "-90 is before the end of window 0 (-60)"),
        ([_window(-60), _window(0)], 0.0, "body.windows.1", "ends at 60, after the event's time 0"),
        ([], 0.0, "body.windows", "at least 1 item"),
        ([_window(-60, num_req=-1)], 0.0, "body.windows.0.num_req", "greater than or equal to 0"),
        ([_window(-60, duration=0)], 0.0, "body.windows.0.duration_s", "greater than 0"),
        ([_window(-60, kv_hit_rate=1.5)], 0.0, "body.windows.0.kv_hit_rate", "less than or equal to 1"),
        ([_window(-60, surprise=1)], 0.0, "body.windows.0.surprise", "Extra inputs"),
        ([_window(-60 * (MAX_SEED_WINDOWS + 1 - i)) for i in range(MAX_SEED_WINDOWS + 1)], 0.0,
         "body.windows", f"at most {MAX_SEED_WINDOWS} items"),
    ],
)
def test_a_bad_seed_names_the_field(windows, time, field, expected):
    with pytest.raises(SchemaError) as info:
        decode_event(_raw(windows, time))
    assert info.value.field == field
    assert expected in str(info.value)


def test_the_largest_seed_fits_in_one_record_and_round_trips_exactly():
    # full-precision floats everywhere: the longest a window's JSON gets
    third = 1 / 3
    windows = [
        {"start_s": T0 - 180.0 * (MAX_SEED_WINDOWS - i) + third, "duration_s": 180.0, "num_req": 12345.0 + third,
         "isl": 2345.0 + third, "osl": 345.0 + third, "kv_hit_rate": third, "accept_length": 1 + third,
         "peak": 23456.0 + third}
        for i in range(MAX_SEED_WINDOWS)
    ]
    event = decode_event(_raw(windows, T0 + 1))
    raw = encode_event(event)
    assert len(raw) < MAX_EVENT_BYTES
    assert decode_event(raw) == event
    assert all(math.isclose(w.end_s, T0 - 180.0 * (MAX_SEED_WINDOWS - i - 1) + third)
               for i, w in enumerate(event.body.windows))


def test_a_seed_carries_the_time_ordered_end_of_the_history():
    from fleetplan.models.predictor_swap import seed_windows

    def row(start: float) -> list:
        return [start, 180.0, 10.0, 100.0, 10.0, None, None, None]

    # windows on another clock (from 0) before live ones: they warmed this forecaster too
    # and go along while in time order (a deployment on the Unix clock)...
    history = [row(0.0), row(180.0), row(T0), row(T0 + 180), row(T0 + 360)]
    assert seed_windows(history) == history
    # ...and are left out where they overlap the live ones (a simulator's run, from 0 too)
    history = [row(0.0), row(180.0), row(360.0), row(180.0), row(360.0), row(540.0)]
    assert seed_windows(history) == history[3:]
    assert seed_windows([]) == []
    many = [row(T0 + 180.0 * i) for i in range(MAX_SEED_WINDOWS + 5)]
    assert seed_windows(many) == many[5:]


def test_a_warm_up_traces_windows_stay_out_of_the_seed(h200):
    """A warm-up trace's windows have no start time (its clock is not the events'): the seed is
    the live windows after them, and validates (the scan added to a None start until 2026-12-05)."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.fleet import Fleet
    from fleetplan.models.forecast import bucket_traffic
    from fleetplan.models.predictor_swap import seed_windows

    warm = bucket_traffic([(i * 0.5, 2000.0, 150.0) for i in range(2000)], 180)
    assert warm and all(w.start_s is None for w in warm)
    fleet = Fleet(Planner(config_from_dict({"max_gpu_budget": 64}), profile=h200, warmup=warm))
    fleet.run(_traffic()[:2] + requests(2, T0 + 1, T0 + 600))
    history = fleet.state("d").traffic_history
    assert [row[0] for row in history[:len(warm)]] == [None] * len(warm)
    live = history[len(warm):]
    assert len(live) == 3 and all(row[0] is not None for row in live)
    assert seed_windows(history) == [row[:8] for row in live]
    seed = _seed(T0 + 700, seed_windows(history))
    assert [w.start_s for w in seed.body.windows] == [row[0] for row in live]


@pytest.mark.parametrize("predictor", ["ensemble", "kalman", "arima_frozen"])
def test_a_seed_at_the_schemas_limits_is_sized_not_crashed_on(predictor):
    """1e12 requests of 600k tokens a window ask for more engines than any budget holds: the
    sizing stops at MAX_ENGINES per role instead of breaking the Erlang arithmetic (which
    failed this tick on every replay of the log)."""
    from fleetplan.models.config import config_from_dict
    from fleetplan.models.fleet import Fleet
    from fleetplan.models.queueing import MAX_ENGINES
    from fleetplan.schemas.events import ControlEvent, SeedTraffic, SeedWindow
    from fleetplan.sim.profiles import load_profile
    from tests.models.factories import T0, ready, requests

    cfg = config_from_dict({"load_predictor": predictor, "max_gpu_budget": -1})
    fleet = Fleet(Planner(cfg, profile=load_profile("h200-llama3.1-8b")))
    seed = ControlEvent(deployment="d", time=T0 + 0.5, body=SeedTraffic(windows=[
        SeedWindow(start_s=T0 - 180.0 * (20 - k), duration_s=180.0, num_req=1e12 if k % 2 else 1.0,
                   isl=3000.0, osl=600_000.0) for k in range(20)]))
    reports = fleet.run([ready("p0", "prefill"), ready("d0", "decode"), seed,
                         *requests(1, T0 + 1, T0 + 185, isl=3000, osl=600_000)])
    sized = [r for r in reports if r.throughput_reason != "not_due"]
    assert sized and all(e.rate_replicas is None or e.rate_replicas <= MAX_ENGINES
                         for r in sized for e in r.estimates.values())


def test_a_deployment_whose_traffic_began_mid_window_seeds_every_window(make_fleet):
    """Traffic from half way into the first window makes it partial, carried into the next (since
    2026-12-05; before, its count was scaled to a whole window's, and kept with the start of its
    traffic and the interval's length, it ran past the next window's start, so the seed left it
    out and a planner started from the seed forecast 3,634 where the one that saw the traffic
    forecast 3,539). The longer first window is kept too."""
    from fleetplan.models.predictor_swap import seed_windows
    from fleetplan.schemas import ClockEvent

    events = [ready("p0", "prefill"), ready("d0", "decode")]
    for i, rate in enumerate((20, 26, 18, 31)):
        events += requests(rate, T0 + 1 + 180 * i + (90 if i == 0 else 0), T0 + 180 * (i + 1) - 1, tag=f"w{i}-")
    live = make_fleet(load_predictor="ensemble")
    live.run(events)
    state = live.state("d")
    history = state.traffic_history
    assert len(history) == 2 and seed_windows(history) == history
    seeded = make_fleet(load_predictor="ensemble")
    seeded.run([_seed(state.max_time, seed_windows(history)), ClockEvent(deployment="d", time=state.max_time + 62.0)])
    assert seeded.state("d").forecaster.forecast() == state.forecaster.forecast()


def test_a_seed_overlapping_the_traffic_already_seen_is_refused(make_fleet, live):
    """A seed that comes after the traffic began, before its first window closed, and whose
    windows run past the first request: that traffic is in the live window too, and was fed
    twice (until 2026-12-05 it was taken, and the history held the window [T0 + 899, T0 + 1079)
    and the live one [T0 + 900, T0 + 1080))."""
    _, history = live
    overlapping = [[row[0] - 1, *row[1:8]] for row in history[:6]]  # the last ends at T0 + 1079
    late = sorted([_seed(T0 + 1079, overlapping), *_traffic(first=5, t_ready=T0 + 900.1)], key=lambda e: e.time)
    fleet = make_fleet(load_predictor="ensemble")
    fleet.run(late)
    state = fleet.state("d")
    assert state.first_traffic < T0 + 1079
    assert state.rejected_controls == 1 and state.config_version == 0
    # one that ends before the first request is the deployment's past, also when it comes later
    fleet = make_fleet(load_predictor="ensemble")
    fleet.run(sorted([_seed(T0 + 950, history[:5]), *_traffic(first=5, t_ready=T0 + 900.1)], key=lambda e: e.time))
    assert fleet.state("d").rejected_controls == 0 and fleet.state("d").traffic_history[:5] == history[:5]


def test_the_seed_of_a_deployment_whose_interval_changed_starts_a_planner_at_the_new_one(make_fleet):
    """The kept windows of a deployment whose throughput interval went from 180 s to 60 s are of
    both lengths; its seed is given at the interval in force, as its forecaster was rebuilt from
    them (until 2026-12-05 the seed held the 180-s windows, and a planner at 60 s refused it)."""
    import io

    from fleetplan.cli import write_seed
    from fleetplan.schemas import ClockEvent
    from fleetplan.schemas.events import SetConfig

    change = ControlEvent(deployment="d", time=T0 + 1000,
                          body=SetConfig(changes={"throughput_adjustment_interval_seconds": 60}))
    live = make_fleet(load_predictor="ensemble")
    live.run(sorted([*_traffic(), change], key=lambda e: e.time))
    state = live.state("d")
    assert {row[1] for row in state.traffic_history} == {180, 60}
    out = io.BytesIO()
    assert write_seed(state, out)  # what --seed-out writes
    seed = decode_event(out.getvalue().strip())
    assert len(seed.body.windows) == len(state.traffic_history)
    assert {w.duration_s for w in seed.body.windows} == {60}
    seeded = make_fleet(load_predictor="ensemble", throughput_adjustment_interval_seconds=60)
    seeded.run([seed, ClockEvent(deployment="d", time=state.max_time + 62.0)])
    assert seeded.state("d").rejected_controls == 0
    assert seeded.state("d").forecaster.forecast() == state.forecaster.forecast()


def test_a_seed_gives_the_planner_the_kv_hit_rate_and_accept_length_it_measured(make_fleet):
    """The throughput loop keeps each window's KV hit rate and accept length for both loops'
    sizing, the last that measured one; a seed's windows carry them too, and until 2026-12-05
    the seeded planner sized with no cache hits and no speculation until a live window measured."""
    from fleetplan.schemas import ClockEvent

    traffic = [e if e.type != "request" else e.model_copy(update={"cached_tokens": 1000, "accept_length": 2.5})
               for e in _traffic()[:2] + requests(20, T0 + 1, T0 + 539, isl=2000)]
    live = make_fleet(load_predictor="ensemble")
    live.run(traffic)
    state = live.state("d")
    assert state.last_kv_hit_rate == 0.5 and state.last_accept_length == 2.5
    seeded = make_fleet(load_predictor="ensemble")
    seeded.run([_seed(state.max_time, state.traffic_history), ClockEvent(deployment="d", time=state.max_time + 6.0)])
    moved = seeded.state("d")
    assert moved.rejected_controls == 0
    assert (moved.last_kv_hit_rate, moved.last_accept_length) == (0.5, 2.5)


def test_the_traffic_began_with_the_earliest_arrival_not_the_first_request_to_finish(make_fleet, live):
    """Finished requests fold in the order they end: a short request that arrived at T0 + 905 and
    ended first dated the deployment's traffic, though a long one had arrived at T0 + 850 and ended
    after it. A seed ending at T0 + 900 then passed as the deployment's past, while the request of
    T0 + 850 is in its last window and in the first live one too."""
    from fleetplan.schemas import ClockEvent, RequestRecord

    _, history = live

    def record(rid: str, arrival: float, end: float) -> RequestRecord:
        return RequestRecord(deployment="d", time=end, request_id=rid, input_tokens=2000, output_tokens=150,
                             request_received_ms=arrival * 1000)

    events = [ready("p0", "prefill"), ready("d0", "decode"),
              record("short", T0 + 905, T0 + 906), record("long", T0 + 850, T0 + 950),
              _seed(T0 + 951, history[:5]),  # the five windows end at T0 + 900
              ClockEvent(deployment="d", time=T0 + 1100)]
    fleet = make_fleet(load_predictor="ensemble")
    fleet.run(sorted(events, key=lambda e: e.time))
    state = fleet.state("d")
    assert state.first_traffic == T0 + 850
    assert state.rejected_controls == 1 and state.config_version == 0


def test_the_seed_of_a_deployment_whose_ticks_ran_past_its_last_event_is_dated_its_last_tick(make_fleet):
    """The live worker fires an idle deployment's ticks on its partition's clock, past the
    deployment's last event, and each throughput tick keeps a window; a snapshot of that state is
    where ``fleetplan audit --since --seed-out`` starts. Dated the latest event, the seed's last
    window ended after its time, and writing it raised a pydantic ValidationError."""
    import io

    from fleetplan.cli import write_seed
    from fleetplan.models.sequencer import advance

    fleet = make_fleet(load_predictor="ensemble")
    fleet.run(_traffic()[:2] + requests(20, T0 + 1, T0 + 539, isl=2000))
    state = fleet.state("d")
    advance(fleet.planner, state, state.max_time + 1000)  # the partition's clock, the deployment silent
    assert state.traffic_history[-1][0] + state.traffic_history[-1][1] > state.max_time
    out = io.BytesIO()
    assert write_seed(state, out)
    seed = decode_event(out.getvalue().strip())
    assert seed.time == state.last_tick >= seed.body.windows[-1].end_s
    assert [w.start_s for w in seed.body.windows] == [row[0] for row in state.traffic_history]


def test_a_deployment_that_keeps_no_windows_is_told_so_not_that_none_was_fed(make_fleet, capsys):
    """With ``predictor_history_windows: 0`` the forecaster is fed every window and keeps none to
    seed from; ``--seed-out`` said "no throughput window fed yet", sending the operator to look
    for missing traffic instead of at the setting."""
    import io

    from fleetplan.cli import write_seed

    fleet = make_fleet(load_predictor="ensemble", predictor_history_windows=0)
    fleet.run(_traffic()[:2] + requests(20, T0 + 1, T0 + 539, isl=2000))
    state = fleet.state("d")
    assert state.forecaster.windows_seen == 2 and state.traffic_history == []
    assert not write_seed(state, io.BytesIO())
    err = capsys.readouterr().err
    assert "fed yet" not in err
    assert "d: its forecaster was fed 2 windows and keeps none to seed from (predictor_history_windows: 0)" in err
