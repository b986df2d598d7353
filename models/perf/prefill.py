"""Prefill engines: wall time ≈ a + b·sum_prefill_tokens (+ c·tokens² with ``prefill_quadratic``).

TTFT of the next request on an engine is the time to drain what is queued
there plus the request itself (an average prompt), after prefix-cache hits,
in ``max_num_batched_tokens`` chunks (Dynamo's ``core/perf_model/prefill.py``).
"""

from __future__ import annotations

import numpy as np

from fleetplan.models.perf.base import RolePerfModel, per_request
from fleetplan.models.perf.capacity import Capacity, backlog_prefill_rps, prefill_capacity
from fleetplan.models.perf.chunking import chunked_time, chunked_time_many
from fleetplan.models.perf.columns import FpmColumns
from fleetplan.models.perf.regression import OnlineRegression
from fleetplan.models.perf.request_shape import prefill_work_tokens, scaled_load
from fleetplan.schemas import ForwardPassMetrics, ScheduledRequests


class PrefillPerfModel(RolePerfModel):
    role = "prefill"
    ndim = 1
    averages_kept = ("avg_isl",)

    def __init__(self, limits=None, settings=None) -> None:
        super().__init__(limits, settings)
        if self.settings.prefill_quadratic:
            self.regression = OnlineRegression(self.ndim, self.settings, quadratic=True)

    @property
    def avg_isl(self) -> float:
        return self.averages["avg_isl"].value

    def _features(self, scheduled: ScheduledRequests) -> tuple[float, ...]:
        return (float(scheduled.sum_prefill_tokens),)

    def _feature_columns(self, columns: FpmColumns) -> np.ndarray:
        return columns.sum_prefill_tokens.reshape(-1, 1)

    def _observe_averages(self, scheduled: ScheduledRequests) -> None:
        if scheduled.num_prefill_requests > 0:
            self.averages["avg_isl"].add(
                scheduled.sum_prefill_tokens / scheduled.num_prefill_requests
            )

    def _observe_averages_many(self, columns: FpmColumns) -> None:
        self.averages["avg_isl"].extend(
            per_request(columns.sum_prefill_tokens, columns.num_prefill_requests).tolist()
        )

    # -- estimates -------------------------------------------------------------

    def estimate_ttft_ms(
        self, fpm: ForwardPassMetrics, kv_hit_rate: float | None = None, queue_scale: float = 1.0
    ) -> float | None:
        """Estimated TTFT (ms) of a request arriving now at this engine; None if not ready.

        ``queued·queue_scale·(1 − kv_hit) + avg_isl`` tokens, chunked (``avg_isl`` is
        learned from fresh tokens, already net of hits: ``prefill_work_tokens``).
        ``queue_scale=0`` gives the request's own time; ``N/(N−1)`` the time if
        the engine absorbed a removed peer's queue (consolidation check).
        """
        fit = self.fit()
        if fit is None:
            return None
        queued = scaled_load(float(fpm.queued.sum_prefill_tokens), queue_scale)
        tokens = prefill_work_tokens(queued, self.avg_isl, kv_hit_rate)
        return chunked_time(tokens, self.limits.max_num_batched_tokens, fit.predict) * 1000.0

    def estimate_ttft_ms_many(
        self,
        queued_prefill_tokens: np.ndarray,
        kv_hit_rate: float | None = None,
        queue_scale: float = 1.0,
    ) -> np.ndarray | None:
        """:meth:`estimate_ttft_ms` for many engines at once (queued tokens per engine)."""
        fit = self.fit()
        if fit is None:
            return None
        queued = np.asarray(queued_prefill_tokens, dtype=np.float64)
        if queue_scale != 1.0:
            queued = np.floor(queued * queue_scale)
        tokens = prefill_work_tokens(queued, self.avg_isl, kv_hit_rate)
        return chunked_time_many(tokens, self.limits.max_num_batched_tokens, fit.predict_many) * 1000.0

    def capacity_rps(
        self,
        isl: int,
        osl: int = 0,
        ttft_ms: float | None = None,
        itl_ms: float | None = None,
        kv_hit_rate: float | None = None,
        accept_length: float | None = None,
    ) -> Capacity | None:
        """Best per-engine rate for prompts of ``isl`` tokens within ``ttft_ms``.

        ``osl``, ``itl_ms`` and ``accept_length`` do not bear on prefill; they are
        accepted so the three roles share one signature.
        """
        fit = self.fit()
        if fit is None:
            return None
        return prefill_capacity(fit, self.limits, isl, ttft_ms, kv_hit_rate)

    def backlog_rps(self, isl: int, kv_hit_rate: float | None = None) -> float | None:
        """The rate one engine sustains with a queue (:func:`backlog_prefill_rps`); None before a fit."""
        fit = self.fit()
        return None if fit is None else backlog_prefill_rps(fit, self.limits, isl, kv_hit_rate)
