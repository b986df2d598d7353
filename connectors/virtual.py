"""The virtual backend: desired counts in Redis for an external orchestrator.

This is Dynamo's VirtualConnector protocol (etcd keys ``num_*_workers``,
``decision_id``, ``scaled_decision_id``) moved to Redis, which more
orchestrators can reach. The connector writes the desired state and waits;
the orchestrator (see :class:`fleetplan.connectors.client.RedisOrchestratorClient`)
reads it, scales its fleet and completes the decision; the connector then
acks on Kafka with what the orchestrator observed.

Layout per deployment (:class:`VirtualKeys`):

- ``{prefix}:{deployment}`` hash. Written by the connector: ``decision_id``,
  ``decision`` (the full event, JSON), ``targets`` (JSON),
  ``num_{role}_workers``, ``written_at``. Written by the orchestrator:
  ``scaled_decision_id``, ``status``, ``observed`` (JSON), ``error``,
  ``completed_at``.
- ``{prefix}:{deployment}:desired`` stream: one entry per write, so
  orchestrators can block instead of poll.
- ``{prefix}:{deployment}:completed`` stream: one entry per completion, so
  the connector can block instead of poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis

from fleetplan.connectors.base import (
    Applier,
    ApplyFailed,
    ConnectorConfigError,
    Observed,
    Superseded,
    check_seconds,
)
from fleetplan.schemas.codec import encode_event
from fleetplan.schemas.events import Decision

log = logging.getLogger("fleetplan.connector.virtual")

DEFAULT_PREFIX = "fleetplan:virtual"
STREAM_MAXLEN = 1000
STREAM_SUFFIXES = (":desired", ":completed")
"""A deployment's two streams: its state hash's key with these appended."""


@dataclass(frozen=True)
class VirtualKeys:
    """Redis key names of one deployment's virtual-connector state."""

    state: str
    desired: str
    completed: str

    @classmethod
    def of(cls, deployment: str, prefix: str = DEFAULT_PREFIX) -> VirtualKeys:
        """The keys, refused for a name whose hash key is another deployment's stream.

        Names may hold ``:``, so deployment ``x:desired`` would write its
        hash at ``x``'s desired stream (and ``x:completed`` at its completion
        stream): whichever wrote second got Redis' WRONGTYPE, retried
        without end. The layout is the orchestrators' contract, so such
        names are refused rather than the keys changed.
        """
        for suffix in STREAM_SUFFIXES:
            if deployment.endswith(suffix):
                owner = deployment[: -len(suffix)]
                raise ValueError(
                    f"deployment {deployment!r}: the virtual backend cannot key a name ending in "
                    f"{suffix!r}, whose state hash would be deployment {owner!r}'s {suffix[1:]} stream"
                )
        base = f"{prefix}:{deployment}"
        return cls(base, f"{base}{STREAM_SUFFIXES[0]}", f"{base}{STREAM_SUFFIXES[1]}")


@dataclass(frozen=True)
class Completion:
    """The orchestrator's answer, read back from the state hash."""

    decision_id: int
    status: str
    observed: dict[str, int]
    error: str | None


async def last_stream_id(client: aioredis.Redis, stream: str) -> bytes | str:
    """The id to XREAD after so that nothing added from now on is missed."""
    last = await client.xrevrange(stream, count=1)
    return last[0][0] if last else "0-0"


def _int(value: bytes | str | None, default: int = -1) -> int:
    return default if value is None else int(value)


COMPLETION_STATUSES = ("applied", "failed", "superseded")


async def read_completion(client: aioredis.Redis, keys: VirtualKeys) -> Completion | None:
    """The orchestrator's completion, checked field by field.

    The orchestrator is someone else's code, writing a documented hash. A
    ``scaled_decision_id`` or ``status`` that cannot be read makes the
    decision fail with the field named (there is no telling what was done).
    An ``observed`` count that is not a count is dropped and logged, and the
    status stands: the orchestrator said what it did, only its counts are off.
    """
    scaled, status, observed, error = (
        v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        for v in await client.hmget(keys.state, ["scaled_decision_id", "status", "observed", "error"])
    )
    if scaled is None:
        return None
    try:
        decision_id = int(scaled)
    except ValueError:
        raise ApplyFailed(f"{keys.state} scaled_decision_id: expected an integer, got {scaled!r}") from None
    status = status or "applied"
    if status not in COMPLETION_STATUSES:
        raise ApplyFailed(f"{keys.state} status: expected one of {', '.join(COMPLETION_STATUSES)}, got {status!r}")
    return Completion(decision_id, status, _observed_counts(keys.state, observed), error)


def _observed_counts(state: str, raw: str | None) -> dict[str, int]:
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        log.warning("%s observed: not JSON (%s); counts dropped", state, err)
        return {}
    if not isinstance(data, dict):
        log.warning("%s observed: expected an object of role counts, got %r; counts dropped", state, raw[:200])
        return {}
    counts = {}
    for role, value in data.items():
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            counts[role] = value
        else:
            log.warning("%s observed.%s: expected a count >= 0, got %r; dropped", state, role, value)
    return counts


