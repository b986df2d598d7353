"""Planner configuration, with Dynamo Planner's field names and defaults.

A Dynamo user can carry a planner config over: every field keeps its name
and default (Dynamo's ``config/defaults.py``; docs/references.md). Dynamo fields that only matter to its own
runtime (Prometheus endpoints, report paths, plugin lists) are accepted and
ignored, so such a file still loads; any other unknown field fails at start
with its name, as does every invalid value.

Deliberate differences: ``optimization_target`` defaults to ``"sla"``
(Dynamo's bare default, ``"throughput"``, silently switches to threshold
scaling and ignores ``ttft_ms``/``itl_ms``, which surprises anyone who set
an SLA), and the sizing fields of ``REFERENCE_SIZING`` default to
fleetplan's measured-better values. Set them explicitly to get Dynamo's
behaviour.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetplan.models.predictors import PredictorParams
from fleetplan.schemas.events import Role

Mode = Literal["disagg", "prefill", "decode", "agg"]

ROLES_OF_MODE: dict[str, tuple[Role, ...]] = {
    "disagg": ("prefill", "decode"),
    "prefill": ("prefill",),
    "decode": ("decode",),
    "agg": ("agg",),
}

DYNAMO_RUNTIME_FIELDS = frozenset({
    "environment", "backend", "namespace", "model_name", "global_planner_namespace",
    "throughput_metrics_source", "metric_pulling_prometheus_endpoint",
    "metric_pulling_prometheus_token", "metric_pulling_prometheus_token_file",
    "metric_pulling_prometheus_ssl_verify", "metric_pulling_prometheus_extra_query_params",
    "metric_pulling_prometheus_ca_bundle", "request_timeout_seconds",
    "metric_reporting_prometheus_port", "report_interval_hours", "report_output_dir",
    "report_filename", "report_write_gzip_log", "live_dashboard_port", "control_api_port",
    "pre_deployment_sweeping_mode", "aic_interpolation", "ais_perf_model", "scheduling",
    "plugin_registration", "enable_power_awareness", "total_gpu_power_limit", "no_operation",
})
"""Dynamo fields that configure its own runtime, not the planning algorithm."""

PREDICTOR_FIELDS = frozenset({
    "load_predictor", "load_predictor_log1p", "prophet_window_size", "kalman_q_level",
    "kalman_q_trend", "kalman_r", "kalman_min_points", "sizing_quantile_adapt_rate",
})
"""The predictor's own fields, which a retune's predictor candidate names (sim/retune.py).

