"""The MODULE:CLASS policy interface and the baselines."""

from __future__ import annotations

import numpy as np
import pytest

from fleetplan.sim.baselines import SchedulePolicy, refine_needs, static_targets
from fleetplan.sim.experiment import run_policy
from fleetplan.sim.policy import PolicyError, load_policy
from tests.sim.sim_helpers import synthetic

POLICY_MODULE = '''
class StepUp:
    """Add a prefill engine at one minute; remember what it saw."""

    interval_s = 10.0
    seen = []

    def decide(self, view):
        StepUp.seen.append(view)
        if view.time >= 60 and view.expected["prefill"] < 2:
            return {"prefill": 2}
        return None


class Bound:
    """Remembers what bind() was told."""

    context = None

    def bind(self, context):
        Bound.context = context

    def decide(self, view):
        return None


class Broken:
    def decide(self, view):
        return {"prefill": -1}


class NoDecide:
    pass


class Runaway:
    def decide(self, view):
        return {"prefill": 10**9}


class ZeroThenBack:
    """Every role to zero engines at 30 s, and back to one each at 70 s."""

    interval_s = 5.0

    def decide(self, view):
        if view.time >= 70:
            return {"prefill": 1, "decode": 1}
        return {"prefill": 0, "decode": 0} if view.time >= 30 else None


class ToZero:
    """Every role to zero engines at 30 s, with requests still arriving."""

    interval_s = 5.0

    def decide(self, view):
        return {"prefill": 0, "decode": 0} if view.time >= 30 else None
'''


