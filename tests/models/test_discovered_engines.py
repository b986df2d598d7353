"""Engines known only from their FPMs are forgotten when their FPMs stop.

Without inventory events nothing says an engine left: before 2026-12-05 one
scaled away stayed counted as ready, with its last FPM, for good, and a
fleet that replaced its engines grew the stored state without bound.
"""

from __future__ import annotations

import orjson

from fleetplan.models.config import config_from_dict
from fleetplan.models.fleet import Fleet
from fleetplan.models.planner import Planner
from fleetplan.models.state import DeploymentState
from tests.models.factories import T0, fpm, ready

TTL = 600.0


def _fleet(ttl: float = TTL) -> Fleet:
    return Fleet(Planner(config_from_dict({"max_gpu_budget": 64, "discovered_engine_ttl_seconds": ttl})))


def _churn(fleet: Fleet, minutes: int) -> None:
    """Two prefill and one decode engine alive at a time, each replaced every minute,
    then the tick at the end of the last minute (ticks every 180 s)."""
    for m in range(minutes):
        t = T0 + 60 * m
        events = []
        for s in range(0, 60, 5):
            events += [fpm(f"p{m}a", "prefill", t + s + 0.5), fpm(f"p{m}b", "prefill", t + s + 0.6),
                       fpm(f"d{m}", "decode", t + s + 0.7, decode_reqs=1, decode_kv=100)]
        fleet.run(events)
    end = T0 + 60 * minutes
    fleet.run([fpm("tail", "decode", end + 0.5), fpm("tail", "decode", end + 5)])
    assert fleet.state("d").last_tick == end


def test_engines_replaced_without_inventory_are_forgotten_after_the_ttl():
    fleet = _fleet()
    _churn(fleet, 60)
    state = fleet.state("d")
    counts = {role: sum(1 for w in state.workers.values() if w.role == role) for role in ("prefill", "decode")}
    # at the tick of 3,600 s: the engines whose last FPM (at 55.7 s into their minute)
    # is at most 600 s old, those of minutes 50-59
    assert counts == {"prefill": 2 * 10, "decode": 10}
    assert len(state.latest_fpm) == 30
    assert all(f"{w}/0" in state.latest_fpm for w in state.workers)


def test_a_ttl_of_zero_keeps_them_as_before():
    fleet = _fleet(ttl=0)
    _churn(fleet, 21)
    assert len(fleet.state("d").workers) == 63


def test_an_engine_named_by_inventory_is_kept_and_a_silent_one_comes_back_with_its_next_fpm():
    fleet = _fleet()
    fleet.run([ready("known", "prefill"), fpm("known", "prefill", T0 + 1), fpm("quiet", "prefill", T0 + 1)])
    fleet.run([fpm("busy", "decode", T0 + s) for s in range(5, 1200, 5)])
    state = fleet.state("d")
    assert state.last_tick == T0 + 1080
    assert "known" in state.workers and not state.workers["known"].discovered
    assert "quiet" not in state.workers and "quiet/0" not in state.latest_fpm
    fleet.run([fpm("quiet", "prefill", T0 + 1205), *[fpm("busy", "decode", T0 + s) for s in range(1200, 1450, 5)]])
    assert state.workers["quiet"].state == "ready" and state.workers["quiet"].discovered


def test_the_discovered_flag_round_trips_and_older_states_load():
    fleet = _fleet()
    fleet.run([ready("known", "prefill"), fpm("seen", "decode", T0 + 1), fpm("known", "prefill", T0 + 2),
               fpm("seen", "decode", T0 + 185)])
    state = fleet.state("d")
    data = orjson.loads(orjson.dumps(state.to_data()))
    assert data["workers"]["known"] == ["prefill", "ready", 1, T0 + 0.1]  # unchanged form
    assert data["workers"]["seen"][4] is True
    back = DeploymentState.from_data(data)
    assert back.workers == state.workers
    assert orjson.dumps(back.to_data()) == orjson.dumps(state.to_data())
