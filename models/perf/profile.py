"""Profiling data, and how it seeds the regressions before any live FPM arrives.

A planner that starts cold cannot size anything until engines have run a
while. Dynamo (since PR #7961) turns each row of the profiler's NPZ into a
synthetic FPM and feeds it to the regressions exactly like a live one, so the
profile is the prior and live traffic corrects it (Dynamo's ``monitoring/perf_metrics.py``):

- prefill row (isl, ttft): one request of ``isl`` fresh tokens, wall time ttft;
- decode row (kv_usage, ctx, itl): ``round(kv_usage·max_kv_tokens)`` KV tokens
  held by ``max(1, round(kv/ctx))`` requests, wall time itl.

Seeds go through the moving averages too (Dynamo's reference figure "TTFT
0.62 s behind a 20k-token queue" relies on ``avg_isl`` being the profile's
mean ISL until traffic replaces it). The shipped profiles have 17–41 rows per
role, fewer than the 64 retained samples, so retention keeps every seed; once
live FPMs crowd a bucket, the oldest samples of that bucket go first, which
are the seeds there, while seeds in buckets traffic never reaches survive.

This module is pure: reading files is :mod:`fleetplan.sim.profiles`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from fleetplan.models.perf.columns import FpmColumns
from fleetplan.schemas import Role
from fleetplan.schemas.events import MAX_REQUEST_TOKENS

FILE_KEYS = {
    "prefill_isl": "prefill_isl",
    "prefill_ttft_ms": "prefill_ttft",
    "x_kv_usage": "x_kv_usage",
    "y_context_length": "y_context_length",
    "z_itl_ms": "z_itl",
    "max_kv_tokens": "max_kv_tokens",
}
"""ProfileData field -> key in Dynamo's NPZ/JSON files (TTFT and ITL are in ms there)."""

_PREFILL = ("prefill_isl", "prefill_ttft_ms")
_DECODE = ("x_kv_usage", "y_context_length", "z_itl_ms")


class InvalidProfile(ValueError):
    """A profile array is missing its partner, mis-shaped or out of range; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@dataclass(frozen=True, eq=False)
class ProfileData:
    """One engine configuration's measured prefill TTFT and decode ITL.

    Either role may be empty (a prefill-only profile); arrays are read-only
    float64 vectors.
    """

    prefill_isl: np.ndarray
    prefill_ttft_ms: np.ndarray
    x_kv_usage: np.ndarray
    y_context_length: np.ndarray
    z_itl_ms: np.ndarray
    max_kv_tokens: int | None = None
    name: str | None = None
    gpu: str | None = None
    model: str | None = None
    tp: int | None = None
    engine_gpus: int | None = None
    """GPUs one engine of the measured config uses (tp·dp·pp), where the file says."""

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in _PREFILL + _DECODE:
                object.__setattr__(self, f.name, _vector(f.name, getattr(self, f.name)))
        _same_length(self, _PREFILL)
        _same_length(self, _DECODE)
        # lengths of one request, bounded as a request's are (MAX_REQUEST_TOKENS): a prompt of
        # 1e200 tokens overflowed the prefill fit to NaN, and the first tick raised on it
        _check(self, "prefill_isl", lambda a: (a > 0) & (a <= MAX_REQUEST_TOKENS),
               f"must be > 0 and at most {MAX_REQUEST_TOKENS:,} tokens")
        _check(self, "prefill_ttft_ms", lambda a: a > 0, "must be > 0 ms")
        _check(self, "x_kv_usage", lambda a: (a >= 0) & (a <= 1), "must be a fraction in [0, 1]")
        _check(self, "y_context_length", lambda a: (a >= 0) & (a <= MAX_REQUEST_TOKENS),
               f"must be >= 0 and at most {MAX_REQUEST_TOKENS:,} tokens")
        _check(self, "z_itl_ms", lambda a: a > 0, "must be > 0 ms")
        if self.has_decode:
            kv = self.max_kv_tokens
            if isinstance(kv, bool) or not isinstance(kv, int | np.integer) or kv <= 0:
                raise InvalidProfile("max_kv_tokens", f"must be a positive integer, got {kv!r}")
            object.__setattr__(self, "max_kv_tokens", int(kv))
        if not self.has_prefill and not self.has_decode:
            raise InvalidProfile("prefill_isl", "profile has no prefill and no decode rows")

    @property
    def has_prefill(self) -> bool:
        return self.prefill_isl.size > 0

    @property
    def has_decode(self) -> bool:
        return self.x_kv_usage.size > 0

    def decode_levels(self) -> dict[float, tuple[np.ndarray, np.ndarray]]:
        """The decode rows by measured context length, shortest first.

        Each level is (KV usage ascending, ITL ms): one measured curve, which
        the simulated engine interpolates along and between.
        """
        levels = {}
        for ctx in np.unique(self.y_context_length).tolist():
            at = self.y_context_length == ctx
            order = np.argsort(self.x_kv_usage[at], kind="stable")
            levels[ctx] = (self.x_kv_usage[at][order], self.z_itl_ms[at][order])
        return levels


def seed_samples(profile: ProfileData, role: Role) -> FpmColumns:
    """The profile as synthetic FPM columns for a role's model.

    Agg engines get both: prefill rows as pure-prefill passes and decode rows
    as pure-decode passes, so both slopes of the 2D agg fit are anchored
    (Dynamo seeds agg from decode rows only, leaving the prefill slope
    unknown until traffic arrives).
    """
    parts = []
    if role in ("prefill", "agg"):
        parts.append(_prefill_rows(profile))
    if role in ("decode", "agg"):
        parts.append(_decode_rows(profile))
    if not parts:
        raise ValueError(f"unknown role {role!r}")
    return FpmColumns(*(np.concatenate([p[i] for p in parts]) for i in range(5)))


def _prefill_rows(profile: ProfileData) -> tuple[np.ndarray, ...]:
    n = profile.prefill_isl.size
    zeros = np.zeros(n)
    return (
        profile.prefill_ttft_ms / 1000.0,
        np.ones(n),
        np.rint(profile.prefill_isl),
        zeros,
        zeros,
    )


def _decode_rows(profile: ProfileData) -> tuple[np.ndarray, ...]:
    n = profile.x_kv_usage.size
    if n == 0:
        return tuple(np.zeros(0) for _ in range(5))
    assert profile.max_kv_tokens is not None
    kv = np.rint(profile.x_kv_usage * profile.max_kv_tokens)
    ctx = profile.y_context_length
    requests = np.where(ctx > 0, np.maximum(1.0, np.rint(kv / np.where(ctx > 0, ctx, 1.0))), 1.0)
    zeros = np.zeros(n)
    return (profile.z_itl_ms / 1000.0, zeros, zeros, requests, kv)


def _vector(key: str, value: object) -> np.ndarray:
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidProfile(key, f"not numeric ({exc})") from None
    if array.ndim != 1:
        raise InvalidProfile(key, f"expected a 1-D array, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise InvalidProfile(key, "contains NaN or infinity")
    array.setflags(write=False)
    return array


def _same_length(profile: ProfileData, names: tuple[str, ...]) -> None:
    sizes = {name: getattr(profile, name).size for name in names}
    if len(set(sizes.values())) > 1:
        bad = names[1] if sizes[names[1]] != sizes[names[0]] else names[-1]
        raise InvalidProfile(bad, f"lengths differ: {sizes}")


def _check(profile: ProfileData, name: str, ok, message: str) -> None:
    array = getattr(profile, name)
    if array.size and not ok(array).all():
        raise InvalidProfile(name, message)
