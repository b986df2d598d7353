"""The canonical order is total: events that share their identity fields still sort alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fleetplan.models.canonical import canonical_key
from fleetplan.schemas.events import ForwardPassMetrics, RequestRecord
from tests.models.factories import T0


def _request(tokens: int) -> RequestRecord:
    # a frontend that reuses one id within one timestamp: the same identity, different bodies
    return RequestRecord(deployment="d", time=T0, request_id="r-1", input_tokens=tokens, output_tokens=5,
                         request_received_ms=T0 * 1000, ttft_ms=1.0, avg_itl_ms=1.0)


def _fpm(queued: int) -> ForwardPassMetrics:
    # an engine that repeats a counter with a different body
    return ForwardPassMetrics.model_validate({"deployment": "d", "time": T0, "role": "agg", "worker_id": "w",
                                              "counter_id": 3, "queued": {"num_prefill_requests": queued}})


EVENTS = [_request(10), _request(11), _request(12), _fpm(0), _fpm(1), _fpm(2)]


@given(st.permutations(EVENTS))
def test_events_with_the_same_identity_sort_the_same_whatever_their_arrival_order(arrived):
    assert sorted(arrived, key=canonical_key) == sorted(EVENTS, key=canonical_key)


def test_identical_copies_tie_and_the_order_among_them_does_not_matter():
    a, b = _request(10), _request(10)
    assert canonical_key(a) == canonical_key(b)
