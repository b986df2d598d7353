"""Every event on fleetplan's log, as pydantic v2 models.

One envelope for all of them: ``type`` (the discriminator), ``deployment``
(the partition key), ``time`` (event time in seconds since the Unix epoch,
when the thing happened, never when it arrived) and ``schema_version``.
Models are frozen and reject unknown fields, non-finite numbers and
negative counts, so anything the core sees is already well formed.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SCHEMA_VERSION = 1

Role = Literal["prefill", "decode", "agg"]
"""Engine roles: disaggregated prefill and decode pools, or one aggregated pool."""

ROLES: tuple[Role, ...] = ("prefill", "decode", "agg")

MAX_COUNT = 2**63 - 1
"""Largest count or token total accepted: a signed 64-bit integer, what JSON encoders and
Kafka consumers in other languages can carry (a bigger one could not be written to state)."""

MAX_REQUEST_TOKENS = 10_000_000
"""Most tokens one request may carry in (or out, or cached).

Ten times the 1M-token context of today's longest-context served models
and equal to the largest advertised (Llama 4 Scout, 10M): a count above it
is a unit or parsing error, not a request (10**30 overflowed the capacity
search's int64 arithmetic; 10**8 replayed as a fleet of 35 prefill engines;
an event log's 10**18 stalled the throughput loop's capacity search)."""

MAX_ACCEPT_LENGTH = 256.0
"""The most tokens a speculative decoder is taken to accept per step (drafts are a
few to a few tens of tokens). Without a bound, one record's ``accept_length`` of
1e307 made decode's capacity infinite and stopped every tick that sized it, on
every replay (until 2026-12-05)."""
AcceptLength = Annotated[float, Field(ge=1.0, le=MAX_ACCEPT_LENGTH, allow_inf_nan=False)]

MAX_PASS_SECONDS = 600.0
"""The longest forward pass accepted, in seconds. A pass of a 10M-token prompt on one slow GPU is
minutes; ten is a unit or clock error. Without a bound, one FPM's ``wall_time`` of 1e300 stayed
among the perf model's samples, estimated every TTFT at 4e301 ms and scaled prefill up on every
tick (until 2026-12-05)."""
PassSeconds = Annotated[float, Field(ge=0.0, le=MAX_PASS_SECONDS, allow_inf_nan=False)]

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Tokens = Annotated[int, Field(ge=0, le=MAX_COUNT)]
RequestTokens = Annotated[int, Field(ge=0, le=MAX_REQUEST_TOKENS)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
MAX_NAME_LENGTH = 256
"""The longest name an event carries (a deployment, a worker, a request id)."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH)]

