"""The idempotency ledger: each decision is applied at most once, per deployment.

Kafka delivers a decision at least once (offsets are committed after the
ack), and a connector can be killed at any instruction. The ledger in Redis
closes the gap. Before applying, the connector *claims* the decision; after,
it *records* the outcome; after the ack is on the topic, it marks it *acked*.
Redelivery then finds one of:

- an outcome: the ack is (re)sent from it, nothing is applied;
- a claim with no outcome, by this claimant or one whose lease ran out:
  the run died mid-apply; the claim is taken over and the backend's
  ``recover`` settles it without applying blindly. If the claim is this
  very run's (its reply was lost to a Redis error and the caller asked
  again), the answer is ``reclaim``: the caller knows whether it applied;
- a live claim by another claimant (its lease not run out) on this
  decision or an older one: another connector is applying it right now (a
  rebalance handed the partition over mid-apply); ``busy``, so the caller
  waits and asks again, and then finds the outcome. This holds for
  skipping a decision as superseded too: two connectors never change one
  deployment at once;
- a newer claimed decision: this one is stale and acked ``superseded``.

A claimant renews its lease (``claimed_at``) while it applies, so a slow
apply (a rollout that takes minutes) is not taken for a dead one. Every
step is one Lua script on one key, so two connectors racing over a
rebalance cannot both claim a decision, and neither can take the other's
live claim for a dead one. Layout, one hash per deployment
(``{prefix}:{deployment}``): ``newest`` (highest decision_id claimed),
``claimed`` / ``claimed_by`` / ``claimed_at``, ``outcome:{id}`` (JSON) and
``acked:{id}``. Outcomes more than ``keep`` ids below the newest are trimmed as new ones land.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Literal

import orjson
import redis.asyncio as aioredis

from fleetplan.schemas.events import AckStatus, Decision

Verdict = Literal["apply", "recover", "reclaim", "busy", "superseded", "done"]

DEFAULT_PREFIX = "fleetplan:ledger"
DEFAULT_LEASE_S = 30.0
"""How long a claim outlives its claimant's last renewal before another may take it over."""


@dataclass(frozen=True)
class Outcome:
    """What became of a decision: the content of its ack."""

    status: AckStatus
    observed: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> bytes:
        return orjson.dumps({"status": self.status, "observed": self.observed, "error": self.error})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Outcome:
        data = orjson.loads(raw)
        return cls(data["status"], dict(data.get("observed") or {}), data.get("error"))


@dataclass(frozen=True)
class Entry:
    """The ledger's answer to "may I apply this decision?"."""

    verdict: Verdict
    outcome: Outcome | None = None
    acked: bool = False


# The scripts read the time from Redis (TIME), so connectors on hosts whose clocks disagree
# still agree on whose lease ran out.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

# Whether another claimant holds a claim whose lease is still live (on any decision: while
# it applies one, no other connector may apply or skip past it).
_FOREIGN_LIVE_CLAIM = """
local function foreign_live_claim(claimant, lease)
  local holder = redis.call('HGET', KEYS[1], 'claimed_by')
  if not holder or holder == claimant then return false end
  local since = tonumber(redis.call('HGET', KEYS[1], 'claimed_at') or '0')
  return now - since < tonumber(lease)
end
"""

# Outcomes more than ``keep`` ids below the newest are trimmed, every id up to there from the
# last one trimmed (``trimmed``), a thousand at most a call: trimming only the id ``keep`` below
# each outcome stored left for good the ids above an advisory decision (never in the ledger)
# and those stored superseded by _BEGIN. An id at or below ``trimmed`` gets no outcome stored:
# it is older than the newest, so it is superseded whenever it is asked about again.
_TRIM = """
local function trim(keep)
  local floor = tonumber(redis.call('HGET', KEYS[1], 'newest') or '-1') - tonumber(keep)
  local done = tonumber(redis.call('HGET', KEYS[1], 'trimmed') or '-1')
  local upto = math.min(floor, done + 1000)
  for k = done + 1, upto do redis.call('HDEL', KEYS[1], 'outcome:' .. k, 'acked:' .. k) end
  if upto > done then redis.call('HSET', KEYS[1], 'trimmed', upto) end
end
local function trimmed(id)
  return id <= tonumber(redis.call('HGET', KEYS[1], 'trimmed') or '-1')
end
"""

