"""How long one forward pass of a simulated engine takes, from its profile.

The profile is read by the same code the planner uses
(:func:`fleetplan.sim.profiles.load_profile` into
:class:`fleetplan.models.perf.ProfileData`). Two ways to turn it into pass
times:

``interp`` (default): the measurements themselves, interpolated. The
simulated engine then reproduces its profile at every measured point
(docs/calibration.md), which is what a simulator that judges the planner
must do: if the engine were the planner's own linear fit, the planner could
never be wrong about it.

- prefill: TTFT(isl) measured for one prompt, linear between points; a pass
  of ``T`` prefill tokens (one chunk, any number of prompts) takes
  ``TTFT(T)``. Beyond the last point the last segment's slope continues
  where it rises (a falling one, a noisy last row, stays at the last point's
  time: carried on, it went below zero); below the first point (100 tokens in the shipped profiles) the time falls
  linearly to the cheapest measured decode pass at 0 tokens: the first
  point's TTFT includes per-request costs that a short tail chunk or a few
  piggybacked prompt tokens do not pay again, and a pass never costs less
  than a decode step.
- decode: ITL measured at (KV usage, context length) points on a few
  context levels. A pass of ``b`` sequences holding ``kv`` tokens has usage
  ``kv / max_kv_tokens`` and context ``kv / b``; the ITL is interpolated
  linearly in usage on the two nearest context levels, then between them
  linearly in ``1 / context``: at a fixed KV usage that is linear in the
  batch size, the quantity a pass's per-sequence cost scales with. Below the
  shortest level the line carries on (a batch of short contexts still pays
  per sequence), kept between the first level's time at the same usage and at
  the same batch; above the longest level, and past a level's measured usage,
  values clamp (the longest levels hardly differ at the same usage). Linear
  in the context itself would be wrong where the levels are far apart: on the shipped profiles
  the first two levels are 350 and 2,997 (8B) or 16,671 (70B) tokens, and
  a held-out level is then mispredicted by 70 % (8B) and 24 % (70B) on
  average, against 7.5 % and 3 % in ``1 / context``
  (``bench/calibrate.py``, docs/calibration.md).
- mixed (aggregated): a chunk of prefill riding with a decode batch costs
  the prefill pass plus what the decode batch adds over the cheapest
  measured decode pass (the fixed per-pass cost is paid once).

``interp-extend``: as ``interp``, except past a decode level's last
measured usage its last segment carries on where it rises, as prefill's
does. A level's rows stop where its profiler stopped (the 70B profile's
350-token level at 58 % of the cache), and whether the engine's pass time
stops growing there (``interp``) or keeps the last slope is a guess either
way; benchmarks that run engines there are run under both
(docs/calibration.md, "Past the measured usage").

``fit``: the planner's profile-seeded linear fits (:func:`seeded_perf_model`),
for experiments where the engine should behave exactly as the planner
believes.

Every function is pure Python on precomputed lists: it runs once per
simulated iteration (or macro-step), so it must cost microseconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from fleetplan.models.perf import EngineLimits, ProfileData, seeded_perf_model

TIMING_MODES = ("interp", "interp-extend", "fit")


class _Piecewise:
    """Linear interpolation on sorted x; clamped or extended above (where the last segment
    rises); below the first point clamped, or (``origin``) linear from ``(0, origin)`` to it."""

    __slots__ = ("xs", "ys", "extend")

    def __init__(self, xs, ys, extend: bool, origin: float | None = None) -> None:
        pairs = sorted(zip((float(x) for x in xs), (float(y) for y in ys), strict=True))
        # Duplicate x: keep the mean, so the curve stays a function.
        merged: dict[float, list[float]] = {}
        for x, y in pairs:
            merged.setdefault(x, []).append(y)
        self.xs = list(merged)
        self.ys = [sum(v) / len(v) for v in merged.values()]
        if origin is not None and self.xs[0] > 0 and origin < self.ys[0]:
            self.xs.insert(0, 0.0)
            self.ys.insert(0, origin)
        self.extend = extend

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        n = len(xs)
        if n == 1 or x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            if not self.extend or ys[-1] <= ys[-2]:
                return ys[-1]  # a falling last segment carried on reaches negative times
            i = n - 1
        else:
            i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class EngineTiming:
    """Pass times in seconds: ``prefill_s``, ``decode_s``, ``mixed_s``."""

    mode: str
    _prefill: object
    _decode: object
    _mixed: object
    decode_floor_s: float

    def prefill_s(self, tokens: float) -> float:
        """A pass computing ``tokens`` fresh prefill tokens (one chunk)."""
        return self._prefill(tokens)

    def decode_s(self, seqs: int, kv_tokens: float) -> float:
        """A pass of ``seqs`` decoding sequences holding ``kv_tokens`` KV tokens."""
        return self._decode(seqs, kv_tokens)

    def mixed_s(self, prefill_tokens: float, seqs: int, kv_tokens: float) -> float:
        """A pass with a prefill chunk piggybacked on a decode batch (aggregated)."""
        return self._mixed(prefill_tokens, seqs, kv_tokens)


def engine_timing(profile: ProfileData, mode: str = "interp", limits: EngineLimits | None = None) -> EngineTiming:
    if mode in ("interp", "interp-extend"):
        return _interp_timing(profile, extend_decode=mode == "interp-extend")
    if mode == "fit":
        return _fit_timing(profile, limits)
    raise ValueError(f"unknown engine timing {mode!r}; valid: {', '.join(TIMING_MODES)}")


def _interp_timing(profile: ProfileData, extend_decode: bool = False) -> EngineTiming:
    if not profile.has_prefill or not profile.has_decode:
        raise ValueError("the interp engine timing needs both prefill and decode rows in the profile")
    floor = min(profile.z_itl_ms.tolist()) / 1000.0
    prefill = _Piecewise(
        profile.prefill_isl.tolist(), (profile.prefill_ttft_ms / 1000.0).tolist(), extend=True,
        origin=floor,
    )
    max_kv = float(profile.max_kv_tokens or 1)
    levels = profile.decode_levels()
    ctxs = list(levels)
    if ctxs[0] <= 0:
        # ProfileData takes a row at context 0 (seeded as one request); between levels this
        # timing is linear in 1/context, where it was a bare ZeroDivisionError
        raise ValueError("y_context_length: the interp engine timing needs decode rows at a context > 0 "
                         f"tokens, got {ctxs[0]:g} (--engine-timing fit reads such a profile)")
    curves = [
        _Piecewise(usage.tolist(), (itl_ms / 1000.0).tolist(), extend=extend_decode) for usage, itl_ms in levels.values()
    ]
    inverse = [1.0 / c for c in ctxs]  # interpolation between levels is linear in 1/context

    def decode(seqs: int, kv: float) -> float:
        if seqs <= 0:
            return 0.0
        usage = kv / max_kv
        ctx = max(kv / seqs, 1.0)  # a sequence holds a token at least (a bench's FPM may say 0)
        if len(ctxs) == 1:
            return curves[0](usage)
        if ctx <= ctxs[0]:
            return below_first(seqs, usage, ctx)
        if ctx >= ctxs[-1]:
            return curves[-1](usage)
        i = bisect.bisect_right(ctxs, ctx)
        t0, t1 = curves[i - 1](usage), curves[i](usage)
        return t0 + (t1 - t0) * (inverse[i - 1] - 1.0 / ctx) / (inverse[i - 1] - inverse[i])

    def below_first(seqs: int, usage: float, ctx: float) -> float:
        # Shorter contexts than the first level's hold more sequences at the same usage, and
        # there a sequence costs a pass more than its KV does: the line between the first two
        # levels, in 1/context, carries on (clamped to the first level's curve instead, 256
        # sequences of 100 tokens took what 73 of 350 take, half their cost). Kept between
        # fewer sequences at the same usage and the same sequences at the first level's
        # context, so two nearly equal levels near zero usage do not magnify their noise.
        t0 = curves[0](usage)
        t1 = curves[1](usage)
        line = t0 + (t0 - t1) * (1.0 / ctx - inverse[0]) / (inverse[0] - inverse[1])
        return min(max(line, t0), curves[0](seqs * ctxs[0] / max_kv))

    def mixed(prefill_tokens: float, seqs: int, kv: float) -> float:
        if seqs <= 0:
            return prefill(prefill_tokens)
        if prefill_tokens <= 0:
            return decode(seqs, kv)
        return prefill(prefill_tokens) + max(0.0, decode(seqs, kv) - floor)

    return EngineTiming("interp-extend" if extend_decode else "interp", prefill, decode, mixed, floor)


def _fit_timing(profile: ProfileData, limits: EngineLimits | None) -> EngineTiming:
    pre = seeded_perf_model(profile, "prefill", limits).fit()
    dec = seeded_perf_model(profile, "decode", limits).fit()
    agg = seeded_perf_model(profile, "agg", limits).fit()
    if pre is None or dec is None or agg is None:
        raise ValueError("the profile has too few rows to fit the perf model")

    def prefill(tokens: float) -> float:
        return pre.predict(tokens)

    def decode(seqs: int, kv: float) -> float:
        return dec.predict(float(seqs), kv) if seqs > 0 else 0.0

    def mixed(prefill_tokens: float, seqs: int, kv: float) -> float:
        return agg.predict(prefill_tokens, kv)

    return EngineTiming("fit", prefill, decode, mixed, dec.predict(1.0, 0.0))
