"""What a decision applier is: the small interface every backend implements.

A backend (Kubernetes, the Redis-backed virtual orchestrator, log-only) is
one small file with one class. The connector service owns everything else
(consuming decisions, the idempotency ledger, acks, metrics), so a backend
only has to say how a target becomes real and what it observed.

The lifecycle is ``start`` (validate configuration and target, fail fast),
``apply`` / ``recover`` per decision, ``stop``. ``apply`` either returns the
observed replica counts or raises one of the exceptions below, which the
service turns into an ack status.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import ClassVar

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

from fleetplan.schemas.events import Decision, Role

Observed = dict[Role, int]
"""Replica counts per role, as the backend saw them after applying."""


class ConnectorConfigError(ValueError):
    """A configuration problem found at start. ``field`` names the option to fix."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def check_seconds(option: str, value: float) -> None:
    """Refuse a duration that is not a positive finite number of seconds, naming its option.

    NaN passes a plain ``<= 0`` test and would make a wait endless or fail
    every decision later with a message that names no option.
    """
    if not (math.isfinite(value) and value > 0):
        raise ConnectorConfigError(option, f"must be a positive number of seconds, got {value}")


class ApplyFailed(Exception):
    """The decision was not (or not fully) applied; it is acked ``failed`` with this message."""


class Superseded(Exception):
    """A newer decision took over while this one was being applied; acked ``superseded``."""


class InDoubt(ApplyFailed):
    """A previous run may have applied the decision before it died, and the backend
    cannot tell. It is not applied again (at most once wins over at least once)."""


class Applier(abc.ABC):
    """Turns one decision into replica changes on some backend.

    ``apply`` must be safe to call for decisions of different deployments
    concurrently; the service never calls it twice at once for one deployment.
    """

    backend: ClassVar[str]
    """The ``--backend`` name."""

    async def start(self) -> None:
        """Check configuration and the target (e.g. that services exist).

        Raise :class:`ConnectorConfigError` so that a bad setup stops the
        connector before it consumes a single decision.
        """
        return None

    @abc.abstractmethod
    async def apply(self, decision: Decision) -> Observed:
        """Make ``decision.targets`` real and return what was observed."""

    async def recover(self, decision: Decision) -> Observed:
        """Settle a decision that a killed run had claimed but not recorded.

        The previous run may or may not have applied it. Backends that can
        tell (for example by reading back the state they write) override
        this; the default refuses to guess and never re-applies.
        """
        raise InDoubt(
            f"decision {decision.decision_id} may have been applied by a run that died; "
            f"not applied again"
        )

    async def stop(self) -> None:
        """Release clients and connections."""
        return None

    def describe(self) -> str:
        """One line for the startup log."""
        return self.backend


class HandOver(ConsumerRebalanceListener):
    """Routes aiokafka's rebalance callbacks to a consumer of the decision topic.

    ``on_revoked`` runs before the group moves the partitions, while they are
    still assigned: the place to commit what is done on them and to drop what
    is queued for them (the connector service and the Kafka orchestrator
    client both do).
    """

    def __init__(self, on_revoked: Callable[[set[TopicPartition]], Awaitable[None]], log: logging.Logger) -> None:
        self._on_revoked = on_revoked
        self._log = log

    async def on_partitions_revoked(self, revoked) -> None:
        await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        self._log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))


MAX_ACK_ERROR = 2000
"""Characters of an ack's ``error`` kept. An orchestrator's or API server's message can be
a whole stack trace; an ack over the broker's message size would be refused and retried
forever, holding up its deployment's lane."""


def ack_error(error: str | None) -> str | None:
    """``error`` cut to ``MAX_ACK_ERROR`` characters, saying how much was cut."""
    if error is None or len(error) <= MAX_ACK_ERROR:
        return error
    return f"{error[:MAX_ACK_ERROR]}... ({len(error) - MAX_ACK_ERROR} more characters)"


TOPIC_POLL_S = 2.0
"""Seconds between two looks for a topic that does not exist yet (``wait_for_topic``)."""

TOPIC_REMIND_S = 60.0
"""Seconds between two log lines saying the wait goes on."""


async def topic_exists(bootstrap: str, topic: str) -> bool:
    """Whether ``topic`` exists, asked without creating it (streams/topics.py lists, never describes a missing one)."""
    from fleetplan.streams.topics import partition_counts

    return topic in await partition_counts(bootstrap, [topic])


async def wait_for_topic(topic: str, exists: Callable[[], Awaitable[bool]], log: logging.Logger, *,
                         poll_s: float = TOPIC_POLL_S, remind_s: float = TOPIC_REMIND_S) -> None:
    """Return once ``exists()`` says ``topic`` is there; say in the log why a start waits.

    The decision topic is created by ``fleetplan worker`` and ``fleetplan
    bridge`` with the installation's partition count (streams/topics.py).
    A consumer that subscribes before then either has the broker create it
    with its default count when auto-creation is on (and the worker and the
    bridge then stop on the mismatch), or, with auto-creation off, hears of
    the topic only at its next metadata refresh, up to five minutes after
    it was created. So it subscribes only once the topic exists.
    """
    waited = 0.0
    remind_at = 0.0
    while not await exists():
        if waited >= remind_at:
            log.warning("topic %s does not exist yet: waiting for fleetplan worker or bridge to create it "
                        "(looking every %g s)", topic, poll_s)
            remind_at += remind_s
        await asyncio.sleep(poll_s)
        waited += poll_s
    if waited:
        log.info("topic %s exists: subscribing", topic)