# Stores the outcome ``outcome`` of decision ``id_s`` (locals set by the caller): the claim on
# it is released, ``newest`` kept, and old outcomes trimmed.
_STORE_OUTCOME = """
if not trimmed(tonumber(id_s)) then redis.call('HSET', KEYS[1], 'outcome:' .. id_s, outcome) end
if redis.call('HGET', KEYS[1], 'claimed') == id_s then
  redis.call('HDEL', KEYS[1], 'claimed', 'claimed_by', 'claimed_run', 'claimed_at')
end
local newest = tonumber(redis.call('HGET', KEYS[1], 'newest') or '-1')
if tonumber(id_s) > newest then redis.call('HSET', KEYS[1], 'newest', id_s) end
trim(keep)
"""

# KEYS[1] ledger hash. ARGV: id, claimant, superseded-outcome JSON, lease seconds, run.
_BEGIN = _NOW + _FOREIGN_LIVE_CLAIM + _TRIM + """
local id = tonumber(ARGV[1])
local out = redis.call('HGET', KEYS[1], 'outcome:' .. ARGV[1])
if out then
  local acked = redis.call('HEXISTS', KEYS[1], 'acked:' .. ARGV[1])
  return {'done', out, acked}
end
local newest = tonumber(redis.call('HGET', KEYS[1], 'newest') or '-1')
if newest > id then
  if not trimmed(id) then redis.call('HSET', KEYS[1], 'outcome:' .. ARGV[1], ARGV[3]) end
  return {'superseded', ARGV[3], 0}
end
local claimed = redis.call('HGET', KEYS[1], 'claimed')
if claimed and foreign_live_claim(ARGV[2], ARGV[4]) then
  return {'busy', '', 0}
end
local verdict = 'apply'
if claimed and tonumber(claimed) == id then
  -- this very run claimed it before (the reply was lost): the caller knows whether it applied
  if redis.call('HGET', KEYS[1], 'claimed_run') == ARGV[5] then verdict = 'reclaim'
  else verdict = 'recover' end
end
redis.call('HSET', KEYS[1], 'newest', ARGV[1], 'claimed', ARGV[1], 'claimed_by', ARGV[2],
           'claimed_run', ARGV[5], 'claimed_at', string.format('%.3f', now))
return {verdict, '', 0}
"""

# KEYS[1] ledger hash. ARGV: id, claimant, superseded-outcome JSON, lease seconds, keep.
# An outcome recorded earlier wins; a live claim of another connector (on this decision or
# an older one it is still applying) makes the caller wait.
_SUPERSEDE = _NOW + _FOREIGN_LIVE_CLAIM + _TRIM + """
local id_s, outcome, keep = ARGV[1], ARGV[3], ARGV[5]
local out = redis.call('HGET', KEYS[1], 'outcome:' .. id_s)
if out then
  return {'done', out, redis.call('HEXISTS', KEYS[1], 'acked:' .. id_s)}
end
if redis.call('HEXISTS', KEYS[1], 'claimed') == 1 and foreign_live_claim(ARGV[2], ARGV[4]) then
  return {'busy', '', 0}
end
""" + _STORE_OUTCOME + """
return {'superseded', outcome, 0}
"""

# KEYS[1] ledger hash. ARGV: id, claimant. Renews the lease if the claim is still ours.
_RENEW = _NOW + """
if redis.call('HGET', KEYS[1], 'claimed') == ARGV[1] and redis.call('HGET', KEYS[1], 'claimed_by') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'claimed_at', string.format('%.3f', now))
  return 1
end
return 0
"""

