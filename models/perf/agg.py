"""Aggregated engines: wall time ≈ a + b·sum_prefill_tokens + c·sum_decode_kv_tokens.

One pool does both phases: chunked prefill rides in the same forward pass
as the decode batch. TTFT chunks the queue with the current decode KV
riding along; ITL is a pass with the learned typical prefill mix
(``avg_prefill_tokens``) on top of the decode KV (Dynamo's ``core/perf_model/agg.py``).
"""

from __future__ import annotations

import numpy as np

from fleetplan.models.perf.averages import MovingAverage
from fleetplan.models.perf.base import RolePerfModel, per_request
from fleetplan.models.perf.capacity import Capacity, agg_capacity
from fleetplan.models.perf.chunking import chunked_time, chunked_time_many
from fleetplan.models.perf.columns import FpmColumns
from fleetplan.models.perf.request_shape import (
    normalize_accept_length,
    prefill_work_tokens,
    scaled_load,
)
from fleetplan.schemas import ForwardPassMetrics, ScheduledRequests


class AggPerfModel(RolePerfModel):
    role = "agg"
    ndim = 2
    averages_kept = ("avg_isl", "avg_decode_len", "avg_prefill_tokens")

    @property
    def avg_isl(self) -> float:
        return self.averages["avg_isl"].value

    @property
    def avg_decode_len(self) -> float:
        return self.averages["avg_decode_len"].value

    @property
    def avg_prefill_tokens(self) -> float:
        return self.averages["avg_prefill_tokens"].value

    def _features(self, scheduled: ScheduledRequests) -> tuple[float, ...]:
        return (float(scheduled.sum_prefill_tokens), float(scheduled.sum_decode_kv_tokens))

    def _feature_columns(self, columns: FpmColumns) -> np.ndarray:
        return np.column_stack([columns.sum_prefill_tokens, columns.sum_decode_kv_tokens])

    def _observe_averages(self, scheduled: ScheduledRequests) -> None:
        if scheduled.num_prefill_requests > 0:
            self.averages["avg_isl"].add(
                scheduled.sum_prefill_tokens / scheduled.num_prefill_requests
            )
        if scheduled.num_decode_requests > 0:
            self.averages["avg_decode_len"].add(
                scheduled.sum_decode_kv_tokens / scheduled.num_decode_requests
            )
        self.averages["avg_prefill_tokens"].add(float(scheduled.sum_prefill_tokens))

    def _observe_averages_many(self, columns: FpmColumns) -> None:
        self.averages["avg_isl"].extend(
            per_request(columns.sum_prefill_tokens, columns.num_prefill_requests).tolist()
        )
        self.averages["avg_decode_len"].extend(
            per_request(columns.sum_decode_kv_tokens, columns.num_decode_requests).tolist()
        )
        self.averages["avg_prefill_tokens"].extend(columns.sum_prefill_tokens.tolist())

    def seed(self, columns: FpmColumns) -> None:
        """Seed the fit from both row kinds, the prefill mix from the decode rows alone.

        The profile's prompt rows anchor the prefill slope, but a lone prompt
        of up to 16k tokens is no pass of a live agg engine's mix: counted in
        ``avg_prefill_tokens`` (2,414 tokens on the H200: 17 prompts and 41
        zeros) they made an idle engine's ITL 58 ms, over a 50 ms target, and
        the load loop grew an idle fleet. Dynamo seeds agg from decode rows,
        whose mix is empty (no prefill) until traffic teaches it.
        """
        super().seed(columns)
        mix = self.averages["avg_prefill_tokens"] = MovingAverage(self.settings.average_window)
        mix.extend(columns.sum_prefill_tokens[columns.num_prefill_requests == 0].tolist())

    # -- estimates -------------------------------------------------------------

    def estimate_ttft_ms(
        self,
        fpm: ForwardPassMetrics,
        kv_hit_rate: float | None = None,
        queue_scale: float = 1.0,
        decode_scale: float = 1.0,
    ) -> float | None:
        """Estimated TTFT (ms): the queue plus an average prompt, after cache hits,
        chunked, each chunk sharing its pass with the engine's current decode KV.

        ``queue_scale`` and ``decode_scale`` scale the queued prefill and the
        decode KV separately: Dynamo's agg consolidation check asks for the
        request's own time (queue 0) at the survivor's grown decode KV.
        """
        fit = self.fit()
        if fit is None:
            return None
        queued = scaled_load(float(fpm.queued.sum_prefill_tokens), queue_scale)
        decode_kv = scaled_load(float(fpm.scheduled.sum_decode_kv_tokens), decode_scale)
        tokens = prefill_work_tokens(queued, self.avg_isl, kv_hit_rate)
        return (
            chunked_time(
                tokens, self.limits.max_num_batched_tokens, lambda chunk: fit.predict(chunk, decode_kv)
            )
            * 1000.0
        )

    def estimate_ttft_ms_many(
        self,
        queued_prefill_tokens: np.ndarray,
        decode_kv_tokens: np.ndarray,
        kv_hit_rate: float | None = None,
        queue_scale: float = 1.0,
        decode_scale: float = 1.0,
    ) -> np.ndarray | None:
        """:meth:`estimate_ttft_ms` for many engines (queued prefill, scheduled decode KV)."""
        fit = self.fit()
        if fit is None:
            return None
        queued = np.asarray(queued_prefill_tokens, dtype=np.float64)
        decode_kv = np.asarray(decode_kv_tokens, dtype=np.float64)
        if queue_scale != 1.0:
            queued = np.floor(queued * queue_scale)
        if decode_scale != 1.0:
            decode_kv = np.floor(decode_kv * decode_scale)
        tokens = prefill_work_tokens(queued, self.avg_isl, kv_hit_rate)
        ttft_s = chunked_time_many(
            tokens, self.limits.max_num_batched_tokens, lambda chunk: fit.predict_many(chunk, decode_kv)
        )
        return ttft_s * 1000.0

    def estimate_itl_ms(
        self,
        fpm: ForwardPassMetrics,
        accept_length: float | None = None,
        load_scale: float = 1.0,
        include_queued_prefill: bool = False,
    ) -> float | None:
        """Estimated ITL (ms): ``t(avg_prefill_tokens, kv·load_scale + avg_decode_len)/accept``.

        ``kv`` is scheduled + queued decode KV; with ``include_queued_prefill``
        the queued prompts count too, since they become decode KV once
        prefilled (Dynamo's agg consolidation check).
        """
        fit = self.fit()
        if fit is None:
            return None
        kv_load = float(fpm.scheduled.sum_decode_kv_tokens + fpm.queued.sum_decode_kv_tokens)
        if include_queued_prefill:
            kv_load += float(fpm.queued.sum_prefill_tokens)
        kv = scaled_load(kv_load, load_scale) + self.avg_decode_len
        wall = fit.predict(self.avg_prefill_tokens, kv)
        return wall / normalize_accept_length(accept_length) * 1000.0

    def estimate_itl_ms_many(
        self,
        decode_kv_tokens: np.ndarray,
        accept_length: float | None = None,
        load_scale: float = 1.0,
    ) -> np.ndarray | None:
        """:meth:`estimate_itl_ms` for many engines; ``decode_kv_tokens`` per engine
        is the KV load to count (scheduled + queued decode, plus queued prefill if wanted)."""
        fit = self.fit()
        if fit is None:
            return None
        kv = np.asarray(decode_kv_tokens, dtype=np.float64)
        if load_scale != 1.0:
            kv = np.floor(kv * load_scale)
        wall = fit.predict_many(np.full_like(kv, self.avg_prefill_tokens), kv + self.avg_decode_len)
        return wall / normalize_accept_length(accept_length) * 1000.0

    def estimate_itl_floor_ms(self, accept_length: float | None = None) -> float | None:
        """ITL (ms) of one average request alone on an engine, no prompt riding
        along: the latency no count of engines can lower (see the decode model)."""
        fit = self.fit()
        if fit is None:
            return None
        return fit.predict(0.0, self.avg_decode_len) / normalize_accept_length(accept_length) * 1000.0

    def capacity_rps(
        self,
        isl: int,
        osl: int,
        ttft_ms: float | None = None,
        itl_ms: float | None = None,
        kv_hit_rate: float | None = None,
        accept_length: float | None = None,
    ) -> Capacity | None:
        """Best per-engine rate within both ``ttft_ms`` and ``itl_ms``, balanced batches only."""
        fit = self.fit()
        if fit is None:
            return None
        return agg_capacity(
            fit,
            self.limits,
            isl,
            osl,
            ttft_ms,
            itl_ms,
            kv_hit_rate,
            accept_length,
            kv_fallback=self.max_observed_kv,
        )
