"""The ISL/OSL mix of a window, and the per-engine capacity it really allows.

The reference sizes every role from one engine's capacity at the window's
*mean* ISL and OSL. Capacity is not linear in request size: a prompt twice
as long can need more than twice the prefill time (attention) and can push
the TTFT target out of reach on its own, and a long context eats the KV
cache so fewer decode streams fit. When a window mixes short and long
requests (bimodal code traffic, heavy-tailed document prompts) the mean
request is cheaper than the mix, and the fleet is under-provisioned.

``LengthMix`` keeps the window's requests in a few log-spaced (ISL, OSL)
buckets: count and exact length sums per bucket, so merging and
serialising are exact. ``mix_capacity`` then gives the engine's rate on
that mix by time sharing: a request of bucket b occupies ``1 / cap_b`` of
an engine-second, so an engine serving the mix sustains

    cap_mix = 1 / sum_b (share_b / cap_b)

which is the harmonic mean of the per-bucket capacities weighted by the
request shares (it equals the mean-based capacity when all requests are
alike). The throughput loop forecasts only the mean lengths, so it uses
the ratio ``cap_mix / cap_at_means`` of the last observed window as a
correction to the capacity at the forecast means (``mix_factor``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

ISL_BASE_TOKENS = 256
"""Upper edge of the first ISL bucket; each next bucket is ``BUCKET_RATIO`` times wider."""
OSL_BASE_TOKENS = 64
"""Upper edge of the first OSL bucket."""
BUCKET_RATIO = 4.0
MAX_BUCKET = 6
"""Buckets per axis minus one: ISL up to 256·4^5 = 256k tokens before the last catches all."""


def bucket_of(tokens: float, base: float) -> int:
    """Log-spaced bucket index: 0 below ``base``, then one per factor of ``BUCKET_RATIO``."""
    if tokens < base:
        return 0
    return min(1 + int(math.log(tokens / base, BUCKET_RATIO)), MAX_BUCKET)


@dataclass
class LengthMix:
    """Requests of one window by (ISL bucket, OSL bucket): ``key -> [count, sum_isl, sum_osl]``."""

    buckets: dict[str, list[float]] = field(default_factory=dict)

    def add(self, isl: float, osl: float) -> None:
        key = f"{bucket_of(isl, ISL_BASE_TOKENS)},{bucket_of(osl, OSL_BASE_TOKENS)}"
        cell = self.buckets.get(key)
        if cell is None:
            self.buckets[key] = [1, float(isl), float(osl)]
        else:
            cell[0] += 1
            cell[1] += isl
            cell[2] += osl

    @property
    def count(self) -> int:
        return int(sum(c[0] for c in self.buckets.values()))

    def groups(self) -> list[tuple[float, float, float]]:
        """(share, mean ISL, mean OSL) per bucket, in a fixed (sorted key) order."""
        total = self.count
        if total == 0:
            return []
        return [
            (c[0] / total, c[1] / c[0], c[2] / c[0])
            for _, c in sorted(self.buckets.items())
        ]

    def means(self) -> tuple[float, float]:
        """The window's mean ISL and OSL over all buckets."""
        total = self.count
        if total == 0:
            return 0.0, 0.0
        return (
            math.fsum(c[1] for c in self.buckets.values()) / total,
            math.fsum(c[2] for c in self.buckets.values()) / total,
        )

    def to_data(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.buckets.items()}

    @classmethod
    def from_data(cls, data: dict[str, list[float]]) -> LengthMix:
        return cls({k: [float(x) for x in v] for k, v in data.items()})


CapacityAt = Callable[[float, float], "float | None"]
"""``(isl, osl) -> one engine's SLA-bound rate``, or None when the model cannot say."""


def mix_capacity(mix: LengthMix, capacity_at: CapacityAt) -> float | None:
    """One engine's rate on the window's mix: the share-weighted harmonic mean."""
    seconds_per_request = 0.0
    for share, isl, osl in mix.groups():
        cap = capacity_at(isl, osl)
        if cap is None or cap <= 0:
            return None
        seconds_per_request += share / cap
    return None if seconds_per_request <= 0 else 1.0 / seconds_per_request


def mix_factor(mix: LengthMix, capacity_at: CapacityAt) -> float | None:
    """``cap_mix / cap_at_means`` of a window; None for an empty window or no model.

    Multiplying the capacity at the forecast mean lengths by this factor
    carries the window's shape over to the next window.
    """
    if mix.count == 0:
        return None
    at_means = capacity_at(*mix.means())
    mixed = mix_capacity(mix, capacity_at)
    if at_means is None or at_means <= 0 or mixed is None:
        return None
    return mixed / at_means
