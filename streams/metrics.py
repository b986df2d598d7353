"""The worker's Prometheus metrics: what the planner sees and decides, and how fast.

Everything here is read off what the core returned (tick reports, the
state's latest FPMs) or off the runtime's own bookkeeping; nothing is
computed for the metrics alone. A private registry per worker keeps tests
and several workers in one process apart.
"""

from __future__ import annotations

import contextlib
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, start_http_server

from fleetplan.models.startup import measured_startup_seconds
from fleetplan.schemas.events import LoadReason, ThroughputReason

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
PREDICTED_FIELDS = ("num_req", "isl", "osl", "rps", "kv_hit_rate", "accept_length")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.replica_target = Gauge("fleetplan_replica_target", "replicas the last tick asked for",
                                    ["deployment", "role"], registry=r)
        self.replicas_ready = Gauge("fleetplan_replicas_ready", "ready replicas the core counted at the last tick",
                                    ["deployment", "role"], registry=r)
        self.lower_bound = Gauge("fleetplan_throughput_lower_bound", "throughput-loop floor per role",
                                 ["deployment", "role"], registry=r)
        self.predicted = Gauge("fleetplan_predicted_load", "the throughput loop's predicted load",
                               ["deployment", "quantity"], registry=r)
        self.sizing = Gauge("fleetplan_sizing_replicas",
                            "engines the throughput loop's sizing asked for, by what: the sized rate at the "
                            "target utilisation (rate) or the prefill queueing floor (queueing)",
                            ["deployment", "role", "by"], registry=r)
        self.utilization = Gauge("fleetplan_sizing_utilization",
                                 "share of one engine's SLA-bound rate the last throughput tick sized for",
                                 ["deployment", "role"], registry=r)
        self.horizon = Gauge("fleetplan_sizing_horizon_windows",
                             "throughput windows the sized quantile covered at the last tick (the startup horizon)",
                             ["deployment"], registry=r)
        self.calibrated = Gauge("fleetplan_sizing_quantile_calibrated",
                                "1 when the quantile the last tick sized for was conformal, 0 while it is "
                                "still the largest ratio seen", ["deployment"], registry=r)
        self.exceeded = Gauge("fleetplan_sizing_quantile_exceeded",
                              "of the conformal quantiles sized for at this horizon in the forecaster's history "
                              "(256 windows) whose windows have closed, how many the busiest burst exceeded "
                              "(scored: how many there were); about 1 - sizing_quantile of them when calibrated",
                              ["deployment", "count"], registry=r)
        self.startup = Gauge("fleetplan_startup_seconds",
                             "startup time the planner plans with (the throughput loop's horizon, the load "
                             "loop's scale-down wait): the median of the measured startups (from inventory, "
                             "else the acks of scale-ups), or startup_seconds until one is measured", ["deployment"], registry=r)
        self.ttft = Gauge("fleetplan_estimated_ttft_ms", "worst engine TTFT estimate at the last load tick",
                          ["deployment", "role"], registry=r)
        self.itl = Gauge("fleetplan_estimated_itl_ms", "worst engine ITL estimate at the last load tick",
                         ["deployment", "role"], registry=r)
        self.throughput_reason = Enum("fleetplan_throughput_reason", "reason of the throughput loop at the last tick",
                                      ["deployment"], states=list(get_args(ThroughputReason)), registry=r)
        self.load_reason = Enum("fleetplan_load_reason", "reason of the load loop at the last tick",
                                ["deployment"], states=list(get_args(LoadReason)), registry=r)
        self.queue_depth = Gauge("fleetplan_engine_queue_depth", "queued work of each engine's latest FPM",
                                 ["deployment", "role", "engine", "kind"], registry=r)
        self.late = Counter("fleetplan_late_events", "inputs refused because their tick had fired",
                            ["deployment"], registry=r)
        self.deadletters = Counter("fleetplan_deadletters", "inputs sent to the dead-letter topic",
                                   ["reason"], registry=r)
        self.lag = Gauge("fleetplan_consumer_lag", "records between the consumer position and the partition end",
                         ["topic", "partition"], registry=r)
        self.decision_latency = Histogram(
            "fleetplan_decision_latency_seconds",
            "wall time from the watermark passing a tick to its decision acknowledged by the broker",
            buckets=LATENCY_BUCKETS, registry=r)
        self.tick_latency = Histogram(
            "fleetplan_tick_latency_seconds",
            "wall time from the watermark passing a tick to its diagnostics acknowledged by the broker",
            buckets=LATENCY_BUCKETS, registry=r)
        self.decisions = Counter("fleetplan_decisions", "decisions produced", ["deployment"], registry=r)
        self.ticks = Counter("fleetplan_ticks", "ticks fired", ["deployment"], registry=r)
        self.events = Counter("fleetplan_input_records", "input records routed", ["topic"], registry=r)
        self.fpms = Counter("fleetplan_fpm_events", "forward-pass metrics routed (batches expanded)", registry=r)
        self.snapshots_skipped = Counter("fleetplan_snapshots_skipped",
                                         "hourly state snapshots left out for their size (over 900 kB), so "
                                         "audit --since cannot start there", registry=r)
        self.mirror_checks = Counter("fleetplan_traffic_mirror_checks",
                                     "throughput windows compared with the windowed traffic table",
                                     ["deployment"], registry=r)
        self.mirror_mismatches = Counter("fleetplan_traffic_mirror_mismatches",
                                         "windows where the table and the core's window differ",
                                         ["deployment", "field"], registry=r)
        self.event_clock = Gauge("fleetplan_event_clock_seconds",
                                 "event-time clock of each deployment (before its grace period)",
                                 ["deployment"], registry=r)
        self.batch_seconds = Histogram("fleetplan_batch_seconds", "wall time to route and persist one batch",
                                       registry=r)
        self.fold_rollbacks = Counter(
            "fleetplan_fold_rollbacks",
            "events that arrived below the watermark after the core had folded past them ahead of "
            "their tick (it folds them again in order; many mean a source later than its grace)",
            registry=r)
        self._engines: dict[str, set[tuple[str, str]]] = {}
        self._reasoned: set[str] = set()  # deployments whose loop reasons were set: a first not_due is too
        self._sized: set[str] = set()  # deployments with throughput-loop series exported
        # the gauges that describe one deployment as its owner last saw it, by their label names
        self._per_deployment = (
            (self.replica_target, ("deployment", "role")), (self.replicas_ready, ("deployment", "role")),
            (self.lower_bound, ("deployment", "role")), (self.predicted, ("deployment", "quantity")),
            (self.sizing, ("deployment", "role", "by")), (self.utilization, ("deployment", "role")),
            (self.horizon, ("deployment",)), (self.calibrated, ("deployment",)),
            (self.exceeded, ("deployment", "count")), (self.startup, ("deployment",)),
            (self.ttft, ("deployment", "role")), (self.itl, ("deployment", "role")),
            (self.throughput_reason, ("deployment",)), (self.load_reason, ("deployment",)),
            (self.queue_depth, ("deployment", "role", "engine", "kind")), (self.event_clock, ("deployment",)),
        )

    def serve(self, port: int, host: str = "0.0.0.0"):
        """Expose /metrics on ``port`` (a daemon thread); returns the server."""
        return start_http_server(port, addr=host, registry=self.registry)

    def forget(self, deployments, partitions) -> None:
        """Stop exporting the gauges of deployments and input partitions this worker no longer owns.

        Their new owner exports them; the last values seen here, frozen, would be scraped
        beside its own for good (a backlog counted twice in a sum of the lag, a second line
        of old targets). Counters stay: they stop growing, and go on if the partition comes back.
        """
        names = set(deployments)
        for gauge, labels in self._per_deployment:
            _remove_series(gauge, labels, lambda s: s["deployment"] in names)
        for name in names:
            self._engines.pop(name, None)
        self._reasoned -= names
        self._sized -= names
        gone = {str(p) for p in partitions}
        _remove_series(self.lag, ("topic", "partition"), lambda s: s["partition"] in gone)

    def observe_tick(self, report, state) -> None:
        """Record one tick report and the engines' queues it saw."""
        dep = report.deployment
        self.ticks.labels(dep).inc()
        # each loop's outcome at its last run: at a tick where a loop is not due its reason is
        # not_due, and the throughput loop runs one tick in 36 at the defaults
        first = dep not in self._reasoned
        for gauge, reason in ((self.throughput_reason, report.throughput_reason),
                              (self.load_reason, report.load_reason)):
            if reason != "not_due" or first:
                gauge.labels(dep).state(reason)
        self._reasoned.add(dep)
        for role, n in report.targets.items():
            self.replica_target.labels(dep, role).set(n)
        for role, n in report.ready.items():
            self.replicas_ready.labels(dep, role).set(n)
        for role in report.targets:
            # a floor the state dropped (a set_config turned the throughput loop off) is not
            # exported: it no longer holds the fleet
            _set_or_remove(self.lower_bound, (dep, role), report.lower_bound.get(role))
        if report.throughput_reason == "disabled" and dep in self._sized:
            self._forget_throughput(dep)
        for role, est in report.estimates.items():
            if est.ttft_ms is not None:
                self.ttft.labels(dep, role).set(est.ttft_ms)
            if est.itl_ms is not None:
                self.itl.labels(dep, role).set(est.itl_ms)
            if report.predicted is None:
                continue  # not a throughput tick: the last one's sizing stays
            # a count this tick's sizing did not have (no queueing floor) is not exported: the
            # last tick's would read as what sized the fleet now
            _set_or_remove(self.sizing, (dep, role, "rate"), est.rate_replicas)
            _set_or_remove(self.sizing, (dep, role, "queueing"), est.queueing_replicas)
            _set_or_remove(self.utilization, (dep, role), est.utilization)
        if report.predicted is not None:
            self._observe_predicted(dep, report.predicted)
        # every tick: the load loop's scale-down waits one startup too (load_scale_down_stabilization_seconds
        # null), so a deployment without the throughput loop plans with it as well
        self.startup.labels(dep).set(measured_startup_seconds(state))
        if report.decision is not None:
            self.decisions.labels(dep).inc()
        self._observe_queues(dep, state)

    def _forget_throughput(self, dep: str) -> None:
        """Stop exporting what the throughput loop sized, once it no longer runs.

        Its series are those of its last run, but a loop a set_config turned off has
        none to come: kept, its last forecast and counts would read as what sizes the
        fleet now.
        """
        for gauge, labels in ((self.predicted, ("deployment", "quantity")), (self.sizing, ("deployment", "role", "by")),
                              (self.utilization, ("deployment", "role")), (self.horizon, ("deployment",)),
                              (self.calibrated, ("deployment",)), (self.exceeded, ("deployment", "count"))):
            _remove_series(gauge, labels, lambda s: s["deployment"] == dep)
        self._sized.discard(dep)

    def _observe_predicted(self, dep: str, predicted) -> None:
        self._sized.add(dep)
        for name in PREDICTED_FIELDS:
            self.predicted.labels(dep, name).set(getattr(predicted, name))
        # the upper quantiles beside the point's rps: the busiest burst's, and the window's
        # each only where this tick sized that way (null otherwise: point sizing, no queueing floor)
        for name in ("sized_rps", "window_sized_rps"):
            _set_or_remove(self.predicted, (dep, name), getattr(predicted, name))
        _set_or_remove(self.horizon, (dep,), predicted.horizon_windows)
        calibrated = predicted.quantile_calibrated
        _set_or_remove(self.calibrated, (dep,), None if calibrated is None else float(calibrated))
        exceeded, scored = predicted.quantile_exceeded or (None, None)
        _set_or_remove(self.exceeded, (dep, "exceeded"), exceeded)
        _set_or_remove(self.exceeded, (dep, "scored"), scored)

    def _observe_queues(self, dep: str, state) -> None:
        seen: set[tuple[str, str]] = set()
        for engine, fpm in state.latest_fpm.items():
            q = fpm.queued
            for kind, value in (("prefill_requests", q.num_prefill_requests),
                                ("decode_requests", q.num_decode_requests),
                                ("prefill_tokens", q.sum_prefill_tokens)):
                self.queue_depth.labels(dep, fpm.role, engine, kind).set(value)
            seen.add((fpm.role, engine))
        for role, engine in self._engines.get(dep, set()) - seen:
            for kind in ("prefill_requests", "decode_requests", "prefill_tokens"):
                _remove(self.queue_depth, (dep, role, engine, kind))
        self._engines[dep] = seen


def _set_or_remove(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    """Set the series, or stop exporting it where the tick has no such value."""
    if value is not None:
        gauge.labels(*labels).set(value)
    else:
        _remove(gauge, labels)


def _remove(metric, labels: tuple[str, ...]) -> None:
    """Stop exporting one series; one never exported, or removed already, is no error
    (older prometheus-clients raise KeyError for it)."""
    with contextlib.suppress(KeyError):
        metric.remove(*labels)


def _remove_series(metric, labelnames: tuple[str, ...], where) -> None:
    """Remove the series of ``metric`` whose labels (a dict) ``where`` accepts."""
    for family in metric.collect():
        for labels in {tuple(s.labels.get(n) for n in labelnames) for s in family.samples
                       if where(s.labels)}:
            _remove(metric, labels)