# KEYS[1] ledger hash. ARGV: id, outcome JSON, keep. The first outcome wins.
_RECORD = _TRIM + """
local id_s, outcome, keep = ARGV[1], ARGV[2], ARGV[3]
local existing = redis.call('HGET', KEYS[1], 'outcome:' .. id_s)
if existing then return existing end
""" + _STORE_OUTCOME + """
return outcome
"""


def connect(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """A Redis client whose pool waits for a free connection instead of failing.

    Every deployment lane talks to Redis at once; a plain pool would open one
    connection per lane, or refuse with "Too many connections" past its limit.
    """
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=max_connections, timeout=None)
    return aioredis.Redis(connection_pool=pool)


class Ledger:
    """Per-deployment claim/outcome/ack records in Redis (see the module docstring)."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        claimant: str = "connector",
        keep: int = 1000,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s!r}")
        self._redis = client
        self._prefix = prefix
        self._claimant = claimant
        # this process's run: a claim it made itself whose reply was lost (a Redis blip) is
        # told apart from one a dead run left behind under the same claimant name
        self._run = uuid.uuid4().hex
        self._keep = keep
        self.lease_s = lease_s
        self._begin = client.register_script(_BEGIN)
        self._record = client.register_script(_RECORD)
        self._renew = client.register_script(_RENEW)
        self._supersede = client.register_script(_SUPERSEDE)

    def key(self, deployment: str) -> str:
        return f"{self._prefix}:{deployment}"

    async def begin(self, decision: Decision) -> Entry:
        """Claim ``decision`` for applying, or say why not."""
        stale = Outcome(
            "superseded", {}, f"a newer decision than {decision.decision_id} was already taken"
        )
        verdict, raw, acked = await self._begin(
            keys=[self.key(decision.deployment)],
            args=[decision.decision_id, self._claimant, stale.to_json(), self.lease_s, self._run],
        )
        verdict = _text(verdict)
        outcome = Outcome.from_json(raw) if raw else None
        return Entry(verdict, outcome, bool(acked))

    async def renew(self, decision: Decision) -> bool:
        """Extend this claimant's lease on ``decision``; False if the claim is no longer its own."""
        return bool(await self._renew(
            keys=[self.key(decision.deployment)],
            args=[decision.decision_id, self._claimant],
        ))

    async def record(self, decision: Decision, outcome: Outcome) -> Outcome:
        """Store the outcome; if one was already stored (a racing run), return that one."""
        raw = await self._record(
            keys=[self.key(decision.deployment)],
            args=[decision.decision_id, outcome.to_json(), self._keep],
        )
        return Outcome.from_json(raw)

    async def supersede(self, decision: Decision, newer_id: int) -> Entry:
        """Skip ``decision`` because ``newer_id`` is already waiting behind it.

        An outcome recorded earlier wins (its ack may just not have gone
        out); ``busy`` while another connector's claim is live, since it may
        be applying this decision or an older one right now, and skipping
        ahead would let two connectors change one deployment at once.
        """
        outcome = Outcome("superseded", {}, f"decision {newer_id} supersedes it")
        verdict, raw, acked = await self._supersede(
            keys=[self.key(decision.deployment)],
            args=[decision.decision_id, self._claimant, outcome.to_json(), self.lease_s, self._keep],
        )
        return Entry(_text(verdict), Outcome.from_json(raw) if raw else None, bool(acked))

    async def mark_acked(self, decision: Decision) -> None:
        await self._redis.hset(self.key(decision.deployment), f"acked:{decision.decision_id}", 1)

    async def snapshot(self, deployment: str) -> dict[str, str]:
        """The raw hash, for operators and tests."""
        raw = await self._redis.hgetall(self.key(deployment))
        return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