The forecaster is built from these and the throughput interval
(``predictor_params()``'s ``prophet_interval_s``): a run-time change to any
of them rebuilds it (models/predictor_swap.py ``predictor_changed``)."""

PERF_MODEL_FIELDS = (
    "max_num_batched_tokens", "max_num_seqs", "max_kv_tokens", "context_length",
    "max_num_fpm_samples", "fpm_sample_bucket_size", "load_min_observations", "prefill_time_model",
)
"""The engine limits and regression settings a deployment's perf models are built from."""

_NEW_PROFILE = ("its perf models' seed from it; the worker loads the profile when it starts: "
                "restart it with the new one, then send reset_perf")

STARTUP_FIELDS: dict[str, str] = {
    "mode": "its roles from it; plan the other mode as a new deployment",
    **{name: "its perf models from it; a reset_perf control changes it and rebuilds them"
       for name in PERF_MODEL_FIELDS},
    "profile_results_dir": _NEW_PROFILE,
    "profile_tp": _NEW_PROFILE,
    "load_predictor_warmup_trace": "its forecaster's warm-up from it, once",
}
"""Fields built into a deployment's state when it starts: what each builds, and how to change it.

A ``set_config`` may restate them but not change them. A restart does not
change them either: the worker restores each deployment's state, config
included, from its changelog, and the config file it starts with is for
deployments it has not seen. ``reset_perf`` may change the perf models' fields.
"""


def startup_field_problem(command: str, name: str, *, restates: bool) -> str | None:
    """Why a ``command`` control may not name field ``name``, or None where it may.

    ``restates``: the value given is the one in force. ``set_config`` may
    restate the fields nothing changes at run time (the mode, the profile,
    the warm-up trace), but not name a perf model's field at all:
    ``reset_perf`` changes those, so whether a value restates the one in
    force would depend on which controls were folded first, and intake
    must judge a change on its own (models/config_changes.py).
    """
    if name not in STARTUP_FIELDS:
        return None
    if name in PERF_MODEL_FIELDS:
        if command == "reset_perf":
            return None
        restates = False
    if restates:
        return None
    return f"{command}: {name}: fixed when the deployment starts, which builds {STARTUP_FIELDS[name]}"


def bucket_size_problem(size: int) -> str | None:
    """``fpm_sample_bucket_size``'s own check that its type does not carry: the 2D perf models
    split the buckets into a square grid. Intake runs it too (models/config_changes.py)."""
    root = math.isqrt(size)
    return None if root * root == size else "fpm_sample_bucket_size must be a perfect square"


REFERENCE_SIZING: dict[str, object] = {
    "target_utilization": 1.0,
    "calibrated_utilization": None,
    "hold_scale_down_until_floor": False,
    "throughput_sizing": "point",
    "capacity_mix": "mean",
    "prefill_sizing": "rate",
    "decode_sizing": "rate",
    "prefill_time_model": "linear",
    "prefill_capacity": "best",
    "decode_scale_down": "absolute",
    "load_max_scale_up_step": 1,
    "load_scale_down_stabilization_seconds": 0.0,
    "load_floor": "none",
}
"""The values that size the fleet exactly as Dynamo's planner does (docs/sizing.md).

fleetplan's defaults differ on these fields, because the simulator
measured Dynamo's sizing missing the SLA on every rate-scaled real trace,
and in the predictor, which is chosen apart (``load_predictor``: fleetplan's
``ensemble``; Dynamo's ARIMA, its order fitted once, is ``arima_frozen``).
"""


class ConfigError(ValueError):
    """A config that cannot be used; the message names the field and what was expected."""


PREDICTOR_PARAM_FIELDS: dict[str, str] = {
    "log1p": "load_predictor_log1p",
    "prophet_interval_s": "throughput_adjustment_interval_seconds",
}
"""Predictor parameters whose config field has another name; the others share theirs."""


# Bounds that keep one tick's work finite. Each is far past any real fleet; a value beyond it
# is a typo or a unit mistake, and the core would spend minutes (or memory without end) on it.
MIN_UTILIZATION = 0.01
"""An engine sized at 1 % of its rate; below, the sized count overflows (5e-324 did)."""
MAX_STARTUP_SECONDS = 86_400.0
"""A day; the startup horizon is that many windows of quantiles (1e300 ran out of memory)."""
MAX_INTERVAL_SECONDS = 86_400
"""A day, the longest loop period: the simulator's warm fleet replays the span to the
first decision a second at a time (a throughput period of 1e9 s ran for a quarter hour)."""
MAX_GPU_BUDGET = 100_000
"""GPUs; the budget is fitted a replica at a time (a budget of 1e6 took 3.2 s a tick)."""


class PlannerConfig(BaseModel):
    # no float field may be inf or nan: such a value passes a bound like ``gt=0`` and
    # surfaces deep in the run (a predictor's own check, a queueing formula's divide)
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    # topology and target
    mode: Mode = "disagg"
    optimization_target: Literal["sla", "throughput", "latency", "load"] = "sla"
    advisory: bool = False

    # loops
    throughput_adjustment_interval_seconds: int = Field(180, gt=0, le=MAX_INTERVAL_SECONDS)
    load_adjustment_interval_seconds: int = Field(5, gt=0, le=MAX_INTERVAL_SECONDS)
    enable_throughput_scaling: bool = True
    enable_load_scaling: bool = False
    max_throughput_scaling_replicas: int = Field(8, ge=1)
    # sizing past the reference (fleetplan's own defaults; REFERENCE_SIZING and docs/sizing.md)
    target_utilization: float = Field(0.8, ge=MIN_UTILIZATION, le=1, allow_inf_nan=False)
    # once the sizing quantile is conformal it carries the forecast's error, so less headroom
    # is kept for it; None keeps target_utilization throughout (docs/sizing.md)
    calibrated_utilization: float | None = Field(0.9, ge=MIN_UTILIZATION, le=1, allow_inf_nan=False)
    # before that, the quantile is the largest of m past errors, which covers a new window with
    # probability m/(m+1): "coverage" moves the share from target_utilization toward
    # calibrated_utilization as that grows from a point forecast's 1/2 to sizing_quantile;
    # "full" keeps target_utilization until the quantile is conformal (docs/sizing.md)
    uncalibrated_headroom: Literal["full", "coverage"] = "coverage"
    # which roles' scale-downs the throughput loop holds while its sizing quantile has scored no
    # forecast error (coverage 0: for its first startup horizon, 2 ticks at the defaults): "all" (the
    # default since 2026-12-07) holds every role, since neither count knows how far off the first
    # forecast runs; "decode" (the default on 2026-12-06) holds decode alone, whose slot count
    # replaces the rate count's headroom; "none" releases on the first tick (docs/sizing.md)
    hold_until_scored: Literal["none", "decode", "all"] = "all"
    # prefill's queueing floor models the queue, not the forecast's error: "coverage" (the default
    # since 2026-12-06) sizes it for the busiest burst times calibrated_utilization / the share
    # uncalibrated_headroom gives, the rate count's headroom for that error, until the quantile is
    # conformal (1.125 at the first ticks, 1 once conformal); "none" sizes it for the burst alone
    # (docs/sizing.md)
    floor_headroom: Literal["none", "coverage"] = "coverage"
    hold_scale_down_until_floor: bool = True
    throughput_sizing: Literal["point", "startup_quantile"] = "startup_quantile"
    sizing_quantile: float = Field(0.9, gt=0, lt=1, allow_inf_nan=False)
    # what the sizing quantile is of: "requests", the request count; "tokens", each role's work,
    # the count scaled by how far each window's mean prompt (prefill) or answer (decode) ran over
    # its forecast, so a window of longer prompts is not read as covered; "floor_tokens" (the
    # default since 2026-12-06), the count, and for prefill's queueing floor, which has no headroom
    # of its own, the larger of the count and its prompt tokens (docs/sizing.md)
    quantile_basis: Literal["requests", "tokens", "floor_tokens"] = "floor_tokens"
    sizing_quantile_adapt_rate: float = Field(0.01, ge=0, lt=1, allow_inf_nan=False)
    startup_seconds: float = Field(120.0, ge=0, le=MAX_STARTUP_SECONDS, allow_inf_nan=False)
    burst_window_seconds: int = Field(60, ge=0)
    # which of prefill's counts sizes for that busiest burst: "queueing" leaves it to the queueing
    # floor, the model of waiting, and sizes the rate count for the window's own count's quantile;
    # "both" (until 2026-12-04) sizes the rate count for the burst as well (docs/sizing.md)
    burst_sizing: Literal["both", "queueing"] = "queueing"
    capacity_mix: Literal["mean", "buckets"] = "buckets"
    prefill_sizing: Literal["rate", "queueing"] = "queueing"
    # the per-engine prefill rate sizing divides by: "best" (Dynamo's, the default until
    # 2026-12-07) is the batch with the highest rate within the TTFT; "backlog" (the default), for
    # the rate count, no more than an engine with a queue serves, which packs every pass to
    # max_num_batched_tokens, so on engines whose tokens per second peak below that it is lower
    # (4 % at conv's prompts on the H100 70B at TP4); "backlog_all" everywhere, the queueing
    # floor too (docs/sizing.md)
    prefill_capacity: Literal["best", "backlog", "backlog_all"] = "backlog"
    prefill_time_model: Literal["linear", "quadratic"] = "quadratic"
    queueing_sla_share: float = Field(0.99, gt=0, lt=1, allow_inf_nan=False)
    queueing_arrivals: Literal["poisson", "measured", "timescales"] = "timescales"
    decode_sizing: Literal["rate", "queueing"] = "queueing"
    # what decode's counts (its rate count and slot-wait count) size for, with throughput_sizing:
    # startup_quantile: "burst", the quantile of the busiest burst_window_seconds, as prefill's
    # queueing floor; "window", the quantile of the window's own count, as prefill's rate count;
    # "weighted" (the default since 2026-12-06), the slot-wait count holds the share of the
    # window's requests that wait too long (its busiest burst at the burst's quantile, the rest at
    # what the window's leaves them) and the rate count keeps the burst. Only a decode role: an
    # aggregated engine keeps the burst (docs/sizing.md: on the Mooncake draws weighted spends a
    # decode engine less for the same attainment, and the ServeGen days and spikes are burst's)
    decode_demand: Literal["burst", "window", "weighted"] = "weighted"

    # SLA
    ttft_ms: float = Field(500.0, gt=0, alias="ttft")
    itl_ms: float = Field(50.0, gt=0, alias="itl")

    # predictors
    # fleetplan's default; Dynamo's is its ARIMA (`arima_frozen` here, `arima` re-selects the order),
    # which costs up to a second a forecast where this costs 0.1 ms (docs/forecasting.md)
    load_predictor: Literal["constant", "arima", "arima_frozen", "kalman", "prophet", "ensemble"] = "ensemble"
    load_predictor_log1p: bool = False
    load_predictor_warmup_trace: str | None = None
    prophet_window_size: int = Field(50, ge=5)
    # variances of a count, at most MAX_KALMAN_VARIANCE (1e30; the predictor's own check, run at
    # load by _check_predictor_params, says so in those words): past it the filter overflowed to NaN
    kalman_q_level: float = Field(1.0, gt=0)
    kalman_q_trend: float = Field(0.1, gt=0)
    kalman_r: float = Field(10.0, gt=0)
    kalman_min_points: int = Field(5, ge=1)
    # windows the core keeps to warm a predictor that set_config switches to (models/predictor_swap.py)
    predictor_history_windows: int = Field(480, ge=0)

    # load model
    # kept in the changelog record: 10,000 stored 0.42 MB (prefill) and 0.66 MB (decode), under its 16 MiB
    max_num_fpm_samples: int = Field(64, ge=8, le=10_000)
    # a queue per bucket, built with each perf model: 10^8 ran a reset_perf's fold out of memory
    fpm_sample_bucket_size: int = Field(16, ge=1, le=10_000)
    load_scaling_down_sensitivity: float = Field(80.0, ge=0, le=100)
    decode_scale_down: Literal["absolute", "above_floor"] = "above_floor"
    load_max_scale_up_step: int = Field(1, ge=1)  # 1 is Dynamo's; docs/planner.md
    load_scale_down_stabilization_seconds: float | None = Field(0.0, ge=0, allow_inf_nan=False)  # None: one startup
    load_floor: Literal["measured", "none"] = "measured"  # without the throughput loop; docs/planner.md
    load_floor_memory_seconds: int = Field(300, ge=0)  # how long a window's floor holds (HPA's 300 s)
    load_min_observations: int = Field(5, ge=2)
    prefill_scale_up_queue_tokens: int | None = Field(None, ge=0)
    prefill_scale_down_queue_tokens: int | None = Field(None, ge=0)
    decode_scale_up_kv_rate: float | None = Field(None, ge=0, le=100)
    decode_scale_down_kv_rate: float | None = Field(None, ge=0, le=100)

    # replicas and budget
    min_endpoint: int = Field(1, ge=0)
    prefill_min_endpoint: int | None = Field(None, ge=0)
    decode_min_endpoint: int | None = Field(None, ge=0)
    max_endpoint: int | None = Field(None, ge=0)
    prefill_max_endpoint: int | None = Field(None, ge=0)
    decode_max_endpoint: int | None = Field(None, ge=0)
    max_gpu_budget: int = Field(8, ge=-1, le=MAX_GPU_BUDGET)
    min_gpu_budget: int = Field(-1, ge=-1, le=MAX_GPU_BUDGET)
    prefill_engine_num_gpu: int | None = Field(None, ge=1)
    decode_engine_num_gpu: int | None = Field(None, ge=1)

    # engine limits (Dynamo reads these from the model deployment card)
    max_num_batched_tokens: int = Field(8192, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_kv_tokens: int | None = Field(None, ge=1)
    context_length: int | None = Field(None, ge=1)

    # perf model bootstrap
    profile_results_dir: str | None = None
    profile_tp: int | None = Field(None, ge=1)

    # event time and actuation (fleetplan's own)
    grace_seconds: float = Field(2.0, ge=0, allow_inf_nan=False)
    ack_timeout_seconds: float = Field(1800.0, gt=0, allow_inf_nan=False)
    discovered_engine_ttl_seconds: float = Field(86400.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check(self) -> PlannerConfig:
        _check_json_integers(self)
        if self.load_adjustment_interval_seconds >= self.throughput_adjustment_interval_seconds:
            raise ValueError(
                "load_adjustment_interval_seconds must be less than "
                "throughput_adjustment_interval_seconds"
            )
        square = bucket_size_problem(self.fpm_sample_bucket_size)
        if square is not None:
            raise ValueError(square)
        if self.load_min_observations > self.max_num_fpm_samples:
            # retention keeps at most max_num_fpm_samples: a model needing more is never ready,
            # and every tick held (model_not_ready, insufficient_data) for as long as it ran
            raise ValueError(
                f"load_min_observations: {self.load_min_observations} is more than the "
                f"max_num_fpm_samples ({self.max_num_fpm_samples}) a perf model keeps, so it would never be ready"
            )
        if 0 <= self.max_gpu_budget < self.min_gpu_budget:
            raise ValueError("min_gpu_budget must not exceed max_gpu_budget")
        if self.optimization_target == "load" and None in (
            self.prefill_scale_up_queue_tokens, self.prefill_scale_down_queue_tokens,
            self.decode_scale_up_kv_rate, self.decode_scale_down_kv_rate,
        ):
            raise ValueError(
                "optimization_target 'load' needs prefill_scale_{up,down}_queue_tokens and "
                "decode_scale_{up,down}_kv_rate"
            )
        if not self.sla_mode and "prefill" in self.roles and self.context_length is None:
            # the threshold rules read prefill's queue per context length, which no profile gives:
            # without it every prefill verdict is insufficient_data and prefill never scales
            raise ValueError(
                f"context_length: optimization_target '{self.optimization_target}' scales prefill by "
                "its queue per context length; set the engines' context length"
            )
        _check_replica_bounds(self)
        _check_budget_holds_one_engine_per_role(self)
        _check_predictor_params(self)
        return self

    # --- derived views -----------------------------------------------------

    @property
    def roles(self) -> tuple[Role, ...]:
        return ROLES_OF_MODE[self.mode]

    @property
    def floor_memory_windows(self) -> int:
        """Closed windows the load loop's measured floor remembers: enough to cover the memory.

        At least the last one, which stands in for the current window in its first minute.
        """
        return max(1, math.ceil(self.load_floor_memory_seconds / self.throughput_adjustment_interval_seconds))

    @property
    def burst_seconds(self) -> int:
        """The burst sub-window in use: never longer than a throughput window (0: off)."""
        return min(self.burst_window_seconds, self.throughput_adjustment_interval_seconds)

    @property
    def sla_mode(self) -> bool:
        return self.optimization_target == "sla"

    @property
    def throughput_enabled(self) -> bool:
        """Threshold targets force the throughput loop off, as in Dynamo."""
        return self.enable_throughput_scaling and self.sla_mode

    @property
    def load_enabled(self) -> bool:
        """Threshold targets force the load loop on, as in Dynamo."""
        return self.enable_load_scaling or not self.sla_mode

    @property
    def tick_interval_seconds(self) -> int:
        """The base tick: the gcd of the enabled loop intervals."""
        intervals = []
        if self.throughput_enabled:
            intervals.append(self.throughput_adjustment_interval_seconds)
        if self.load_enabled:
            intervals.append(self.load_adjustment_interval_seconds)
        if not intervals:
            return self.load_adjustment_interval_seconds
        return math.gcd(*intervals)

    def min_endpoints(self, role: Role) -> int:
        per_role = {"prefill": self.prefill_min_endpoint, "decode": self.decode_min_endpoint}
        value = per_role.get(role)
        return self.min_endpoint if value is None else value

    def max_endpoints(self, role: Role) -> int | None:
        per_role = {"prefill": self.prefill_max_endpoint, "decode": self.decode_max_endpoint}
        value = per_role.get(role)
        return self.max_endpoint if value is None else value

    def gpus_per_engine(self, role: Role) -> int | None:
        """Configured GPUs per engine; agg uses the decode slot as in Dynamo."""
        if role == "prefill":
            return self.prefill_engine_num_gpu
        return self.decode_engine_num_gpu

    def predictor_params(self) -> dict[str, object]:
        """The load predictor's parameters (``PredictorParams``) as this config sets them.

        ``build_forecaster`` passes exactly these, so checking them here at
        load is checking what ``make_predictor`` will be given.
        """
        return {
            "log1p": self.load_predictor_log1p,
            "prophet_window_size": self.prophet_window_size,
            "kalman_q_level": self.kalman_q_level,
            "kalman_q_trend": self.kalman_q_trend,
            "kalman_r": self.kalman_r,
            "kalman_min_points": self.kalman_min_points,
            "prophet_interval_s": float(self.throughput_adjustment_interval_seconds),
        }

    def with_changes(self, changes: dict[str, object], *, command: str = "set_config") -> PlannerConfig:
        """A validated copy with some fields changed (run-time control events).

        A field in ``STARTUP_FIELDS`` may not be changed: what it builds is
        already built, so the change would be reported and not used
        (``startup_field_problem``). ``reset_perf``, which rebuilds the perf
        models, may change their fields.
        """
        fields = field_names()
        named = {fields[key] for key in changes if key in fields}
        # the fields in force that the changes name, by name or by alias, give way to them
        # (``ttft`` was refused as the same field as the dump's ``ttft_ms``, given both)
        kept = {k: v for k, v in self.model_dump(by_alias=False).items() if k not in named}
        new = config_from_dict({**kept, **changes}, source=command)
        for name in sorted(named):
            problem = startup_field_problem(
                command, name, restates=getattr(new, name) == getattr(self, name))
            if problem is not None:
                raise ConfigError(problem)
        return new


def _min_field(cfg: PlannerConfig, role: Role) -> str:
    """The field that sets ``role``'s floor: its own when given, else ``min_endpoint``."""
    own = f"{role}_min_endpoint"
    return own if getattr(cfg, own, None) is not None else "min_endpoint"


def _max_field(cfg: PlannerConfig, role: Role) -> str:
    """The field that sets ``role``'s ceiling: its own when given, else ``max_endpoint``."""
    own = f"{role}_max_endpoint"
    return own if getattr(cfg, own, None) is not None else "max_endpoint"


def _check_replica_bounds(cfg: PlannerConfig) -> None:
    """Refuse ceilings that leave a role no engine, and floors above ceilings.

    With no engine of a role its requests wait forever (a simulation never
    ends). A floor above the ceiling has no count that meets both, and the
    fleet was seen running at the floor, above the maximum the operator set.
    """
    for role in cfg.roles:
        if cfg.max_endpoints(role) == 0:
            raise ValueError(f"{_max_field(cfg, role)}: 0 leaves no {role} engine to serve requests")
    for role in ("prefill", "decode", "agg"):  # contradictory bounds are wrong even where the mode ignores them
        low, high = cfg.min_endpoints(role), cfg.max_endpoints(role)
        if high is not None and low > high:
            raise ValueError(
                f"{_min_field(cfg, role)}: {low} is more than {_max_field(cfg, role)} ({high})"
            )


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _check_budget_holds_one_engine_per_role(cfg: PlannerConfig) -> None:
    """``check_gpu_budget`` with the engine sizes the config knows: ``*_engine_num_gpu``, else 1."""
    check_gpu_budget(cfg, {role: cfg.gpus_per_engine(role) or 1 for role in cfg.roles})


def check_gpu_budget(cfg: PlannerConfig, gpus: Mapping[Role, int]) -> None:
    """Refuse a ``max_gpu_budget`` that cannot hold one engine of every role.

    The budget is a hard limit that wins over the floors (models/constraints.py),
    so under such a budget a role stays at 0 engines and its requests are never
    served. The config alone knows an engine's GPUs only when
    ``*_engine_num_gpu`` is set; whoever learns them later (a profile's TP, the
    inventory) can call this again with ``gpus`` per role.
    """
    budget = cfg.max_gpu_budget
    if budget < 0:
        return
    per_role = {role: gpus[role] for role in cfg.roles}
    for role, size in per_role.items():
        if budget < size:
            raise ValueError(f"max_gpu_budget: {_gpus(budget)} is less than one {role} engine ({_gpus(size)})")
    if budget < sum(per_role.values()):
        parts = " + ".join(f"{role} {_gpus(size)}" for role, size in per_role.items())
        raise ValueError(f"max_gpu_budget: {_gpus(budget)} cannot hold one engine of each role ({parts})")


def check_profile_budget(cfg: PlannerConfig, profile_engine_gpus: int | None) -> None:
    """``check_gpu_budget`` with engines priced as the planner prices them before any inventory:
    ``*_engine_num_gpu``, else the profile's engine (``engine_gpus``), else 1.

    Checked when the planner is built (fleetplan/bootstrap.py) and at the tick of a
    ``set_config`` or ``reset_perf`` (models/apply.py): a budget of 3 GPUs for the 70B
    profile's 2-GPU engines was refused at start and taken at run time, after which it
    kept prefill at 0 engines.
    """
    try:
        check_gpu_budget(cfg, {r: cfg.gpus_per_engine(r) or profile_engine_gpus or 1 for r in cfg.roles})
    except ValueError as err:
        raise ConfigError(str(err)) from None


JSON_INTEGERS = (-(2**63), 2**64 - 1)
"""The integers the planner state's JSON (orjson: the changelog record, a snapshot) can carry."""


def _check_json_integers(cfg: PlannerConfig) -> None:
    """Refuse an integer field past 64 bits, naming it.

    The config is part of every stored state (``DeploymentState.to_data``); one
    such value (a typo's ``predictor_history_windows``) loaded, and then the
    worker failed to save the deployment's state at every tick.
    """
    low, high = JSON_INTEGERS
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        if isinstance(value, int) and not isinstance(value, bool) and not low <= value <= high:
            raise ValueError(f"{name}: an integer within 64 bits (the planner state's JSON carries no more), "
                             f"got {value}")


def _check_predictor_params(cfg: PlannerConfig) -> None:
    """Run the predictors' own parameter checks at load, naming the config field.

    ``make_predictor`` builds the forecaster only when the planner starts (or a
    ``set_config`` swaps it); a value it refuses must stop the config here
    instead, not the run later.
    """
    try:
        PredictorParams.from_kwargs(**cfg.predictor_params())
    except ValueError as err:
        name, _, problem = str(err).partition(" ")
        raise ValueError(f"{PREDICTOR_PARAM_FIELDS.get(name, name)}: {problem}") from None


@cache
def field_names() -> dict[str, str]:
    """Every name a config may use (field names and their Dynamo aliases) -> the field."""
    names: dict[str, str] = {}
    for name, info in PlannerConfig.model_fields.items():
        names[name] = name
        if info.alias:
            names[info.alias] = name
    return names


def _numeric(annotation) -> bool:
    """Whether a field's type takes an int or a float (``float | None`` does, a Literal does not)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return False
    if args:
        return any(_numeric(a) for a in args)
    return annotation in (int, float)


def value_problem(key: str, value: object) -> str | None:
    """What pydantic's lax mode lets through that a config must not mean: a bool for a number.

    YAML's ``true`` would load as 1 (``ttft_ms: true`` as a 1 ms target).
    """
    name = field_names().get(key)
    return None if name is None else number_problem(key, value, PlannerConfig.model_fields[name].annotation)


def number_problem(key: str, value: object, annotation) -> str | None:
    """``value_problem`` for a field of any model, given its type: a bool where it takes a number."""
    if isinstance(value, bool) and _numeric(annotation):
        return f"{key}: expected a number, got {str(value).lower()}"
    return None


def check_kv_capacity(cfg: PlannerConfig, profile_kv_tokens: int | None) -> None:
    """A threshold target judges decode (and agg) engines by their KV use: refuse one that cannot.

    The KV capacity comes from ``max_kv_tokens`` or the profile's measured
    cache (``profile_kv_tokens``); with neither, every decode verdict was
    ``insufficient_data`` and decode never scaled, however full its cache,
    while the planner started without a word. Checked when the planner is
    built (fleetplan/bootstrap.py), where the config and the profile are
    both known, and at the tick of a ``set_config`` or ``reset_perf`` that
    could take the capacity away (models/apply.py).
    """
    if cfg.sla_mode or cfg.max_kv_tokens is not None or profile_kv_tokens is not None:
        return
    kv_roles = [r for r in cfg.roles if r in ("decode", "agg")]
    if kv_roles:
        raise ConfigError(
            f"max_kv_tokens: optimization_target '{cfg.optimization_target}' scales {kv_roles[0]} by its KV "
            "use; set the engines' KV-cache size in tokens, or give a profile that measured it")


def engine_gpus_wanted(cfg: PlannerConfig) -> int | None:
    """The GPUs an engine has, to choose a profile's config by, when ``profile_tp`` does not.

    A profile stacked over parallel configs (TP2, TP4, TP8) otherwise gives
    the one with the fewest GPUs, and a deployment of 8-GPU engines was
    timed (the simulator) or seeded (the planner) on 2-GPU rows while its
    budget counted 8. None when the roles' counts are unset or differ (the
    check below then names the role that disagrees).
    """
    if cfg.profile_tp is not None:
        return None
    counts = {cfg.gpus_per_engine(role) for role in cfg.roles} - {None}
    return counts.pop() if len(counts) == 1 else None


def check_profile_engines(cfg: PlannerConfig, profile_engine_gpus: int | None, profile_name: str | None) -> None:
    """Refuse a config whose engines are not the ones the profile measured.

    The profile's times are one engine config's; with ``*_engine_num_gpu``
    set to another, the simulator billed the config's GPUs for the profile's
    speed, and the planner's perf model started from another engine's
    curves. A profile without parallel metadata is taken on trust.
    """
    if profile_engine_gpus is None:
        return
    for role in cfg.roles:
        count = cfg.gpus_per_engine(role)
        if count is not None and count != profile_engine_gpus:
            slot = "prefill" if role == "prefill" else "decode"
            raise ConfigError(
                f"{slot}_engine_num_gpu: {count} GPUs an engine, but the profile {profile_name or ''} measured "
                f"engines of {profile_engine_gpus}; give the profile of those engines (profile_tp picks one of a "
                f"file's configs) or set {slot}_engine_num_gpu: {profile_engine_gpus}")


def config_from_dict(data: dict, *, source: str = "config") -> PlannerConfig:
    """Validate a config mapping; fail with the field name and the expectation."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of config fields, got {type(data).__name__}")
    if "planner" in data and isinstance(data["planner"], dict) and len(data) == 1:
        data = data["planner"]
    known = {k: v for k, v in data.items() if k not in DYNAMO_RUNTIME_FIELDS}
    given: dict[str, str] = {}
    for key, value in known.items():
        name = field_names().get(key)
        if name in given:
            raise ConfigError(f"{source}: {key}: the same field as {given[name]}, given both")
        if name is not None:
            given[name] = key
        problem = value_problem(key, value)
        if problem is not None:
            raise ConfigError(f"{source}: {problem}")
    try:
        return PlannerConfig.model_validate(known)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{source}: {_loc(first)}: unknown field") from None
        if not first["loc"] and first["type"] == "value_error":
            # a check across fields: its message already starts with the field(s)
            raise ConfigError(f"{source}: {first['ctx']['error']}") from None
        raise ConfigError(f"{source}: {_loc(first)}: {first['msg']}") from None


def _loc(error: dict) -> str:
    return ".".join(str(p) for p in error["loc"]) or "config"


class DuplicateKeyError(yaml.YAMLError):
    """A mapping in a settings file gives one key twice (lines are 1-based)."""

    def __init__(self, key: object, line: int | None = None, first_line: int | None = None) -> None:
        where = "" if line is None else f"line {line}: "
        first = "" if first_line is None else f" (first on line {first_line})"
        super().__init__(f"{where}{key}: duplicate key{first}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key given twice in one mapping.

    PyYAML keeps the last value without a word, so a file that sets
    ``ttft_ms`` twice would run on whichever came last. Merge keys (``<<``)
    may still be overridden, as YAML intends.
    """

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            _refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


def _refuse_duplicate_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    first_line: dict[object, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first_line.setdefault(key, key_node.start_mark.line + 1)
        except TypeError:
            continue  # an unhashable key: SafeLoader refuses it with its own message
        if seen != key_node.start_mark.line + 1:
            raise DuplicateKeyError(key, key_node.start_mark.line + 1, seen)


def _refuse_duplicate_json_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` for ``json.loads``: a key given twice is an error, not the last one."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)  # the stdlib parser gives no position
        out[key] = value
    return out


def _parse_settings(p: Path, text: bytes) -> object:
    """YAML (or JSON for ``.json``) with every mapping's keys unique.

    A UTF-8 byte-order mark, as Windows editors write, is not part of the
    file: PyYAML skips it, orjson refused the whole file for it.
    """
    if p.suffix != ".json":
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    text = text.removeprefix(b"\xef\xbb\xbf")
    data = orjson.loads(text)
    # orjson keeps the last of duplicate keys; the slower stdlib parse is only there to find them
    json.loads(text, object_pairs_hook=_refuse_duplicate_json_keys)
    return data


def read_settings_file(path: str | Path, what: str = "config") -> object:
    """The parsed contents of a YAML file, or JSON when it ends in ``.json``.

    A file that cannot be read or parsed, or that gives a key twice in one
    mapping, is a ConfigError naming it and ``what`` it holds.
    """
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as err:
        raise ConfigError(f"{p}: cannot read {what} ({err.strerror})") from None
    try:
        return _parse_settings(p, text)
    except DuplicateKeyError as err:
        raise ConfigError(f"{p}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{p}: not valid YAML: {_yaml_problem(err)}") from None
    except orjson.JSONDecodeError as err:
        raise ConfigError(f"{p}: not valid JSON: {err}") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's error on one line: where it stopped, what it expected, what it was in.

    Its own text spans five lines, quotes the source and names a ``<byte
    string>`` instead of the file, which a one-line CLI error cannot carry.
    """
    if not isinstance(err, yaml.MarkedYAMLError) or err.problem_mark is None:
        return " ".join(str(err).split())
    mark = err.problem_mark
    text = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
    if err.context:
        where = err.context_mark
        at = "" if where is None else f" at line {where.line + 1}, column {where.column + 1}"
        text += f" ({err.context}{at})"
    return text


def _check_warmup_trace(cfg: PlannerConfig, source: str) -> None:
    """Fail at load when the warm-up trace cannot be opened.

    It is read only when the planner is built, where an OSError names
    neither the config file nor the field. Its format is checked there.
    """
    path = cfg.load_predictor_warmup_trace
    if not path:
        return
    try:
        Path(path).open("rb").close()
    except FileNotFoundError:
        raise ConfigError(f"{source}: load_predictor_warmup_trace: no such file {path}") from None
    except OSError as err:
        raise ConfigError(f"{source}: load_predictor_warmup_trace: cannot read {path} ({err.strerror})") from None


def load_config(path: str | Path | None) -> PlannerConfig:
    """Read a YAML or JSON config file; ``None`` gives the defaults.

    An empty (or comment-only) file also gives the defaults; any other
    content that is not a mapping (a list, ``false``, ``0``, ``""``) is refused.
    """
    if path is None:
        return PlannerConfig()
    source = str(Path(path))
    data = read_settings_file(path)
    cfg = config_from_dict({} if data is None else data, source=source)
    _check_warmup_trace(cfg, source)
    return cfg
