"""The idempotency ledger on the real Redis."""

from __future__ import annotations

import asyncio

import pytest

from fleetplan.connectors.ledger import Ledger, Outcome
from tests.connectors.conftest import make_decision

pytestmark = pytest.mark.redis


@pytest.fixture
def ledger(aredis, redis_key_prefix):
    return Ledger(aredis, prefix=f"{redis_key_prefix}ledger", keep=3)


async def test_claim_record_ack(ledger):
    d = make_decision(decision_id=0)
    assert (await ledger.begin(d)).verdict == "apply"
    stored = await ledger.record(d, Outcome("applied", {"prefill": 2}))
    assert stored == Outcome("applied", {"prefill": 2})
    again = await ledger.begin(d)
    assert (again.verdict, again.outcome, again.acked) == ("done", stored, False)
    await ledger.mark_acked(d)
    assert (await ledger.begin(d)).acked


async def test_a_claim_without_outcome_is_recovered_not_reapplied(aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}ledger"
    d = make_decision(decision_id=3)
    assert (await Ledger(aredis, prefix=prefix, claimant="c").begin(d)).verdict == "apply"
    # ... the connector dies here; it restarts under the same name (--instance-id) ...
    assert (await Ledger(aredis, prefix=prefix, claimant="c").begin(d)).verdict == "recover"


async def test_a_runs_own_claim_asked_again_is_a_reclaim(ledger):
    """The reply to a claim lost to a Redis error: the run asking again knows it did not apply."""
    d = make_decision(decision_id=3)
    assert (await ledger.begin(d)).verdict == "apply"
    assert (await ledger.begin(d)).verdict == "reclaim"


async def test_older_decisions_are_superseded(ledger):
    await ledger.begin(make_decision(decision_id=5))
    stale = await ledger.begin(make_decision(decision_id=4))
    assert stale.verdict == "superseded" and stale.outcome.status == "superseded"
    # Superseded is final: it is acked from the record next time.
    assert (await ledger.begin(make_decision(decision_id=4))).verdict == "done"


async def test_supersede_keeps_an_existing_outcome(ledger):
    d = make_decision(decision_id=1)
    await ledger.begin(d)
    await ledger.record(d, Outcome("applied", {"decode": 3}))
    entry = await ledger.supersede(d, newer_id=2)
    assert entry.verdict == "done" and entry.outcome.status == "applied"


async def test_first_outcome_wins(ledger):
    d = make_decision(decision_id=0)
    await ledger.begin(d)
    await ledger.record(d, Outcome("failed", {}, "in doubt"))
    assert (await ledger.record(d, Outcome("applied", {"decode": 3}))).status == "failed"


async def test_only_one_of_racing_connectors_claims(aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}ledger"
    ledgers = [Ledger(aredis, prefix=prefix, claimant=f"c{i}") for i in range(8)]
    d = make_decision(decision_id=9)
    verdicts = await asyncio.gather(*(ledger.begin(d) for ledger in ledgers))
    assert sorted(v.verdict for v in verdicts).count("apply") == 1


async def test_deployments_are_independent(ledger):
    await ledger.begin(make_decision("a", decision_id=7))
    assert (await ledger.begin(make_decision("b", decision_id=1))).verdict == "apply"


async def test_old_outcomes_are_trimmed(ledger):
    for i in range(6):
        d = make_decision(decision_id=i)
        await ledger.begin(d)
        await ledger.record(d, Outcome("applied"))
        await ledger.mark_acked(d)
    fields = await ledger.snapshot("llama")
    assert sorted(k for k in fields if k.startswith("outcome:")) == ["outcome:3", "outcome:4", "outcome:5"]
    assert fields["newest"] == "5" and "claimed" not in fields


async def test_outcomes_are_trimmed_past_ids_that_never_got_one_and_those_stored_as_superseded(ledger):
    """keep=3. An advisory decision (3) never reaches the ledger, and an older one redelivered
    after a newer began (7 after 8) is stored superseded by ``begin``: trimming only the id
    ``keep`` below each stored outcome left outcome:0 and outcome:4 in the hash for good."""
    async def applied(i):
        d = make_decision(decision_id=i)
        await ledger.begin(d)
        await ledger.record(d, Outcome("applied"))
        await ledger.mark_acked(d)

    for i in (0, 1, 2, 4, 5, 6):
        await applied(i)
    eight, seven = make_decision(decision_id=8), make_decision(decision_id=7)
    await ledger.begin(eight)
    assert (await ledger.begin(seven)).verdict == "superseded"
    await ledger.record(eight, Outcome("applied"))
    for i in range(9, 14):
        await applied(i)
    fields = await ledger.snapshot("llama")
    assert sorted(k for k in fields if k.startswith(("outcome:", "acked:"))) == [
        "acked:11", "acked:12", "acked:13", "outcome:11", "outcome:12", "outcome:13"]
    # an old decision read again after its outcome was trimmed is still told it was superseded
    assert (await ledger.begin(make_decision(decision_id=1))).verdict == "superseded"


async def test_no_decision_is_claimed_or_skipped_past_another_connectors_live_claim(aredis, redis_key_prefix):
    """A connector still applying 5 keeps a second one from skipping it and applying 6 beside it."""
    prefix = f"{redis_key_prefix}ledger"
    a, b = (Ledger(aredis, prefix=prefix, claimant=name) for name in ("a", "b"))
    five, six = make_decision(decision_id=5), make_decision(decision_id=6)
    assert (await a.begin(five)).verdict == "apply"
    assert (await b.supersede(five, newer_id=6)).verdict == "busy"
    assert (await b.begin(six)).verdict == "busy"
    assert "outcome:5" not in await b.snapshot("llama")  # a's claim is untouched
    await a.record(five, Outcome("applied", {"decode": 2}))
    after = await b.supersede(five, newer_id=6)
    assert (after.verdict, after.outcome.status) == ("done", "applied")
    assert (await b.begin(six)).verdict == "apply"


async def test_a_lapsed_claim_does_not_hold_the_next_decision(aredis, redis_key_prefix):
    prefix = f"{redis_key_prefix}ledger"
    a = Ledger(aredis, prefix=prefix, claimant="a")
    b = Ledger(aredis, prefix=prefix, claimant="b", lease_s=0.2)
    await a.begin(make_decision(decision_id=5))
    await asyncio.sleep(0.3)  # a died: its lease, as b counts it, ran out
    skipped = await b.supersede(make_decision(decision_id=5), newer_id=6)
    assert (skipped.verdict, skipped.outcome.status) == ("superseded", "superseded")
    assert (await b.begin(make_decision(decision_id=6))).verdict == "apply"


async def test_a_renewal_holds_only_the_claim_on_its_own_decision(ledger):
    """A straggling renewal for decision 5 (a run replaced under the same --instance-id) must not
    be told it still holds a claim that has moved on to 6: its apply would go on beside 6's."""
    five, six = make_decision(decision_id=5), make_decision(decision_id=6)
    await ledger.begin(five)
    assert await ledger.renew(five)
    await ledger.record(five, Outcome("applied", {"decode": 2}))
    assert not await ledger.renew(five)  # the outcome released the claim
    assert (await ledger.begin(six)).verdict == "apply"
    assert not await ledger.renew(five)
    assert await ledger.renew(six)
