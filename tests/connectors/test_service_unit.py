"""The connector's routing of decision records, in process (no broker, no Redis)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from fleetplan.connectors.log import LogApplier
from fleetplan.connectors.metrics import ConnectorMetrics
from fleetplan.connectors.worker import (
    ConnectorService,
    ServiceSettings,
    _PartitionOffsets,
    _Ticket,
)
from fleetplan.schemas import topics
from fleetplan.schemas.codec import encode_event
from tests.connectors.conftest import make_decision


async def test_decisions_of_other_deployments_are_committed_past_with_one_warning(caplog):
    """Skipping them moves the commit on, so a connector serving them must not share the group."""
    metrics = ConnectorMetrics("log")
    service = ConnectorService(LogApplier(), ledger=None, metrics=metrics,
                               settings=ServiceSettings("unused:1", deployments=frozenset({"llama"})))
    offsets = _PartitionOffsets()
    with caplog.at_level(logging.WARNING, logger="fleetplan.connector"):
        for offset in (4, 5):
            offsets.add(offset)
            service._inflight += 1
            record = SimpleNamespace(value=encode_event(make_decision("mistral", offset)), key=b"mistral",
                                     topic=topics.DECISIONS, partition=0, offset=offset)
            await service._route(record, _Ticket(offsets, offset, service))
    assert offsets.inflight == set() and not service._lanes
    assert metrics.registry.get_sample_value(
        "fleetplan_connector_decisions_total", {"backend": "log", "outcome": "ignored"}) == 2
    warnings = [r.getMessage() for r in caplog.records if "mistral" in r.getMessage()]
    assert len(warnings) == 1 and "--group-id" in warnings[0]
