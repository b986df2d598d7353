"""Event schemas, codecs and topic names: the contract between all parts."""

from fleetplan.schemas.codec import (
    MAX_EVENT_BYTES,
    SchemaError,
    decode_dict,
    decode_event,
    encode_event,
    encode_lines,
    event_to_dict,
)
from fleetplan.schemas.events import (
    ROLES,
    Ack,
    ClockEvent,
    ControlEvent,
    DeadLetter,
    Decision,
    Event,
    ForwardPassMetrics,
    FpmBatch,
    InventoryEvent,
    PredictedLoad,
    QueuedRequests,
    RequestArrival,
    RequestRecord,
    ResetPerf,
    Role,
    RoleEstimate,
    ScheduledRequests,
    SeedTraffic,
    SeedWindow,
    SetAdvisory,
    SetConfig,
    SetMinEndpoints,
)

__all__ = [
    "MAX_EVENT_BYTES", "ROLES", "Ack", "ClockEvent", "ControlEvent", "DeadLetter", "Decision",
    "Event", "FpmBatch", "ForwardPassMetrics", "InventoryEvent", "PredictedLoad",
    "QueuedRequests", "RequestArrival", "RequestRecord", "ResetPerf", "Role", "RoleEstimate", "ScheduledRequests",
    "SchemaError", "SeedTraffic", "SeedWindow", "SetAdvisory", "SetConfig", "SetMinEndpoints", "decode_dict", "decode_event",
    "encode_event", "encode_lines", "event_to_dict",
]
