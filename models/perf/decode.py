"""Decode engines: wall time ≈ a + b·num_decode_requests + c·sum_decode_kv_tokens.

KV tokens dominate (attention reads every cached token); the request count
carries the per-sequence work of the linear layers. ITL of the next token is
one pass with the engine's KV load plus one average request (Dynamo's
``core/perf_model/decode.py``), divided by the speculative accept length.
"""

from __future__ import annotations

import numpy as np

from fleetplan.models.perf.base import RolePerfModel, per_request
from fleetplan.models.perf.capacity import Capacity, decode_capacity
from fleetplan.models.perf.columns import FpmColumns
from fleetplan.models.perf.request_shape import normalize_accept_length, scaled_load
from fleetplan.schemas import ForwardPassMetrics, ScheduledRequests


class DecodePerfModel(RolePerfModel):
    role = "decode"
    ndim = 2
    averages_kept = ("avg_decode_len", "avg_num_decode")

    @property
    def avg_decode_len(self) -> float:
        return self.averages["avg_decode_len"].value

    @property
    def avg_num_decode(self) -> float:
        return self.averages["avg_num_decode"].value

    def _features(self, scheduled: ScheduledRequests) -> tuple[float, ...]:
        return (float(scheduled.num_decode_requests), float(scheduled.sum_decode_kv_tokens))

    def _feature_columns(self, columns: FpmColumns) -> np.ndarray:
        return np.column_stack([columns.num_decode_requests, columns.sum_decode_kv_tokens])

    def _observe_averages(self, scheduled: ScheduledRequests) -> None:
        if scheduled.num_decode_requests > 0:
            self.averages["avg_decode_len"].add(
                scheduled.sum_decode_kv_tokens / scheduled.num_decode_requests
            )
        self.averages["avg_num_decode"].add(float(scheduled.num_decode_requests))

    def _observe_averages_many(self, columns: FpmColumns) -> None:
        self.averages["avg_decode_len"].extend(
            per_request(columns.sum_decode_kv_tokens, columns.num_decode_requests).tolist()
        )
        self.averages["avg_num_decode"].extend(columns.num_decode_requests.tolist())

    # -- estimates -------------------------------------------------------------

    def estimate_itl_ms(
        self, fpm: ForwardPassMetrics, accept_length: float | None = None, load_scale: float = 1.0
    ) -> float | None:
        """Estimated ITL (ms) on this engine once one more average request joins.

        ``t(avg_num_decode + 1, (sched_kv + queued_kv)·load_scale + avg_decode_len)
        / accept_length``. ``load_scale = N/(N−1)`` asks what the ITL would be
        if this engine took a removed peer's KV. As in Dynamo, only the KV load
        is scaled; the request count is the role-wide average.
        """
        fit = self.fit()
        if fit is None:
            return None
        kv_load = float(fpm.scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens)
        kv = scaled_load(kv_load, load_scale) + self.avg_decode_len
        wall = fit.predict(self.avg_num_decode + 1.0, kv)
        return wall / normalize_accept_length(accept_length) * 1000.0

    def estimate_itl_ms_many(
        self,
        decode_kv_tokens: np.ndarray,
        accept_length: float | None = None,
        load_scale: float = 1.0,
    ) -> np.ndarray | None:
        """:meth:`estimate_itl_ms` for many engines; ``decode_kv_tokens`` is
        scheduled + queued decode KV per engine."""
        fit = self.fit()
        if fit is None:
            return None
        kv = np.asarray(decode_kv_tokens, dtype=np.float64)
        if load_scale != 1.0:
            kv = np.floor(kv * load_scale)
        wall = fit.predict_many(np.full_like(kv, self.avg_num_decode + 1.0), kv + self.avg_decode_len)
        return wall / normalize_accept_length(accept_length) * 1000.0

    def estimate_itl_floor_ms(self, accept_length: float | None = None) -> float | None:
        """ITL (ms) of one average request alone on an engine: the latency no
        count of engines can lower, which the load loop's scale-down budget is
        measured from (``decode_scale_down: above_floor``)."""
        fit = self.fit()
        if fit is None:
            return None
        return fit.predict(1.0, self.avg_decode_len) / normalize_accept_length(accept_length) * 1000.0

    def capacity_rps(
        self,
        isl: int,
        osl: int,
        ttft_ms: float | None = None,
        itl_ms: float | None = None,
        kv_hit_rate: float | None = None,
        accept_length: float | None = None,
    ) -> Capacity | None:
        """Best per-engine rate for ``isl``/``osl`` requests within ``itl_ms``.

        ``ttft_ms`` and ``kv_hit_rate`` do not bear on decode (cache hits do not
        shrink KV residency); they are accepted so the roles share one signature.
        """
        fit = self.fit()
        if fit is None:
            return None
        return decode_capacity(
            fit, self.limits, isl, osl, itl_ms, accept_length, kv_fallback=self.max_observed_kv
        )
