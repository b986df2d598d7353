"""Knobs of the online regressions, under Dynamo's config names and defaults.

A Dynamo user carries ``max_num_fpm_samples``, ``fpm_sample_bucket_size`` and
``load_min_observations`` over unchanged. ``nonnegative_intercept`` is ours:
Dynamo's legacy fit leaves the intercept free (only slopes must be >= 0), which
is what reproduces its published capacity figures; pinning the intercept at
>= 0 is available for engines whose profile is far from linear.
``prefill_quadratic`` is ours too: a curve in the prompt tokens instead of
Dynamo's line (``QuadraticFit``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class RegressionSettings:
    max_num_fpm_samples: int = 64
    fpm_sample_bucket_size: int = 16
    load_min_observations: int = 5
    nonnegative_intercept: bool = False
    prefill_quadratic: bool = False
    """Fit prefill pass time as a + b·t + c·t² (fleetplan's default through the
    planner config); False keeps Dynamo's straight line."""

    def __post_init__(self) -> None:
        if self.max_num_fpm_samples < 1:
            raise ValueError("max_num_fpm_samples must be >= 1")
        if self.load_min_observations < 1:
            raise ValueError("load_min_observations must be >= 1")
        size = self.fpm_sample_bucket_size
        # The 2D models split the buckets into a square grid, so the count must be square.
        if size < 1 or math.isqrt(size) ** 2 != size:
            raise ValueError(f"fpm_sample_bucket_size must be a perfect square, got {size}")

    @property
    def average_window(self) -> int:
        """Moving averages look back as many FPMs as the regression keeps."""
        return self.max_num_fpm_samples

    def buckets_per_axis(self, ndim: int) -> int:
        return self.fpm_sample_bucket_size if ndim == 1 else math.isqrt(self.fpm_sample_bucket_size)

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RegressionSettings:
        return cls(**state)
