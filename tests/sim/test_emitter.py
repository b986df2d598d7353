"""Events built without re-validation equal the validated ones, field for field."""

from __future__ import annotations

from fleetplan.schemas.codec import decode_event, encode_event
from fleetplan.sim import emitter
from fleetplan.sim.engines import SimRequest


class _Worker:
    worker_id = "prefill-3"


def _request():
    req = SimRequest(7, 1.25, 3000, 120)
    req.cached = 512
    req.prefill_start = 1.5
    req.prefill_end = 1.6
    req.first_token = 1.61
    req.end = 4.0
    req.prefill_engine = _Worker()
    return req


def events():
    sample = {"wall_time": 0.021, "counter": 99, "sched": (2, 4096, 512, 7, 9000), "queued": (3, 6000, 1, 1001)}
    return [
        emitter.fpm_event("sim", 5.0, "prefill", "prefill-3", sample),
        emitter.request_event("sim", _request()),
        emitter.inventory_event("sim", 0, "decode-1", "decode", "starting", 2, 4),
        emitter.clock_event("sim", 3),
        emitter.ack_event("sim", 130.0, 4, "applied", {"prefill": 2, "decode": 3}),
    ]


def test_trusted_events_equal_validated_ones():
    for event in events():
        again = decode_event(encode_event(event))
        assert again == event
        assert type(event).model_validate(event.model_dump()) == event
        assert encode_event(again) == encode_event(event)
