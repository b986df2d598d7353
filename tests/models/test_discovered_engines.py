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


# --- beyond the decided count: a scale-down's engines go quiet --------------------------------


def _scaled_down_to(fleet: Fleet, prefill: int, t: float) -> None:
    """The connector's applied ack of a decision to ``prefill`` engines, folded at ``t``."""
    from fleetplan.models.state import PendingDecision
    from tests.models.factories import ack

    state = fleet.state("d")
    state.pending = PendingDecision(state.next_decision_id, t - 1, {"prefill": prefill, "decode": 1})
    state.next_decision_id += 1
    fleet.run([ack(state.pending.decision_id, t)])


def _busy(workers, start: float, end: float):
    """A pass a second from each engine (``p*`` prefill, ``d*`` decode)."""
    return [fpm(w, "prefill" if w.startswith("p") else "decode", t)
            for t in range(int(start), int(end)) for w in workers]


def test_an_engine_beyond_the_decided_count_that_went_quiet_is_forgotten():
    fleet = _fleet()
    fleet.run(_busy(["p0", "p1", "p2", "d0"], T0 + 1, T0 + 60))
    _scaled_down_to(fleet, 2, T0 + 60)
    # p2 was scaled away: its FPMs stop at 59 s, the others keep passing
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 60, T0 + 200))
    state = fleet.state("d")
    assert state.last_tick == T0 + 180 and state.desired == {"prefill": 2, "decode": 1}
    assert sorted(w for w, v in state.workers.items() if v.role == "prefill") == ["p0", "p1"]
    assert "p2/0" not in state.latest_fpm  # the load loop no longer averages its last pass


def test_a_quiet_engine_is_kept_while_the_count_allows_it_or_its_silence_is_short():
    fleet = _fleet()
    fleet.run(_busy(["p0", "p1", "p2", "d0"], T0 + 1, T0 + 60))
    _scaled_down_to(fleet, 3, T0 + 60)
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 60, T0 + 200))  # p2 idle: 3 engines are decided
    state = fleet.state("d")
    assert "p2" in state.workers
    # decided down to 2, but the tick comes 21 s after p2's last pass: too soon to call it gone
    fleet.run(_busy(["p0", "p1", "p2", "d0"], T0 + 200, T0 + 340))
    _scaled_down_to(fleet, 2, T0 + 340)
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 340, T0 + 362))
    assert state.last_tick == T0 + 360 and "p2" in state.workers


def test_with_inventory_its_gone_events_say_who_left_and_quiet_engines_stay():
    fleet = _fleet()
    fleet.run([ready("p0", "prefill"), *_busy(["p0", "p1", "p2", "d0"], T0 + 1, T0 + 60)])
    _scaled_down_to(fleet, 2, T0 + 60)
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 60, T0 + 200))
    assert fleet.state("d").inventory_seen and "p2" in fleet.state("d").workers


def test_an_idle_engine_is_kept_while_a_scale_up_brings_its_new_engines():
    """A scale-up's engines serve before its ack: they are not a scale-down's leftovers.

    Counted against the last applied decision alone, the first new engine to
    serve made the role look one too many, and an idle engine that never left
    was forgotten (from the load loop's averages and the tick's ready count)
    until it passed again, with no engine gone at all.
    """
    from fleetplan.models.state import PendingDecision

    fleet = _fleet()
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 1, T0 + 60))
    _scaled_down_to(fleet, 2, T0 + 60)
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 60, T0 + 185))
    state = fleet.state("d")
    assert state.desired == {"prefill": 2, "decode": 1} and state.pending is None
    state.pending = PendingDecision(state.next_decision_id, T0 + 181, {"prefill": 4, "decode": 1})
    state.next_decision_id += 1
    # p0 idles from 200 s; p2, the first engine of the scale-up, serves from 250 s; p3 is starting
    events = [*_busy(["p0"], T0 + 185, T0 + 200), *_busy(["p1", "d0"], T0 + 185, T0 + 380),
              *_busy(["p2"], T0 + 250, T0 + 380)]
    fleet.run(sorted(events, key=lambda e: e.time))
    assert state.last_tick == T0 + 360 and state.pending is not None
    assert sorted(w for w, v in state.workers.items() if v.role == "prefill") == ["p0", "p1", "p2"]


