"""Prefill split into ``max_num_batched_tokens`` chunks, one forward pass each.

An engine never computes more than ``max_num_batched_tokens`` prefill tokens
per iteration, and the regressions were only ever trained on passes inside
that budget, so a long prefill (or a deep queue) is timed as full chunks plus
a tail: ``full·t(MBT) + t(tail)``. The scalar and numpy versions use the same
arithmetic so per-engine and vectorised estimates agree bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def chunked_time(tokens: float, chunk: int, pass_time: Callable[[float], float]) -> float:
    """Seconds to compute ``tokens`` prefill tokens in passes of at most ``chunk``."""
    if tokens <= 0:
        return 0.0
    full = math.floor(tokens / chunk)
    tail = tokens - full * chunk
    total = full * pass_time(float(chunk)) if full else 0.0
    if tail > 0:
        total = total + pass_time(tail)
    return total


def chunked_time_many(
    tokens: np.ndarray, chunk: int, pass_time: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """Vectorised :func:`chunked_time`; ``pass_time`` maps a chunk-size column to seconds."""
    tokens = np.maximum(np.asarray(tokens, dtype=np.float64), 0.0)
    full = np.floor(tokens / chunk)
    tail = tokens - full * chunk
    full_time = np.where(full > 0, full * pass_time(np.full_like(tokens, float(chunk))), 0.0)
    return full_time + np.where(tail > 0, pass_time(tail), 0.0)