@pytest.fixture
def policy_module(tmp_path, monkeypatch):
    (tmp_path / "my_scalers.py").write_text(POLICY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_scalers"


def test_a_user_policy_scales_the_fleet_through_the_connector(policy_module, make_setup_for):
    setup = make_setup_for(options=__import__("fleetplan.sim.runner", fromlist=["SimOptions"]).SimOptions(startup="30"))
    policy = load_policy(f"{policy_module}:StepUp")
    result = run_policy(synthetic(20, 180), setup, policy, "stepup", {"prefill": 1, "decode": 1})
    assert result.summary.peak_replicas == {"prefill": 2, "decode": 1}
    tl = result.timeline.to_dict()
    ready_at = tl["t"][tl["prefill_ready"].index(2)]
    assert ready_at == pytest.approx(90.0)  # decided at 60 s (first tick at or after 60), 30 s startup
    views = type(policy).seen
    assert [v.time for v in views[:3]] == [10.0, 20.0, 30.0]
    busy = views[5]
    assert busy.traffic.num_req > 0 and busy.traffic.isl == pytest.approx(1000)
    assert {f.role for f in busy.latest_fpm.values()} == {"prefill", "decode"}
    assert busy.ready == {"prefill": 1, "decode": 1}


def test_bad_policies_fail_with_a_clear_message(policy_module, make_setup_for):
    with pytest.raises(PolicyError, match="expected MODULE:CLASS"):
        load_policy("no_colon")
    with pytest.raises(PolicyError, match="cannot import"):
        load_policy("no_such_module_xyz:Thing")
    with pytest.raises(PolicyError, match="has no 'Missing'"):
        load_policy(f"{policy_module}:Missing")
    with pytest.raises(PolicyError, match="no decide"):
        load_policy(f"{policy_module}:NoDecide")
    broken = load_policy(f"{policy_module}:Broken")
    with pytest.raises(PolicyError, match="int >= 0"):
        run_policy(synthetic(5, 30), make_setup_for(), broken, "broken", {"prefill": 1, "decode": 1})
    # a count no fleet has (10**9 ran without end, its engines filling memory) is a bug, not a target
    runaway = load_policy(f"{policy_module}:Runaway")
    with pytest.raises(PolicyError, match="prefill target 1,000,000,000 is more than 10,000 engines"):
        run_policy(synthetic(5, 30), make_setup_for(), runaway, "runaway", {"prefill": 1, "decode": 1})


def test_schedule_starts_workers_a_startup_ahead_and_drains_after():
    needs = [{"prefill": n, "decode": 1} for n in (1, 1, 3, 1, 1)]
    oracle = SchedulePolicy(needs, window_s=60, lookahead_s=120)
    assert oracle.target_at(0.0)["prefill"] == 3  # window 2 starts at 120 s = 0 + lookahead
    assert oracle.target_at(179.0)["prefill"] == 3
    assert oracle.target_at(180.0)["prefill"] == 1


def test_the_oracle_starts_workers_before_their_window_when_the_startup_is_off_its_tick_grid(make_setup_for):
    """A 117-s startup and window 3 at 180 s: its engines must be asked for by 63 s. The
    oracle ticks every 5 s, so the tick at 60 s is the last that makes it; at 65 s they were
    ready 2 s into the window that needed them."""
    from fleetplan.sim.runner import SimOptions

    needs = [{"prefill": n, "decode": 1} for n in (1, 1, 1, 3, 1)]
    oracle = SchedulePolicy(needs, window_s=60, lookahead_s=117)
    assert oracle.target_at(55.0)["prefill"] == 1  # the tick at 60 s is still in time
    assert oracle.target_at(60.0)["prefill"] == 3
    setup = make_setup_for(options=SimOptions(startup="117"))
    result = run_policy(synthetic(1, 300), setup, SchedulePolicy(needs, 60, 117), "oracle")
    ready = next(t for t, counts, _ in result.timeline.points if counts["prefill"]["ready"] == 3)
    assert 180.0 - 5.0 <= ready <= 180.0


def test_static_targets_take_peak_and_mean():
    needs = [{"prefill": n, "decode": 2} for n in (1, 2, 6, 3)]
    assert static_targets(needs, "peak") == {"prefill": 6, "decode": 2}
    assert static_targets(needs, "mean") == {"prefill": 3, "decode": 2}


def test_static_mean_is_the_time_average_of_the_needs_a_short_last_window_included(make_setup_for):
    """A 181-s workload's last window covers 1 s: the time average of (1, 1, 1, 6) is
    (180 + 6) / 181 = 1.03 engines, so static-mean runs 2; read as a fourth full minute
    it was (1 + 1 + 1 + 6) / 4 = 2.25, and static-mean ran 3."""
    from fleetplan.sim.experiment import Sizing, run_static
    from fleetplan.sim.sizing import WindowTraffic

    needs = [{"prefill": n, "decode": 1} for n in (1, 1, 1, 6)]
    traffic = [WindowTraffic(60.0 * j, 1, 1000.0, 100.0, 60.0 if j < 3 else 1.0) for j in range(4)]
    sizing = Sizing(60.0, needs, needs, needs, traffic)
    result = run_static(synthetic(1, 181), make_setup_for(), sizing, "mean")
    assert result.summary.peak_replicas == {"prefill": 2, "decode": 1}


def test_refinement_raises_only_the_role_that_missed():
    calls = []

    def replay(needs):
        calls.append([dict(n) for n in needs])
        return [(0.5 if needs[0]["prefill"] < 3 else 1.0, 1.0), (1.0, 0.9 if needs[1]["decode"] < 2 else 1.0)]

    needs, rounds = refine_needs(
        [{"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 1}], replay, "prefill", "decode", 0.99, 5,
    )
    assert needs == [{"prefill": 3, "decode": 1}, {"prefill": 1, "decode": 2}]
    assert rounds == 2


def test_bind_receives_the_run_context(policy_module, make_setup_for):
    policy = load_policy(f"{policy_module}:Bound")
    run_policy(synthetic(5, 20), make_setup_for(ttft_ms=300), policy, "bound", {"prefill": 1, "decode": 1})
    context = type(policy).context
    assert context.roles == ("prefill", "decode")
    assert context.config.ttft_ms == 300 and context.startup_s == 120.0
    assert context.gpus_per_engine == {"prefill": 1, "decode": 1}


def test_the_last_partial_window_is_sized_at_its_own_rate(make_setup_for):
    """A 150-s workload at 20 requests a second has a last window of 30 s: its
    rate is its arrivals over those 30 s, so it needs what the full ones need."""
    from fleetplan.sim.experiment import size_workload
    from fleetplan.sim.sizing import window_traffic
    from tests.sim.sim_helpers import synthetic

    workload = synthetic(20.0, 150.0, isl=2000, osl=100)
    traffic = window_traffic(workload, 60.0)
    assert [w.duration_s for w in traffic] == [60.0, 60.0, 30.0]
    assert [w.num_req / w.duration_s for w in traffic] == [pytest.approx(20.0)] * 3
    sizing = size_workload(workload, make_setup_for())
    assert sizing.capacity_needs[2] == sizing.capacity_needs[0]


def test_the_warm_fleet_covers_the_span_until_the_first_decision_is_ready():
    """Startup 120 s, first tick at 60 s: the span is [0, 180) s, windows 0–2
    at 60 s. Window 3 starts when the first decision's engines are ready."""
    from fleetplan.sim.baselines import needs_before

    needs = [{"prefill": 1}, {"prefill": 2}, {"prefill": 2}, {"prefill": 5}]
    assert needs_before(needs, 60.0, 180.0) == {"prefill": 2}
    assert needs_before(needs, 60.0, 181.0) == {"prefill": 5}
    assert needs_before(needs, 60.0, 10.0) == {"prefill": 1}


def test_a_run_whose_fleet_cannot_serve_what_is_left_ends_and_counts_it_missed(policy_module, make_setup_for):
    """A policy left both roles at zero engines: the requests waiting for them would keep the run
    going without end (it never stopped); an hour after the trace without a finished request it
    stops, and every stranded request counts against the SLA."""
    from fleetplan.sim.runner import STALL_S

    policy = load_policy(f"{policy_module}:ToZero")
    workload = synthetic(5, 60)
    result = run_policy(workload, make_setup_for(), policy, "to-zero", {"prefill": 1, "decode": 1})
    arrived = sum(1 for _ in workload.requests())
    assert result.summary.requests == arrived  # the stranded ones included
    assert result.summary.sla_attainment < 0.6
    assert STALL_S < result.end_s < STALL_S + 600
    # a request stranded before its first token has no inter-token latency: recorded as 0 ms, it
    # counted as a measured ITL and pulled the run's ITL percentiles down
    log = result.requests.arrays()
    never = log["ttft"] >= result.end_s - log["arrival"] - 1e-9
    assert never.any() and np.isnan(log["itl"][never]).all()
    # the summary counts requests the log has no record of: said when the run is printed
    from fleetplan.sim.cli import stranded_note

    assert result.stranded == int((log["end"] >= result.end_s - 1e-9).sum()) > 0
    assert stranded_note(result) == (f"to-zero: the run stalled: nothing finished for 1 h, and the "
                                     f"{result.stranded:,} requests still waiting count as missed "
                                     "(the log has no record of them)")


def test_a_request_an_engine_is_still_serving_an_hour_after_the_trace_is_not_lost(make_setup_for):
    """A 900,000-token answer decodes for over an hour (about 4.4 ms a token): nothing else
    finishes meanwhile, but its engine is serving it, so the run is not stalled. It was taken
    for one: the run stopped with the request neither finished nor stranded, and the summary
    counted 1 request of the 2 that came."""
    from fleetplan.sim.baselines import StaticPolicy
    from fleetplan.sim.traces import TraceRequest
    from fleetplan.sim.workload import Workload

    workload = Workload.from_requests("long", [TraceRequest(0.0, 1000, 900_000), TraceRequest(1.0, 1000, 10)], 10.0)
    fleet = {"prefill": 1, "decode": 1}
    result = run_policy(workload, make_setup_for(), StaticPolicy(fleet), "static", fleet)
    assert result.summary.requests == 2 and result.stranded == 0
    assert result.end_s == pytest.approx(result.requests.arrays()["end"].max())


def test_requests_waiting_for_an_engine_that_is_starting_are_not_stranded(policy_module, make_setup_for):
    """Engines asked for at 70 s with a 4,000-s startup (a day is allowed) serve the requests
    waiting at the frontend at 4,070 s: more than an hour without a finished request, but no
    stall. They were counted missed and the run ended before the engines were ready."""
    from fleetplan.sim.runner import SimOptions

    policy = load_policy(f"{policy_module}:ZeroThenBack")
    workload = synthetic(5, 60)
    setup = make_setup_for(options=SimOptions(startup="4000"))
    result = run_policy(workload, setup, policy, "back", {"prefill": 1, "decode": 1})
    assert result.stranded == 0
    assert result.summary.requests == sum(1 for _ in workload.requests())
    assert result.requests.arrays()["end"].max() > 4070.0