def test_an_attention_dp_worker_is_as_recent_as_its_latest_rank():
    """A worker reports one FPM per attention-DP rank; one rank idle (its one heartbeat, then
    nothing) while another serves is a live worker, not the silent one a scale-down left."""
    fleet = _fleet()
    rank1 = fpm("p0", "prefill", T0 + 1).model_copy(update={"dp_rank": 1})
    fleet.run([rank1, *_busy(["p0", "p1", "p2", "d0"], T0 + 1, T0 + 60)])
    _scaled_down_to(fleet, 2, T0 + 60)
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 60, T0 + 200))  # p2 was released; p0's rank 1 idles
    state = fleet.state("d")
    assert state.last_tick == T0 + 180
    assert sorted(w for w, v in state.workers.items() if v.role == "prefill") == ["p0", "p1"]


def test_a_pending_scale_down_does_not_count_an_engine_gone_before_its_ack():
    """A pending decision counts where it asks for more (docs: forget_silent_engines); one asking
    for fewer is not applied yet, so the engines the last applied decision asked for are kept."""
    from fleetplan.models.state import PendingDecision

    fleet = _fleet()
    fleet.run(_busy(["p0", "p1", "p2", "d0"], T0 + 1, T0 + 60))
    _scaled_down_to(fleet, 3, T0 + 60)
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 60, T0 + 185))  # p2 idle from 60 s, 3 engines applied
    state = fleet.state("d")
    assert state.desired == {"prefill": 3, "decode": 1} and "p2" in state.workers
    state.pending = PendingDecision(state.next_decision_id, T0 + 185, {"prefill": 2, "decode": 1})
    state.next_decision_id += 1
    fleet.run(_busy(["p0", "p1", "d0"], T0 + 185, T0 + 380))
    assert state.last_tick == T0 + 360 and state.pending is not None
    assert "p2" in state.workers


def test_a_gone_engines_last_fpm_does_not_bring_it_back():
    """An inventory ``gone`` forgot the engine; its FPM dated at (or after) that time then found
    no worker and discovered it again: a ready engine for a day, counted in the role's ready
    engines, never pruned where inventory is written. Its FPMs are refused while its gone is
    remembered, and an inventory ready of the same id (a restart) takes it back at once."""
    fleet = _fleet()
    fleet.run([ready("p0", "prefill"), ready("p1", "prefill"), ready("d0", "decode"),
               fpm("p1", "prefill", T0 + 5), ready("p1", "prefill", T0 + 12, state="gone"),
               fpm("p1", "prefill", T0 + 12), fpm("p1", "prefill", T0 + 12.5),
               fpm("d0", "decode", T0 + 20, decode_reqs=1, decode_kv=100),
               fpm("d0", "decode", T0 + 190, decode_reqs=1, decode_kv=100)])  # past the tick at 180
    state = fleet.state("d")
    assert state.last_tick == T0 + 180
    assert "p1" not in state.workers and "p1/0" not in state.latest_fpm
    assert state.gone_workers == {"p1": T0 + 12}
    restored = DeploymentState.from_data(orjson.loads(orjson.dumps(state.to_data())))
    assert restored.gone_workers == state.gone_workers
    fleet.run([ready("p1", "prefill", T0 + 200), fpm("p1", "prefill", T0 + 201),  # restarted
               fpm("d0", "decode", T0 + 370, decode_reqs=1, decode_kv=100)])
    assert fleet.state("d").workers["p1"].state == "ready" and fleet.state("d").gone_workers == {}


def test_a_gone_engine_is_remembered_for_a_while_only():
    fleet = _fleet()
    fleet.run([ready("p0", "prefill"), ready("d0", "decode"), ready("p1", "prefill", T0 + 1, state="gone")])
    fleet.run([fpm("d0", "decode", T0 + 700 + s, decode_reqs=1, decode_kv=100) for s in range(0, 200, 5)])
    assert fleet.state("d").gone_workers == {}  # pruned at a tick more than 600 s after it
