"""reset_perf: the engines changed under the planner, so what it learned about them starts over."""

from __future__ import annotations

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.config_changes import change_problem
from fleetplan.models.fleet import Fleet
from fleetplan.models.fold_ahead import snapshot as state_at_tick
from fleetplan.models.perf_models import make_perf_models
from fleetplan.models.planner import Planner
from fleetplan.models.state import DeploymentState
from fleetplan.schemas import ControlEvent, ResetPerf, SetConfig
from fleetplan.schemas.codec import decode_event, encode_event
from fleetplan.sim.profiles import load_profile
from tests.models.factories import T0, fpm, ready, requests

PROFILE = load_profile("h200-llama3.1-8b")


def _fleet(**changes) -> Fleet:
    cfg = config_from_dict({**REFERENCE_SIZING, "load_predictor": "constant", "max_gpu_budget": 64, **changes})
    return Fleet(Planner(cfg, profile=PROFILE))


def _reset(t: float, **changes) -> ControlEvent:
    return ControlEvent(deployment="d", time=t, body=ResetPerf(changes=changes))


def _served(until: float) -> list:
    """Two engines serving a steady 4 req/s with an FPM from each every 5 s, to ``until``."""
    events = [ready("p0", "prefill"), ready("d0", "decode"), *requests(4, T0 + 1, until)]
    for t in range(5, int(until - T0), 5):
        events.append(fpm("p0", "prefill", T0 + t, counter=t, prefill_tokens=3000 + 40 * t, wall=0.05 + t / 1e5))
        events.append(fpm("d0", "decode", T0 + t, counter=t, decode_reqs=8 + t % 16, decode_kv=9000 + 90 * t,
                          wall=0.01 + t / 2e5))
    return sorted(events, key=lambda e: e.time)


def test_it_rebuilds_the_perf_models_and_keeps_the_fleet_and_the_traffic():
    fleet = _fleet(enable_load_scaling=False)
    fleet.run(_served(T0 + 600))
    state = fleet.states["d"]
    before = DeploymentState.from_data(state.to_data())
    assert state.perf["decode"].to_state() != make_perf_models(state.config, PROFILE)["decode"].to_state()

    fleet.planner.apply(state, _reset(T0 + 601, max_num_seqs=128))
    config = state.config
    assert config.max_num_seqs == 128 and state.config_version == before.config_version + 1
    fresh = make_perf_models(config, PROFILE)
    assert {r: m.to_state() for r, m in state.perf.items()} == {r: m.to_state() for r, m in fresh.items()}
    assert state.measured_floors == [] and state.mix_factor == {} and state.down_since == {}
    # the fleet and its traffic are the world's, not the engines' speed
    assert state.workers == before.workers and state.traffic_history == before.traffic_history
    assert state.forecaster.to_state() == before.forecaster.to_state()
    assert state.next_decision_id == before.next_decision_id
    assert DeploymentState.from_data(state.to_data()).to_data() == state.to_data()


def test_the_new_perf_models_learn_from_the_fpms_after_it():
    fleet = _fleet(enable_load_scaling=False)
    events = _served(T0 + 900)
    fleet.run([e for e in events if e.time < T0 + 600] + [_reset(T0 + 600)]
              + [e for e in events if e.time >= T0 + 600])
    state = fleet.states["d"]
    again = _fleet(enable_load_scaling=False)
    again.run([e for e in events if e.time >= T0 + 600 or e.type != "fpm"])
    # the FPMs before the reset are forgotten: the models are those of a fleet that saw only the later ones
    assert state.perf["decode"].to_state() == again.states["d"].perf["decode"].to_state()


def test_a_reset_wrong_against_the_config_in_force_is_counted_and_changes_nothing():
    fleet = _fleet(max_gpu_budget=8)
    fleet.run(_served(T0 + 300))
    state = fleet.states["d"]
    perf = {r: m.to_state() for r, m in state.perf.items()}
    fleet.planner.apply(state, _reset(T0 + 301, min_gpu_budget=16))
    assert state.rejected_controls == 1 and state.config.min_gpu_budget != 16
    assert {r: m.to_state() for r, m in state.perf.items()} == perf


def test_intake_judges_which_control_may_name_a_perf_models_field():
    config = config_from_dict({"max_num_seqs": 256})
    assert change_problem(config, {"max_num_seqs": 128}, "reset_perf") is None
    # set_config may not name one at all, not even restating it: a reset_perf read but not yet
    # folded may have changed it, and intake must not depend on the order records are read in
    for value in (128, 256):
        problem = change_problem(config, {"max_num_seqs": value})
        assert problem is not None and "a reset_perf control changes it" in problem
    assert change_problem(config, {"mode": "agg"}, "reset_perf").startswith("reset_perf: mode: fixed when")
    assert change_problem(config, {"mode": config.mode}, "reset_perf") is None
    assert change_problem(config, {"bogus": 1}, "reset_perf") == "reset_perf: bogus: unknown field"


