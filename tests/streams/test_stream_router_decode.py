"""The router with the fast FPM decode writes what it writes with pydantic's.

Same records, same batches: the same states in the table (bytes), the same
outputs (decisions, tick diagnostics, dead letters) and the same offsets
released, whether the records are decoded by ``decode_input`` (msgspec for
FPM records, the worker's) or by ``decode_event`` (pydantic, the reference).
With skew beyond the grace period the router rolls back what it folded ahead,
re-decoding the bytes it kept, and refuses late events.
"""

from __future__ import annotations

import pytest

from fleetplan.models import fold_ahead
from fleetplan.schemas.codec import decode_event
from fleetplan.schemas.topics import DEADLETTER
from fleetplan.streams import router
from tests.streams.test_stream_router import FPM, Log, interleaved, run
from tests.streams.traffic import T0, deciding_planner, fpm


def outcome(h):
    return h.table, h.sent, sorted(h.acked), {n: d.ahead.rollbacks for n, d in h.router.deployments.items()}


def with_invalid(log: Log) -> Log:
    """The log plus records the fast path refuses: a bad one, and one only pydantic takes."""
    good = fpm("alpha", T0 + 30.2, 7)
    bad = good.model_dump_json().replace('"wall_time":0.02', '"wall_time":-1.0')
    lax = good.model_dump_json().replace('"dp_rank":0', '"dp_rank":true')
    for value in (bad, lax):
        log.append(FPM, None, key=b"alpha", value=value.encode())
    return log


@pytest.mark.parametrize(("skew", "batch", "seed"), [(0.4, 16, 1), (8.0, 3, 2), (8.0, 40, 3), (0.4, 1, 4)])
def test_fast_decode_routes_like_pydantic(monkeypatch, skew, batch, seed):
    def log():
        return with_invalid(interleaved(["alpha", "beta"], 90, seed=seed, batch=batch, skew=skew))

    fast = run(deciding_planner(), log(), seed=seed + 10)
    monkeypatch.setattr(router, "decode_input", decode_event)
    monkeypatch.setattr(fold_ahead, "decode_input", decode_event)
    reference = run(deciding_planner(), log(), seed=seed + 10)
    assert fast.decisions() and outcome(fast) == outcome(reference)
    assert [v["detail"].split(" [at ")[0] for t, v in fast.sent if t == DEADLETTER and v["reason"] == "invalid"] == [
        "wall_time: Input should be greater than or equal to 0, got -1.0"]
    if skew > 1:
        assert any(d.ahead.rollbacks for d in fast.router.deployments.values())
