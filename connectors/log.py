"""The log backend: advisory only. Decisions are written to the log, never applied.

It lets an operator watch what the planner would do on a live fleet before
giving it the keys. Each decision is acked ``failed`` with an explicit
error, because acking ``applied`` would make the planner believe the fleet
changed; run the planner with ``advisory: true`` to get no pending
decisions at all.
"""

from __future__ import annotations

import logging

import orjson

from fleetplan.connectors.base import Applier, ApplyFailed, Observed
from fleetplan.schemas.events import Decision

log = logging.getLogger("fleetplan.connector.log")

NOT_APPLIED = "log backend is advisory only: nothing was applied"


class LogApplier(Applier):
    backend = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or log

    async def apply(self, decision: Decision) -> Observed:
        self._log.info(
            "decision %s",
            orjson.dumps({
                "deployment": decision.deployment, "decision_id": decision.decision_id,
                "time": decision.time, "targets": decision.targets, "previous": decision.previous,
                "throughput_reason": decision.throughput_reason,
                "load_reason": decision.load_reason,
            }).decode(),
        )
        raise ApplyFailed(NOT_APPLIED)

    async def recover(self, decision: Decision) -> Observed:
        raise ApplyFailed(NOT_APPLIED)