MAX_EVENT_TIME = 4_102_444_800.0
"""2100-01-01 in Unix seconds, the latest event time accepted. An event time in
milliseconds or nanoseconds (1.7e12 or 1.7e18 today) is a unit mistake, and one
event that far ahead would move its deployment's watermark past every tick in
between, which the core fires one by one: the worker would never catch up.
The bound catches unit mistakes only. An event dated days ahead but before
2100 (a clock-skewed engine) is refused by the bridge's ``--max-ahead``, which
has a wall clock to judge by; one that gets past it moves the clock there: the worker fires
those ticks a bounded number per batch (``streams.router.MAX_TICKS_PER_BATCH``)
and the events that follow at the true time are late (counted and
dead-lettered; docs/runtime.md, "A clock that jumps")."""
EventTime = Annotated[float, Field(ge=0.0, le=MAX_EVENT_TIME, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Envelope(_Model):
    deployment: Name
    time: EventTime = Field(description="event time, seconds since the Unix epoch (before 2100)")
    schema_version: Literal[1] = SCHEMA_VERSION


# --- engine forward-pass metrics (Dynamo FPM v1) ---------------------------


class ScheduledRequests(_Model):
    """Work the engine ran in this iteration (FPM v1 ``scheduled_requests``)."""

    num_prefill_requests: Count = 0
    sum_prefill_tokens: Tokens = Field(0, description="fresh prefill tokens computed, excluding cache hits")
    var_prefill_length: NonNegative = 0.0
    sum_prefill_kv_tokens: Tokens = Field(0, description="cached or earlier-chunk tokens read")
    num_decode_requests: Count = 0
    sum_decode_kv_tokens: Tokens = 0
    var_decode_kv_tokens: NonNegative = 0.0


class QueuedRequests(_Model):
    """Work waiting in the engine after this iteration (FPM v1 ``queued_requests``)."""

    num_prefill_requests: Count = 0
    sum_prefill_tokens: Tokens = Field(0, description="raw prompt tokens; cache hits unknown yet")
    var_prefill_length: NonNegative = 0.0
    num_decode_requests: Count = Field(0, description="preempted decode requests")
    sum_decode_kv_tokens: Tokens = 0
    var_decode_kv_tokens: NonNegative = 0.0


class ForwardPassMetrics(_Envelope):
    """One engine iteration. ``wall_time == 0`` is an idle heartbeat."""

    type: Literal["fpm"] = "fpm"
    role: Role
    worker_id: Name
    dp_rank: Count = 0
    counter_id: Count = Field(0, description="monotonic per (worker_id, dp_rank)")
    wall_time: PassSeconds = Field(0.0, description="iteration time in seconds (at most 600)")
    scheduled: ScheduledRequests = ScheduledRequests()
    queued: QueuedRequests = QueuedRequests()

    @property
    def is_heartbeat(self) -> bool:
        return self.wall_time == 0.0


class FpmBatch(_Envelope):
    """Several FPMs of one deployment packed in one record to cut per-message cost.

    ``time`` is the latest event time in the batch; each FPM keeps its own.
    """

    type: Literal["fpm_batch"] = "fpm_batch"
    fpms: list[ForwardPassMetrics] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _one_deployment_at_its_latest_time(self) -> FpmBatch:
        problem = batch_problem(self.deployment, self.time, self.fpms)
        if problem is not None:
            raise ValueError(problem)
        return self


_TIME = attrgetter("time")
_DEPLOYMENT = attrgetter("deployment")


def batch_problem(deployment: str, time: float, fpms) -> str | None:
    """Why a batch of FPMs is not one deployment's, dated no earlier than its FPMs; None when it is.

    The core folds a batch into ``deployment``'s state at the tick ``time``
    falls in, so an FPM of another deployment would land in the wrong state,
    and a batch dated before its latest FPM would be folded into a tick that
    must not see that FPM yet. (A batch dated later is only folded later: the
    bridge's packs carry their latest FPM's time, and the pieces of a split
    batch keep the whole batch's.) The decoders of schemas/fpm_wire.py share
    this; it runs for every record on the hot path, hence the C-level passes.
    """
    if set(map(_DEPLOYMENT, fpms)) != {deployment}:
        i, other = next((i, f.deployment) for i, f in enumerate(fpms) if f.deployment != deployment)
        return f"fpms.{i}.deployment: the batch's deployment {deployment!r}, got {other!r}"
    latest = max(map(_TIME, fpms))
    if time < latest:
        return f"time: at least the latest time of the batch's FPMs ({latest!r}), got {time!r}"
    return None


# --- finished requests (dynamo.request.trace.v1 request_end) ----------------


ARRIVAL_SLACK_MS = 1.0
"""How far after its end a request's arrival may be dated before it is refused (rounding)."""


class RequestRecord(_Envelope):
    """A finished request. ``time`` is when it ended; ``request_received_ms`` when it arrived."""

    type: Literal["request"] = "request"
    request_id: Name
    model: str | None = None
    input_tokens: RequestTokens
    output_tokens: RequestTokens
    cached_tokens: RequestTokens = 0
    request_received_ms: Annotated[float, Field(ge=0.0, le=MAX_EVENT_TIME * 1000.0, allow_inf_nan=False)]
    prefill_wait_time_ms: NonNegative | None = None
    prefill_time_ms: NonNegative | None = None
    ttft_ms: NonNegative | None = None
    total_time_ms: NonNegative | None = None
    avg_itl_ms: NonNegative | None = None
    kv_hit_rate: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    accept_length: AcceptLength | None = None
    queue_depth: Count | None = None
    prefill_worker_id: str | None = None
    decode_worker_id: str | None = None

    @model_validator(mode="after")
    def _arrived_before_it_ended(self) -> RequestRecord:
        """A request that arrived after it ended is a broken record (two clocks, or
        milliseconds and seconds mixed up): its arrival would date the deployment's
        first window, and the audit's run would start at it. The frontend stamps
        both on one clock, so the only slack kept is a millisecond for rounding."""
        if self.request_received_ms > self.time * 1000.0 + ARRIVAL_SLACK_MS:
            raise ValueError(f"request_received_ms: at most the record's time ({self.time * 1000.0:.3f} ms), "
                             f"when it ended; got {self.request_received_ms:.3f}")
        return self

    @property
    def arrival_s(self) -> float:
        return self.request_received_ms / 1000.0


class RequestArrival(_Envelope):
    """A request the frontend accepted; ``time`` is its arrival.

    Demand is what arrives, not what finishes: under overload finished
    requests show the fleet's service rate, so a planner that counts only
    completions cannot see load above the capacity it already has. A
    frontend that emits arrivals (Dynamo counts them in
    ``dynamo_frontend_requests_total``) lets the throughput loop count each
    request in the window it arrived in; lengths still come from finished
    requests, which know their output length.
    """

    type: Literal["arrival"] = "arrival"
    request_id: Name
    model: str | None = None
    input_tokens: RequestTokens


# --- worker inventory, operator control, clock -----------------------------

WorkerState = Literal["starting", "ready", "draining", "gone"]


class InventoryEvent(_Envelope):
    """A worker's lifecycle step, as the orchestrator sees it."""

    type: Literal["inventory"] = "inventory"
    worker_id: Name
    role: Role
    state: WorkerState
    gpus: Annotated[int, Field(ge=1, le=4096)] = 1
    decision_id: Count | None = Field(None, description="the decision that caused this step, if known")


class SetMinEndpoints(_Model):
    command: Literal["set_min_endpoints"] = "set_min_endpoints"
    minimums: dict[Role, Count]


class SetAdvisory(_Model):
    command: Literal["set_advisory"] = "set_advisory"
    advisory: bool


class _ConfigChanges(_Model):
    changes: dict[str, object]

    @field_validator("changes")
    @classmethod
    def _encodable(cls, changes: dict[str, object]) -> dict[str, object]:
        # Dynamo's runtime fields take any value and are ignored, but the event is still
        # sorted and stored by its encoding: an integer past 64 bits could not be, and the
        # worker would fail on it at every restart
        try:
            orjson.dumps(changes)
        except orjson.JSONEncodeError as err:
            raise ValueError(f"values JSON can carry (integers within 64 bits): {err}") from None
        where = _non_finite(changes)
        if where is not None:
            raise ValueError(f"finite numbers (JSON writes NaN and infinities as null): {where[0]} is {where[1]!r}")
        return changes


def _non_finite(value: object, path: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in a JSON-like value, with its dotted path; None when there is none.

    The event is stored and sorted by its encoding, where orjson writes one
    as null: a change of a Dynamo runtime field to NaN (accepted and ignored)
    was taken, and its own record said null.
    """
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, item in items:
        found = _non_finite(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


class SetConfig(_ConfigChanges):
    """Change config fields at run time; the core validates them like a config file."""

    command: Literal["set_config"] = "set_config"


class ResetPerf(_ConfigChanges):
    """The engines changed: rebuild the perf models, from these changes to their fields too.

    What was learned about the old engines (their regressions, the engines
    each window needed, the load loop's scale-down runs) is dropped, as a
    new deployment's would start; what describes the fleet and its traffic
    is kept (models/apply.py ``reset_perf``).
    """

    command: Literal["reset_perf"] = "reset_perf"
    changes: dict[str, object] = Field(default_factory=dict)


MAX_SEED_REQUESTS = 1e12
"""Most requests one seeded window may count: a million a second for a day is 8.6e10; a
count near 1e19 broke the queueing model's arithmetic on the tick after the seed."""
SeedCount = Annotated[float, Field(ge=0.0, le=MAX_SEED_REQUESTS, allow_inf_nan=False)]
SeedTokens = Annotated[float, Field(ge=0.0, le=MAX_REQUEST_TOKENS, allow_inf_nan=False)]

MAX_SEED_WINDOWS = 4096
"""Windows one ``seed_traffic`` may carry: a week and more of 180 s windows, and
still under the 1 MiB a record may take (``MAX_EVENT_BYTES``) at full precision."""


class SeedWindow(_Model):
    """One throughput window of traffic, as the planner's throughput loop observes it."""

    start_s: Annotated[float, Field(ge=-MAX_EVENT_TIME, le=MAX_EVENT_TIME, allow_inf_nan=False)] = Field(
        description="when the window began, on the events' clock (the daily cycle is read from it)"
    )
    duration_s: Annotated[float, Field(gt=0.0, le=86_400.0, allow_inf_nan=False)]
    num_req: SeedCount = Field(description="requests that arrived in the window")
    isl: SeedTokens = Field(description="their mean input length, tokens")
    osl: SeedTokens = Field(description="their mean output length, tokens")
    kv_hit_rate: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    accept_length: AcceptLength | None = None
    peak: SeedCount | None = Field(
        None, description="the busiest burst sub-window's count scaled to the window's length"
    )

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class SeedTraffic(_Model):
    """The traffic a deployment had before this planner saw it, to start its forecaster from.

    A planner that starts empty forecasts its first hours from nothing; one
    that replaces another (a new namespace, a migration from Dynamo's
    planner) can be handed the windows its predecessor saw. The core feeds
    them to the forecaster as if its throughput loop had (models/planner.py),
    and only while that has been fed nothing.
    """

    command: Literal["seed_traffic"] = "seed_traffic"
    windows: list[SeedWindow] = Field(min_length=1, max_length=MAX_SEED_WINDOWS)

    @model_validator(mode="after")
    def _in_time_order(self) -> SeedTraffic:
        for i in range(1, len(self.windows)):
            if self.windows[i].start_s < self.windows[i - 1].end_s:
                raise ValueError(
                    f"windows.{i}.start_s: {self.windows[i].start_s:g} is before the end of window "
                    f"{i - 1} ({self.windows[i - 1].end_s:g}); windows must be in time order, not overlapping"
                )
        return self


ControlCommand = Annotated[
    SetMinEndpoints | SetAdvisory | SetConfig | ResetPerf | SeedTraffic, Field(discriminator="command")
]


class ControlEvent(_Envelope):
    """An operator command."""

    type: Literal["control"] = "control"
    issued_by: str | None = None
    body: ControlCommand

    @model_validator(mode="after")
    def _seed_before_its_time(self) -> ControlEvent:
        # the tick that applies a control sees events before its time: traffic after it is not history
        if isinstance(self.body, SeedTraffic) and self.body.windows[-1].end_s > self.time:
            last = len(self.body.windows) - 1
            raise ValueError(
                f"body.windows.{last}: ends at {self.body.windows[-1].end_s:g}, after the event's time "
                f"{self.time:g}; a seed is traffic from before it"
            )
        return self


class ClockEvent(_Envelope):
    """A heartbeat that moves event time forward when sources are idle."""

    type: Literal["clock"] = "clock"
    source: Name = "bridge"


# --- decisions and acks ------------------------------------------------------

ThroughputReason = Literal[
    "disabled", "not_due", "no_traffic_data", "model_not_ready",
    "set_lower_bound", "scale", "no_change", "held_until_scored", "scaling_in_progress",
    "gpu_budget_guard_hold", "gpu_budget_reconcile",
]
LoadReason = Literal[
    "disabled", "not_due", "no_fpm_data", "scaling_in_progress", "worker_count_mismatch",
    "insufficient_data", "no_change", "scale_up", "scale_down",
    "scale_down_capped_by_throughput", "scale_down_refused_consolidation", "scale_down_stabilizing",
    "scale_down_capped_by_measured_rate", "scale_up_to_measured_rate",
    "reconcile_clamped_to_floor", "reconcile_clamped_to_ceiling",
    "gpu_budget_guard_hold", "gpu_budget_reconcile",
]


class PredictedLoad(_Model):
    num_req: NonNegative
    isl: NonNegative
    osl: NonNegative
    rps: NonNegative
    kv_hit_rate: NonNegative = 0.0
    accept_length: NonNegative = 1.0
    sized_rps: NonNegative | None = Field(
        None, description="the rate the fleet was sized for (an upper quantile), when not rps; with "
        "quantile_basis: tokens, the most any role was sized for"
    )
    window_sized_rps: NonNegative | None = Field(
        None, description="the rate prefill's rate count was sized for when its queueing floor takes the "
        "busiest burst (burst_sizing: queueing): the window count's quantile, where sized_rps is the burst's; "
        "null otherwise",
    )
    horizon_windows: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = Field(
        None, description="throughput windows the sized rate covers (startup horizon)"
    )
    quantile_calibrated: bool | None = Field(
        None, description="whether the sized rate's quantile was conformal (its own errors calibrate it); "
        "false while it is still the largest ratio seen; null when the fleet is sized for the point",
    )
    quantile_exceeded: tuple[Count, Count] | None = Field(
        None, description="[exceeded, scored]: of the conformal quantiles sized for at this horizon in the "
        "last windows of the forecaster's history whose windows have all closed since, how many the busiest "
        "burst exceeded (about 1 - sizing_quantile of them when calibrated); null when the fleet is sized "
        "for the point",
    )
    arrival_dispersion: list[tuple[NonNegative, NonNegative]] | None = Field(
        None, description="[[tau_s, I]]: the arrivals' index of dispersion per time scale that the "
        "prefill queueing floor stretched its waits by (one point at 1 s with the 1-s dispersion; "
        "1 for Poisson); null without a queueing floor",
    )
    floor_margin: Annotated[float, Field(ge=1.0, allow_inf_nan=False)] | None = Field(
        None, description="the multiple of sized_rps the prefill queueing floor sized for: "
        "calibrated_utilization over the share rate_replicas sized at while the sizing quantile is not "
        "conformal (floor_headroom: coverage), else 1; null without a queueing floor",
    )


class RoleEstimate(_Model):
    """What the perf model believes about one role at the tick.

    ``rate_replicas`` and ``queueing_replicas`` say what set the throughput
    loop's count: the engines the sized rate needs at ``utilization``, and
    the engines the queueing model asks for (None where
    none applies). Prefill's is a floor (None when there is no floor, or no
    prompt can meet the TTFT by waiting less); decode's is the wait for a
    batch slot, which replaces the rate count where decode runs at its
    batch limit with ITL to spare (``decode_sizing: queueing``).
    ``measured_floor`` is the load loop's floor when it runs alone: the
    engines the measured traffic needs (None when it has none).
    """

    ttft_ms: NonNegative | None = None
    itl_ms: NonNegative | None = None
    engine_capacity_rps: NonNegative | None = None
    throughput_lower_bound: Count | None = None
    rate_replicas: Count | None = None
    queueing_replicas: Count | None = None
    measured_floor: Count | None = None
    utilization: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="the share of one engine's SLA-bound rate that rate_replicas sized for: "
        "target_utilization, moving toward calibrated_utilization as the sizing quantile's coverage "
        "grows and reaching it once that quantile is conformal (decode: no more than its concurrent "
        "sequences' quantile leaves room for)",
    )


class Decision(_Envelope):
    """A scaling decision: the target replica count of every role.

    ``time`` is the tick time. ``decision_id`` is monotonic per deployment,
    starting at 0.
    """

    type: Literal["decision"] = "decision"
    decision_id: Count
    targets: dict[Role, Count]
    previous: dict[Role, Count]
    throughput_reason: ThroughputReason
    load_reason: LoadReason
    predicted: PredictedLoad | None = None
    estimates: dict[Role, RoleEstimate] = {}
    config_version: Count = 0
    advisory: bool = False


AckStatus = Literal["applied", "failed", "superseded"]


class Ack(_Envelope):
    """The connector's answer to one decision."""

    type: Literal["ack"] = "ack"
    decision_id: Count
    status: AckStatus
    observed: dict[Role, Count] = {}
    error: str | None = None


class DeadLetter(_Envelope):
    """An input that could not be used, and why. ``deployment`` is "unknown" when unreadable."""

    type: Literal["deadletter"] = "deadletter"
    reason: Literal["invalid", "late", "oversize", "unknown_deployment"]
    detail: str
    source_topic: str | None = None
    payload: str = Field("", description="the original bytes, utf-8 with replacement, truncated to 4 KiB")


Event = Annotated[
    ForwardPassMetrics | FpmBatch | RequestRecord | RequestArrival | InventoryEvent | ControlEvent
    | ClockEvent | Decision | Ack | DeadLetter,
    Field(discriminator="type"),
]

EVENT_MODELS: dict[str, type[BaseModel]] = {
    "fpm": ForwardPassMetrics,
    "fpm_batch": FpmBatch,
    "request": RequestRecord,
    "arrival": RequestArrival,
    "inventory": InventoryEvent,
    "control": ControlEvent,
    "clock": ClockEvent,
    "decision": Decision,
    "ack": Ack,
    "deadletter": DeadLetter,
}