# KEYS: state hash, completed stream. ARGV: decision_id, status, observed JSON, error, time.
# Completes the decision if it is still the desired one and not completed yet (1), else 0.
# The orchestrator completes with it; the connector withdraws a timed-out decision with it.
COMPLETE_SCRIPT = """
local current = redis.call('HGET', KEYS[1], 'decision_id')
if not current or tonumber(current) ~= tonumber(ARGV[1]) then return 0 end
local scaled = redis.call('HGET', KEYS[1], 'scaled_decision_id')
if scaled and tonumber(scaled) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'scaled_decision_id', ARGV[1], 'status', ARGV[2],
           'observed', ARGV[3], 'error', ARGV[4], 'completed_at', ARGV[5])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', '1000', '*', 'decision_id', ARGV[1], 'status', ARGV[2])
return 1
"""


class VirtualApplier(Applier):
    """Writes desired counts to Redis and waits for the orchestrator to complete them."""

    backend = "virtual"

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        completion_timeout_s: float = 1800.0,
        poll_s: float = 1.0,
        owns_client: bool = False,
    ) -> None:
        self._redis = client
        self._owns_client = owns_client
        self._prefix = prefix
        self._timeout = completion_timeout_s
        self._poll_ms = max(1, int(poll_s * 1000))
        self._complete = client.register_script(COMPLETE_SCRIPT)

    async def start(self) -> None:
        check_seconds("--completion-timeout", self._timeout)
        try:
            await self._redis.ping()
        except (aioredis.ConnectionError, OSError) as err:
            raise ConnectorConfigError("--redis-url", f"Redis is not reachable ({err})") from None

    async def stop(self) -> None:
        if self._owns_client:
            await self._redis.aclose()

    def describe(self) -> str:
        return f"virtual (Redis keys {self._prefix}:<deployment>)"

    async def apply(self, decision: Decision) -> Observed:
        """Write the desired state (once per decision_id) and wait for completion."""
        try:
            keys = VirtualKeys.of(decision.deployment, self._prefix)
        except ValueError as err:
            raise ApplyFailed(str(err)) from None
        after = await last_stream_id(self._redis, keys.completed)
        current = _int(await self._redis.hget(keys.state, "decision_id"))
        if current > decision.decision_id:
            raise Superseded(f"decision {current} is already the desired state")
        if current < decision.decision_id:
            await self._write(keys, decision)
        return await self._wait(keys, decision, after)

    async def recover(self, decision: Decision) -> Observed:
        """The desired state in Redis tells whether the dead run got as far as
        writing, so recovering is applying: a write happens only if none did."""
        return await self.apply(decision)

    async def _write(self, keys: VirtualKeys, decision: Decision) -> None:
        fields: dict[str, str | int | bytes] = {
            "decision_id": decision.decision_id,
            "decision": encode_event(decision),
            "targets": orjson.dumps(decision.targets),
            "written_at": f"{time.time():.3f}",
        }
        for role, count in decision.targets.items():
            fields[f"num_{role}_workers"] = count
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.state, mapping=fields)
            pipe.xadd(
                keys.desired, {"decision_id": decision.decision_id},
                maxlen=STREAM_MAXLEN, approximate=True,
            )
            await pipe.execute()

    async def _wait(self, keys: VirtualKeys, decision: Decision, after: bytes | str) -> Observed:
        deadline = time.monotonic() + self._timeout
        withdrawn = False
        while True:
            done = await read_completion(self._redis, keys)
            if done is not None and done.decision_id >= decision.decision_id:
                return self._settle(decision, done)
            current = _int(await self._redis.hget(keys.state, "decision_id"))
            if current > decision.decision_id:
                raise Superseded(f"decision {current} replaced it in Redis")
            left = deadline - time.monotonic()
            if left <= 0:
                if withdrawn:
                    # neither completed nor replaced, and the withdrawal found nothing to
                    # complete: the desired state is gone (deleted, or Redis lost its data)
                    raise ApplyFailed(
                        f"the orchestrator did not complete decision {decision.decision_id} within "
                        f"{self._timeout:g} s, and its desired state is no longer in Redis ({keys.state})"
                    )
                await self._withdraw(keys, decision)  # raises, unless the orchestrator just completed it
                withdrawn = True
                continue
            block = max(1, min(self._poll_ms, int(left * 1000)))
            got = await self._redis.xread({keys.completed: after}, block=block, count=100)
            if got:
                after = got[0][1][-1][0]
            else:
                await asyncio.sleep(0)

    async def _withdraw(self, keys: VirtualKeys, decision: Decision) -> None:
        """Complete a decision the orchestrator left too long as failed, in Redis too.

        The ack will say ``failed``, so the desired state must stop being
        due: an orchestrator acting on it later would move the fleet while
        the planner counts the old one. Its ``complete`` for it then returns
        False. If it completed (or a newer decision replaced it) in the
        meantime, nothing is written and the caller reads what happened.
        """
        error = (f"the orchestrator did not complete decision {decision.decision_id} "
                 f"within {self._timeout:g} s; withdrawn")
        written = await self._complete(
            keys=[keys.state, keys.completed],
            args=[decision.decision_id, "failed", "{}", error, f"{time.time():.3f}"],
        )
        if written:
            raise ApplyFailed(error)

    @staticmethod
    def _settle(decision: Decision, done: Completion) -> Observed:
        if done.decision_id > decision.decision_id:
            raise Superseded(f"the orchestrator completed decision {done.decision_id} instead")
        if done.status == "failed":
            raise ApplyFailed(done.error or "the orchestrator reported failure")
        if done.status == "superseded":
            raise Superseded(done.error or "the orchestrator superseded it")
        return done.observed or dict(decision.targets)
