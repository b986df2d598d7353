"""How a request's shape and the traffic's cache/speculation figures enter the model.

Shared by the estimates and the capacity search so both read the inputs the
same way (Dynamo 1.6.1 ``engine_query`` semantics).
"""

from __future__ import annotations

import math

MAX_KV_HIT_RATE = 0.95
"""A prefix-cache hit never removes all prefill work; capping the discount at
95% keeps a near-100% observed hit rate from predicting free prefills."""


def clamp_kv_hit_rate(kv_hit_rate: float | None) -> float:
    """None or NaN means "unknown", which counts as no cache hits."""
    if kv_hit_rate is None or not math.isfinite(kv_hit_rate):
        return 0.0
    return min(MAX_KV_HIT_RATE, max(0.0, kv_hit_rate))


def prefill_work_tokens(queued_tokens, fresh_prompt_tokens: float, kv_hit_rate: float | None):
    """Tokens a new prompt waits for and computes: the queue net of cache hits, then its own.

    The queue's ``sum_prefill_tokens`` are raw prompt tokens (hits are not
    known until a prompt is scheduled), so they are discounted by the hit
    rate. The prompt's own length is the engine's learned ``avg_isl``,
    taken from scheduled passes whose ``sum_prefill_tokens`` are fresh
    tokens, hits already excluded: discounting it again counted each hit
    twice. Dynamo (``(queued + avg_isl)·(1 − kv)``) does; at a 0.5 hit rate
    that halved the prompt's own time. Works on floats and numpy arrays.
    """
    return queued_tokens * (1.0 - clamp_kv_hit_rate(kv_hit_rate)) + fresh_prompt_tokens


def normalize_accept_length(accept_length: float | None) -> float:
    """Speculative decoding emits ``accept_length`` tokens per step; < 1 is noise."""
    if accept_length is None or not math.isfinite(accept_length) or accept_length <= 1.0:
        return 1.0
    return float(accept_length)


def effective_isl(isl: int, kv_hit_rate: float | None) -> int:
    """Prefill tokens actually computed: cache hits are skipped, at least one token is not."""
    return max(1, math.ceil(isl * (1.0 - clamp_kv_hit_rate(kv_hit_rate))))


def decode_context_length(isl: int, osl: int) -> int:
    """Average KV held by a decoding request: the full prompt (cache hits still occupy
    KV) plus half the output."""
    return max(1, isl + osl // 2)


def scaled_load(tokens: float, scale: float) -> float:
    """Load a survivor would carry if its share grew by ``scale`` (consolidation checks).

    Whole tokens, as Dynamo truncates; ``scale == 1`` leaves the value untouched.
    """
    if scale == 1.0:
        return tokens
    return float(math.floor(tokens * scale))
