"""An orchestrator's completion is read field by field (connectors/virtual.py ``read_completion``)."""

from __future__ import annotations

import logging

import pytest

from fleetplan.connectors.base import ApplyFailed, Superseded
from fleetplan.connectors.virtual import Completion, VirtualApplier, VirtualKeys, read_completion
from tests.connectors.conftest import make_decision

pytestmark = pytest.mark.redis


@pytest.fixture
def keys(redis_key_prefix) -> VirtualKeys:
    return VirtualKeys.of("llama", f"{redis_key_prefix}virtual")


async def test_a_count_that_is_not_a_count_is_dropped_and_the_status_stands(aredis, keys, caplog):
    await aredis.hset(keys.state, mapping={"scaled_decision_id": 3, "status": "applied",
                                           "observed": '{"prefill": 2, "decode": null, "agg": -1}'})
    with caplog.at_level(logging.WARNING, logger="fleetplan.connector.virtual"):
        done = await read_completion(aredis, keys)
    assert (done.decision_id, done.status, done.observed) == (3, "applied", {"prefill": 2})
    assert "observed.decode: expected a count >= 0, got None" in caplog.text
    assert "observed.agg: expected a count >= 0, got -1" in caplog.text


@pytest.mark.parametrize(("fields", "message"), [
    ({"scaled_decision_id": "three"}, "scaled_decision_id: expected an integer, got 'three'"),
    ({"scaled_decision_id": 3, "status": "done"}, "status: expected one of applied, failed, superseded, got 'done'"),
])
async def test_an_unreadable_id_or_status_fails_the_decision_naming_the_field(aredis, keys, fields, message):
    await aredis.hset(keys.state, mapping=fields)
    with pytest.raises(ApplyFailed, match=message):
        await read_completion(aredis, keys)


async def test_no_completion_yet_and_observed_that_is_not_json(aredis, keys):
    assert await read_completion(aredis, keys) is None
    await aredis.hset(keys.state, mapping={"scaled_decision_id": 4, "observed": "{not json"})
    done = await read_completion(aredis, keys)
    assert (done.decision_id, done.status, done.observed) == (4, "applied", {})


async def test_a_count_of_zero_stands_and_a_boolean_is_not_a_count(aredis, keys):
    """A role scaled to zero reports 0, which is a count; JSON ``true`` is not one."""
    await aredis.hset(keys.state, mapping={"scaled_decision_id": 5, "status": "applied",
                                           "observed": '{"prefill": 0, "decode": true}'})
    done = await read_completion(aredis, keys)
    assert done.observed == {"prefill": 0}


def test_an_orchestrators_superseded_is_acked_superseded():
    """Its answer is the ack: ``superseded`` is not ``applied``."""
    decision = make_decision("llama", 5, prefill=2, decode=4)
    with pytest.raises(Superseded, match="a newer plan"):
        VirtualApplier._settle(decision, Completion(5, "superseded", {}, "a newer plan"))


def test_a_completion_of_a_newer_decision_supersedes_the_one_waited_on():
    """The hash names the decision the orchestrator scaled to: a newer one's completion is not this
    decision's, so it is acked superseded, not applied with the newer decision's counts and status
    (no test completed another decision than the one waited on, and dropping the check passed)."""
    decision = make_decision("llama", 5, prefill=2, decode=4)
    for status in ("applied", "failed"):
        with pytest.raises(Superseded, match="the orchestrator completed decision 6 instead"):
            VirtualApplier._settle(decision, Completion(6, status, {"prefill": 9, "decode": 9}, "its own"))


def test_an_orchestrators_applied_without_counts_reports_the_targets():
    """As docs/connectors.md says: the planner times a scale-up's startup by the counts of
    its ``applied`` ack, and an orchestrator that reports none reports the targets reached."""
    decision = make_decision("llama", 5, prefill=2, decode=4)
    assert VirtualApplier._settle(decision, Completion(5, "applied", {}, None)) == {"prefill": 2, "decode": 4}
    assert VirtualApplier._settle(decision, Completion(5, "applied", {"decode": 3}, None)) == {"decode": 3}