def test_it_travels_as_an_event_and_defaults_to_no_changes():
    raw = b'{"type": "control", "deployment": "d", "time": 5, "body": {"command": "reset_perf"}}'
    event = decode_event(raw)
    assert isinstance(event.body, ResetPerf) and event.body.changes == {}
    assert decode_event(encode_event(event)) == event
    assert not isinstance(event.body, SetConfig)


def test_intake_refuses_a_bucket_size_that_is_not_a_square():
    """A change wrong by itself is dead-lettered at intake, naming the field: a bucket size that
    is not a square was counted in rejected_controls at the tick instead, and the perf models
    were not rebuilt (set_config never let the field through, reset_perf does)."""
    config = config_from_dict({})
    assert (change_problem(config, {"fpm_sample_bucket_size": 26}, "reset_perf")
            == "reset_perf: fpm_sample_bucket_size must be a perfect square")
    assert change_problem(config, {"fpm_sample_bucket_size": 25}, "reset_perf") is None


def test_a_bucket_size_past_what_a_fold_can_build_is_refused():
    """Each perf model keeps a queue per bucket: reset_perf to 10^8 buckets (a square) passed
    intake and ran the worker out of memory at its tick, and again at every restart; 10^6 took
    3.6 s to build and 10 s to restore the state, at every rollback."""
    config = config_from_dict({})
    assert (change_problem(config, {"fpm_sample_bucket_size": 10**8}, "reset_perf")
            == "reset_perf: fpm_sample_bucket_size: Input should be less than or equal to 10000")
    assert change_problem(config, {"fpm_sample_bucket_size": 10_000}, "reset_perf") is None


def test_after_a_new_profile_an_audit_proves_the_decisions_after_the_restart_from_a_snapshot():
    """The profile is not on the log: a worker restarted with a new one seeds the reset's models
    from it, so an audit from the first event with the old profile diverges after the reset (and
    with the new one before it); from the state at a tick after the restart, the new one proves
    the rest (docs/planner.md)."""
    old, new = PROFILE, load_profile("h100-llama3.3-70b")
    events = sorted([*_served(T0 + 1800), _reset(T0 + 900.5)], key=lambda e: e.time)
    worker = _fleet(enable_load_scaling=False)
    seen, snapshot = [], None
    for event in events:
        if event.time > T0 + 720 and worker.planner.profile is old:
            worker.planner = Planner(worker.planner.config, profile=new)  # the restart
            snapshot = state_at_tick(worker.states["d"])  # as the worker writes one: no buffer
        seen += [r.to_dict() for r in worker.feed(event)]
    seen += [r.to_dict() for r in worker.finish()]
    reset_at = next(i for i, r in enumerate(seen) if r["time"] > T0 + 900.5)
    for profile in (old, new):
        audit = Fleet(Planner(worker.planner.config, profile=profile))
        again = [r.to_dict() for r in audit.run(events)]
        assert (again[:reset_at] == seen[:reset_at]) == (profile is old)
        assert (again[reset_at:] == seen[reset_at:]) == (profile is new)
    audit = Fleet(Planner(worker.planner.config, profile=new))
    audit.load_data({"d": snapshot})
    state = audit.states["d"]
    tail = [r.to_dict() for r in audit.run([e for e in events if e.time >= state.last_tick])]
    assert tail == seen[len(seen) - len(tail):] and tail[0]["time"] < T0 + 900.5


def test_more_fpm_samples_than_a_changelog_record_carries_are_refused():
    """The samples are the perf model's stored state (10,000 decode samples are 0.66 MB) in a
    changelog record that takes 16 MiB: reset_perf may not ask for a million."""
    config = config_from_dict({})
    assert (change_problem(config, {"max_num_fpm_samples": 10**6}, "reset_perf")
            == "reset_perf: max_num_fpm_samples: Input should be less than or equal to 10000")
    assert change_problem(config, {"max_num_fpm_samples": 10_000}, "reset_perf") is None


def test_a_reset_needing_more_samples_than_it_keeps_is_counted_and_changes_nothing():
    # 100 observations against the 64 samples kept: the rebuilt models were never ready, and
    # every tick after the reset held (model_not_ready) where it had sized the fleet
    fleet = _fleet(enable_load_scaling=False)
    fleet.run(_served(T0 + 600))
    state = fleet.states["d"]
    before = {r: m.to_state() for r, m in state.perf.items()}
    fleet.planner.apply(state, _reset(T0 + 601, load_min_observations=100))
    assert state.rejected_controls == 1 and state.config.load_min_observations == 5
    assert {r: m.to_state() for r, m in state.perf.items()} == before
