"""Prometheus metrics of the connector service.

Each service gets its own registry, so several services (or tests) in one
process never collide, and the endpoint shows only this connector's series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

OUTCOMES = ("applied", "failed", "superseded", "advisory", "duplicate", "ignored")


class ConnectorMetrics:
    """Counters and gauges named ``fleetplan_connector_*``."""

    def __init__(self, backend: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "fleetplan_connector_decisions", "Decisions handled, by outcome",
            ["backend", "outcome"], registry=r,
        ).labels
        self.backend = backend
        self.deadlettered = Counter(
            "fleetplan_connector_deadlettered", "Unusable decision records, by reason",
            ["reason"], registry=r,
        )
        self.apply_seconds = Histogram(
            "fleetplan_connector_apply_seconds", "Time to apply one decision (incl. readiness wait)",
            ["backend"], registry=r,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 180, 600, 1800),
        ).labels(backend)
        self.ack_latency = Histogram(
            "fleetplan_connector_ack_latency_seconds",
            "Wall time from a decision's tick time to its ack on the topic",
            registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
        )
        self.target = Gauge(
            "fleetplan_connector_target_replicas", "Targets of the last decision applied",
            ["deployment", "role"], registry=r,
        )
        self.observed = Gauge(
            "fleetplan_connector_observed_replicas", "Replicas observed after the last apply",
            ["deployment", "role"], registry=r,
        )
        self._last_decision = Gauge(
            "fleetplan_connector_last_decision_id", "highest decision_id acked",
            ["deployment"], registry=r,
        )
        self._last_ids: dict[str, int] = {}
        self.inflight = Gauge(
            "fleetplan_connector_inflight", "Decision records received and not yet done",
            registry=r,
        )
        self.lag = Gauge(
            "fleetplan_connector_consumer_lag", "Records on the decision topic not yet committed",
            ["partition"], registry=r,
        )
        self.errors = Counter(
            "fleetplan_connector_errors", "Retried errors: infrastructure (redis, kafka) and waits on another connector's live claim (claim_busy)",
            ["component"], registry=r,
        )
        for outcome in OUTCOMES:
            self.decisions(backend, outcome)

    def acked(self, deployment: str, decision_id: int) -> None:
        """Note an ack; the gauge keeps the highest id, so an old decision's ack sent again
        (a redelivery after a crash) does not move it back."""
        if decision_id > self._last_ids.get(deployment, -1):
            self._last_ids[deployment] = decision_id
            self._last_decision.labels(deployment).set(decision_id)

    def outcome(self, outcome: str) -> None:
        self.decisions(self.backend, outcome).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``port`` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)
