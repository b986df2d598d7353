"""Each closed throughput window's observation against a count made directly from the events.

The core counts a window's traffic as sums folded one event at a time; here the same windows
are counted from the whole event list: the requests that arrived in ``[tick - interval, tick)``
once the deployment sends arrivals (their mean ISL; the mean OSL of those that finished in it,
else the one the last window with requests measured), else those that finished in it. The events fall on half seconds, so
many sit exactly on a window's boundary; requests finish up to five minutes after they arrive
(some after the run, so never), some finish without an arrival event, and request ids repeat.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetplan.schemas import ClockEvent, RequestArrival, RequestRecord
from tests.models.factories import T0

INTERVAL = 60
WINDOWS = 4
END = T0 + WINDOWS * INTERVAL

_request = st.tuples(
    st.sampled_from(["both", "arrival_only", "finish_only"]),
    st.integers(1, 2 * WINDOWS * INTERVAL - 1),  # arrival, in half seconds from T0
    st.sampled_from([0, 1, 2, 119, 120, 121, 240, 600]),  # time to finish, in half seconds
    st.integers(1, 8000),  # ISL
    st.integers(1, 900),  # OSL
    st.integers(0, 5),  # request id: a few, so ids repeat
)


def _events(requests, by_arrival: bool) -> list:
    """The log: an opening request at the run's start (so no window is partial and an OSL is
    known), then each drawn request's arrival event (when the deployment sends them) and record
    (when it finishes before the run's end)."""
    evs: list = [RequestRecord(deployment="d", time=T0 + 0.5, request_id="open", input_tokens=1000,
                               output_tokens=100, request_received_ms=(T0 + 0.25) * 1000)]
    if by_arrival:
        evs.append(RequestArrival(deployment="d", time=T0 + 0.25, request_id="open", input_tokens=1000))
    for kind, arrive, takes, isl, osl, rid in requests:
        at, done = T0 + arrive / 2, T0 + (arrive + takes) / 2
        if by_arrival and kind != "finish_only":
            evs.append(RequestArrival(deployment="d", time=at, request_id=f"r{rid}", input_tokens=isl))
        if kind != "arrival_only" and done < END:
            evs.append(RequestRecord(deployment="d", time=done, request_id=f"r{rid}", input_tokens=isl,
                                     output_tokens=osl, request_received_ms=at * 1000))
    return sorted(evs, key=lambda e: e.time)


def _expected(events, by_arrival: bool) -> list[tuple[float, float, float]]:
    """(num_req, isl, osl) of each window, counted from the events directly."""
    out, last_osl = [], None
    for k in range(WINDOWS):
        lo, hi = T0 + k * INTERVAL, T0 + (k + 1) * INTERVAL
        inside = [e for e in events if lo <= e.time < hi]
        finished = [e for e in inside if e.type == "request"]
        counted = [e for e in inside if e.type == "arrival"] if by_arrival else finished
        n = len(counted)
        isl = sum(e.input_tokens for e in counted) / n if n else 0.0
        osl = sum(e.output_tokens for e in finished) / len(finished) if finished else None
        if osl is None:
            osl = last_osl if by_arrival and last_osl is not None else 0.0
        if n and finished:
            last_osl = osl  # carried from the last window fed with requests (the forecaster's)
        out.append((float(n), isl, osl))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_request, max_size=40), st.booleans())
def test_each_window_counts_its_requests_once(make_fleet, requests, by_arrival):
    events = _events(requests, by_arrival)
    fleet = make_fleet(throughput_adjustment_interval_seconds=INTERVAL, enable_load_scaling=False)
    out = fleet.run([*events, ClockEvent(deployment="d", time=END + 5)])
    observed = [(o.observed.num_req, o.observed.isl, o.observed.osl) for o in out
                if getattr(o, "observed", None) is not None]
    expected = _expected(events, by_arrival)
    assert len(observed) == WINDOWS
    for k, (got, want) in enumerate(zip(observed, expected, strict=True)):
        assert got == pytest.approx(want, rel=1e-9), f"window {k}"
