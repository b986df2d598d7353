"""Per-engine capacity: the highest request rate one engine sustains within the SLA.

Dynamo 1.6.1 semantics (``core/perf_model/engine_query.py``): try batch sizes
1..max_batch (128 evenly spaced sizes when there are more), model each with
the fitted forward-pass time, and pick the candidate with the highest rate,
candidates meeting the SLA first. When none meets it the best one is still
returned with ``meets_sla=False``: the planner needs a rate to size the fleet
even when the SLA is out of reach, and it is not a floor. Ties go to the
smaller batch (lower latency at the same rate). All candidates are evaluated
at once with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetplan.models.perf.chunking import chunked_time_many
from fleetplan.models.perf.fit import LinearFit
from fleetplan.models.perf.limits import EngineLimits
from fleetplan.models.perf.request_shape import (
    decode_context_length,
    effective_isl,
    normalize_accept_length,
)

MAX_BATCH_CANDIDATES = 128


@dataclass(frozen=True)
class Capacity:
    """The chosen operating point of one engine.

    ``rps`` requests per second at batch size ``batch``; the modelled TTFT and
    ITL there (None where the role has no such latency); whether it meets
    every SLA that was given; whether ``batch`` is the largest the engine's
    limits allow (decode: ``max_num_seqs`` or the KV cache), so that the
    rate is set by the limit and not by the latency target.
    """

    rps: float
    batch: int
    ttft_ms: float | None
    itl_ms: float | None
    meets_sla: bool
    at_limit: bool = False


def batch_candidates(max_batch: int) -> np.ndarray:
    """1..max_batch, or 128 sizes spread evenly from 1 to max_batch inclusive."""
    if max_batch <= 0:
        return np.zeros(0, dtype=np.int64)
    if max_batch <= MAX_BATCH_CANDIDATES:
        return np.arange(1, max_batch + 1, dtype=np.int64)
    steps = np.arange(MAX_BATCH_CANDIDATES, dtype=np.int64)
    return 1 + steps * (max_batch - 1) // (MAX_BATCH_CANDIDATES - 1)


def decode_max_batch(limits: EngineLimits, context_length: int, kv_fallback: float) -> int:
    """Sequences that fit: ``max_num_seqs`` and the KV cache (``max_kv_tokens // ctx``).

    Without a known cache size, the largest decode KV ever observed stands in.
    """
    max_kv = limits.max_kv_tokens if limits.max_kv_tokens is not None else int(kv_fallback)
    if max_kv <= 0:
        return limits.max_num_seqs
    return min(limits.max_num_seqs, max_kv // context_length)


def prefill_capacity(
    fit: LinearFit,
    limits: EngineLimits,
    isl: int,
    ttft_ms: float | None,
    kv_hit_rate: float | None,
) -> Capacity | None:
    """Prefill engine: a batch of ``bs`` prompts takes ``chunked(bs·eff_isl)`` and
    serves ``bs`` requests, so ``rps = bs / ttft``."""
    if isl <= 0:
        return None
    mbt = limits.max_num_batched_tokens
    eff = effective_isl(isl, kv_hit_rate)
    max_batch = 1 if eff > mbt else min(limits.max_num_seqs, mbt // eff)
    bs = batch_candidates(max_batch)
    ttft_s = chunked_time_many((bs * eff).astype(np.float64), mbt, fit.predict_many)
    rps = bs / ttft_s
    ok = _within(ttft_s, ttft_ms)
    i = _best(rps, ok)
    return Capacity(float(rps[i]), int(bs[i]), float(ttft_s[i] * 1000.0), None, bool(ok[i]))


def backlog_prefill_rps(fit: LinearFit, limits: EngineLimits, isl: int, kv_hit_rate: float | None) -> float | None:
    """Prompts of ``isl`` tokens a second that a prefill engine with a queue sustains.

    :func:`prefill_capacity` takes the batch with the highest rate, as if
    the engine could keep running passes of that size. A chunked-prefill
    scheduler (vLLM's, the simulator's) does not: with prompts waiting it
    packs every pass to ``max_num_batched_tokens`` (or ``max_num_seqs``
    prompts), so the rate it sustains under load is that pass's. Where
    tokens per second peak below the budget (the H100 70B profile at TP4:
    17.6k at 4,000 tokens, 16.5k at 8,192) the best batch's rate is one no
    loaded engine reaches, and sizing at 80 % of it runs the fleet at 85 %
    of what it serves.
    """
    if isl <= 0:
        return None
    eff = effective_isl(isl, kv_hit_rate)
    tokens = float(min(limits.max_num_batched_tokens, limits.max_num_seqs * eff))  # one pass, never chunked
    return tokens / float(fit.predict_many(np.array([tokens]))[0]) / eff


def decode_capacity(
    fit: LinearFit,
    limits: EngineLimits,
    isl: int,
    osl: int,
    itl_ms: float | None,
    accept_length: float | None,
    kv_fallback: float = 0.0,
) -> Capacity | None:
    """Decode engine: ``bs`` streams of context ``ctx``; one pass yields
    ``accept_length`` tokens each, so ``itl = t(bs, bs·ctx)/accept`` and a request
    lasts ``osl·itl``: ``rps = bs / (osl·itl)`` (Little's law)."""
    if isl <= 0 or osl <= 0:
        return None
    accept = normalize_accept_length(accept_length)
    ctx = decode_context_length(isl, osl)
    bs = batch_candidates(decode_max_batch(limits, ctx, kv_fallback))
    if bs.size == 0:
        return None
    bsf = bs.astype(np.float64)
    itl_s = fit.predict_many(bsf, bsf * ctx) / accept
    rps = bsf / (osl * itl_s)
    ok = _within(itl_s, itl_ms)
    i = _best(rps, ok)
    return Capacity(
        float(rps[i]), int(bs[i]), None, float(itl_s[i] * 1000.0), bool(ok[i]), at_limit=bool(i == bs.size - 1)
    )


def agg_capacity(
    fit: LinearFit,
    limits: EngineLimits,
    isl: int,
    osl: int,
    ttft_ms: float | None,
    itl_ms: float | None,
    kv_hit_rate: float | None,
    accept_length: float | None,
    kv_fallback: float = 0.0,
) -> Capacity | None:
    """Aggregated engine: decode batch ``bs`` with chunked prefill piggybacked.

    Only balanced batches count: the prefill admitted per pass to replace
    finishing streams, ``ceil(bs·accept·eff_isl/osl)``, must fit in the token
    budget left after one token per stream (``MBT − bs``); past that point
    prefill falls behind and TTFT grows without bound. ITL is the mixed pass
    ``t(prefill_per_pass, bs·ctx)/accept``; TTFT is the new prompt chunked
    behind one pass of admitted prefill, with the batch's KV riding along.
    """
    if isl <= 0 or osl <= 0 or limits.max_num_batched_tokens <= 1:
        return None
    mbt = limits.max_num_batched_tokens
    accept = normalize_accept_length(accept_length)
    eff = effective_isl(isl, kv_hit_rate)
    ctx = decode_context_length(isl, osl)
    hard_cap = min(decode_max_batch(limits, ctx, kv_fallback), max(1, mbt - 1))
    bs = batch_candidates(hard_cap)
    if bs.size == 0:
        return None  # not one request fits the cache
    bsf = bs.astype(np.float64)
    admitted = np.ceil(bsf * accept * eff / osl)
    balanced = (mbt - bs > 0) & (admitted <= mbt - bs)
    if not balanced.any():
        return _one_at_a_time(fit, mbt, eff, ctx, osl, accept, ttft_ms, itl_ms)
    bs, bsf, admitted = bs[balanced], bsf[balanced], admitted[balanced]
    prefill_per_pass = np.minimum(float(mbt), admitted)
    decode_kv = bsf * ctx
    itl_s = fit.predict_many(prefill_per_pass, decode_kv) / accept
    ttft_s = chunked_time_many(
        prefill_per_pass + eff, mbt, lambda chunk: fit.predict_many(chunk, decode_kv)
    )
    rps = bsf / (osl * itl_s)
    ok = _within(ttft_s, ttft_ms) & _within(itl_s, itl_ms)
    i = _best(rps, ok)
    return Capacity(
        float(rps[i]), int(bs[i]), float(ttft_s[i] * 1000.0), float(itl_s[i] * 1000.0), bool(ok[i])
    )


def _one_at_a_time(
    fit: LinearFit, mbt: int, eff: float, ctx: float, osl: int, accept: float,
    ttft_ms: float | None, itl_ms: float | None,
) -> Capacity:
    """An agg engine serving one request at a time, for prompts too long to balance.

    Where even one stream's replacement prefill (``accept·eff_isl/osl``
    tokens a pass) overflows the token budget, a long prompt with a short
    answer, no batch is balanced. The engine is then prefill-bound: each
    request's prompt is chunked through whole passes, then its answer
    decoded alone. Its rate is ``1 / (ttft + osl·itl)``, within a few per
    cent of the balanced batch of 1 at the boundary (5.31 against 5.50 rps
    for a 1-token answer on the H200 8B profile); without it the search
    returned nothing and the throughput loop stopped sizing
    (``model_not_ready``).
    """
    kv = np.array([ctx])
    ttft_s = float(chunked_time_many(np.array([eff]), mbt, lambda chunk: fit.predict_many(chunk, kv))[0])
    itl_s = float(fit.predict_many(np.array([0.0]), kv)[0]) / accept
    rps = 1.0 / (ttft_s + osl * itl_s)
    ok = bool(_within(np.array([ttft_s]), ttft_ms)[0] and _within(np.array([itl_s]), itl_ms)[0])
    return Capacity(rps, 1, ttft_s * 1000.0, itl_s * 1000.0, ok)


def _within(latency_s: np.ndarray, sla_ms: float | None) -> np.ndarray:
    if sla_ms is None:
        return np.ones(latency_s.shape, dtype=bool)
    return latency_s <= sla_ms / 1000.0


def _best(rps: np.ndarray, ok: np.ndarray) -> int:
    """Highest rate among SLA-meeting candidates, else among all; first wins ties."""
    if ok.any():
        return int(np.argmax(np.where(ok, rps, -np.inf)))
    return int(np.argmax(rps))
