"""The load loop: replicas from each engine's latest forward pass.

Scale-up needs *every* engine of a role over the SLA (one hot engine is a
routing problem, not a capacity problem). Dynamo then adds one engine;
with ``load_max_scale_up_step`` above 1 the loop adds the fewest engines
that would bring every engine back within the SLA, its load spread over
``N + k`` engines (the consolidation check run the other way), so a fleet
far behind a ramp does not wait a startup per engine it is short. Scale-down is consolidation-aware
(Dynamo PR #9294): it asks what each engine would look like carrying its
share of a removed engine's load, ``N/(N-1)`` times its queue, and goes down
only if every engine would still be within the SLA with margin
``load_scaling_down_sensitivity``. This removes the 2↔1 oscillation of a
flat threshold (Dynamo's ``core/load_scaling.py``). Both roles keep that margin on the
part of the latency the load adds, above what the engine takes alone
(decode: ``decode_scale_down``), so an engine slow on its own is not
locked out of scale-down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetplan.models.config import PlannerConfig
from fleetplan.schemas.events import ForwardPassMetrics


@dataclass(frozen=True)
class LoadSignal:
    """One role's verdict: engines to add (> 0), -1 to release one, 0 to hold; with the worst estimates."""

    step: int
    reason: str
    ttft_ms: float | None = None
    itl_ms: float | None = None


@dataclass(frozen=True)
class EngineLoads:
    """The load columns of a role's engines, one entry per engine (latest FPM).

    Estimates run vectorised over these, so a 1,000-engine tick stays cheap.
    """

    queued_prefill: np.ndarray
    scheduled_kv: np.ndarray
    queued_kv: np.ndarray
    # the workers the entries belong to (an attention-DP worker reports one entry per rank); None: one each
    num_workers: int | None = None

    @classmethod
    def of(cls, engines: Sequence[ForwardPassMetrics]) -> EngineLoads:
        return cls(
            np.array([f.queued.sum_prefill_tokens for f in engines], dtype=np.float64),
            np.array([f.scheduled.sum_decode_kv_tokens for f in engines], dtype=np.float64),
            np.array([f.queued.sum_decode_kv_tokens for f in engines], dtype=np.float64),
            num_workers=_workers(engines),
        )

    def __len__(self) -> int:
        return len(self.queued_prefill)

    @property
    def workers(self) -> int:
        """Engines a scaling step adds or releases: workers, each with all its DP ranks."""
        return len(self) if self.num_workers is None else self.num_workers


def _workers(engines: Sequence[ForwardPassMetrics]) -> int:
    return len({f.worker_id for f in engines})


def _ttft(model, loads: EngineLoads, kv_hit: float, queue_scale: float = 1.0,
          decode_scale: float = 1.0) -> np.ndarray | None:
    if model.role == "agg":
        return model.estimate_ttft_ms_many(
            loads.queued_prefill, loads.scheduled_kv, kv_hit, queue_scale, decode_scale
        )
    return model.estimate_ttft_ms_many(loads.queued_prefill, kv_hit, queue_scale)


def prefill_signal(
    config: PlannerConfig, model, loads: EngineLoads, kv_hit_rate: float
) -> LoadSignal:
    """TTFT-driven verdict for prefill (or the prefill side of agg)."""
    n = loads.workers  # a release takes a whole worker: its ranks' load moves to the others
    est = _ttft(model, loads, kv_hit_rate)
    if est is None:
        return LoadSignal(0, "insufficient_data")
    worst = float(est.max())
    if bool((est > config.ttft_ms).all()):
        def within(scale: float) -> bool:
            post = _ttft(model, loads, kv_hit_rate, queue_scale=scale, decode_scale=scale)
            return bool((post <= config.ttft_ms).all())
        return LoadSignal(_scale_up_step(config, n, within), "scale_up", ttft_ms=worst)
    if n > 1:
        s = config.load_scaling_down_sensitivity / 100.0
        scale = n / (n - 1)
        # the request's own time on the survivor: no queue, but (agg) the decode KV it absorbs,
        # as Dynamo times it; at today's KV the KV growth was charged to the queue's margin
        own = _ttft(model, loads, kv_hit_rate, queue_scale=0.0, decode_scale=scale)
        post = _ttft(model, loads, kv_hit_rate, queue_scale=scale, decode_scale=scale)
        if bool((post - own < (config.ttft_ms - own) * s).all()):
            return LoadSignal(-1, "scale_down", ttft_ms=worst)
        return LoadSignal(0, "scale_down_refused_consolidation", ttft_ms=worst)
    return LoadSignal(0, "no_change", ttft_ms=worst)


def decode_signal(
    config: PlannerConfig, model, loads: EngineLoads, accept_length: float
) -> LoadSignal:
    """ITL-driven verdict for decode (or the decode side of agg).

    Aggregated engines count queued prefill as KV in the scale-down check,
    since those prompts become decode KV once prefilled (as Dynamo does).
    """
    n = loads.workers  # a release takes a whole worker: its ranks' load moves to the others
    kv = loads.scheduled_kv + loads.queued_kv
    est = model.estimate_itl_ms_many(kv, accept_length)
    if est is None:
        return LoadSignal(0, "insufficient_data")
    worst = float(est.max())
    if bool((est > config.itl_ms).all()):
        def within(scale: float) -> bool:
            return bool((model.estimate_itl_ms_many(kv, accept_length, load_scale=scale) <= config.itl_ms).all())
        return LoadSignal(_scale_up_step(config, n, within), "scale_up", itl_ms=worst)
    if n > 1:
        scale = n / (n - 1)
        if model.role == "agg":
            kv = kv + loads.queued_prefill
        max_kv = model.limits.max_kv_tokens
        fits = True if max_kv is None else bool((kv * scale < max_kv).all())
        post = model.estimate_itl_ms_many(kv, accept_length, load_scale=scale)
        if fits and bool((post < _itl_scale_down_bound(config, model, accept_length)).all()):
            return LoadSignal(-1, "scale_down", itl_ms=worst)
        return LoadSignal(0, "scale_down_refused_consolidation", itl_ms=worst)
    return LoadSignal(0, "no_change", itl_ms=worst)


def _scale_up_step(config: PlannerConfig, n: int, within) -> int:
    """Engines to add: the fewest ``k`` for which ``within(n / (n + k))`` holds.

    ``within(scale)`` says whether every engine, carrying ``scale`` times
    its load, meets the SLA. Capped at ``load_max_scale_up_step`` (Dynamo:
    1); the cap is the answer when no step within it is enough, as when a
    backlog has built up that only time drains. When no count of engines
    would do (an engine alone misses the target), one engine, as Dynamo
    adds: more would cost without helping.
    """
    cap = config.load_max_scale_up_step
    if cap == 1 or not within(0.0):
        return 1
    for k in range(1, cap):
        if within(n / (n + k)):
            return k
    return cap


def _itl_scale_down_bound(config: PlannerConfig, model, accept_length: float) -> float:
    """The ITL every engine must stay under, one engine fewer, to release one.

    ``absolute`` is Dynamo's ``s × target``. On an engine whose one-sequence
    ITL is already above that (a 70B TP2 engine takes 17.8 ms against 0.8 ×
    20 ms) no engine is ever released and the load loop only grows the
    fleet, so ``above_floor`` keeps the margin on the part of the ITL the
    load adds: ``floor + s × (target − floor)``, the form the prefill rule
    uses with the engine's own TTFT (docs/sizing.md).
    """
    s = config.load_scaling_down_sensitivity / 100.0
    if config.decode_scale_down == "absolute":
        return config.itl_ms * s
    floor = model.estimate_itl_floor_ms(accept_length)
    return floor + s * (config.itl_ms - floor)


def agg_signal(
    config: PlannerConfig, model, loads: EngineLoads, kv_hit_rate: float, accept_length: float,
) -> LoadSignal:
    """Aggregated engines: up if either side says up (by the larger step), down only if both agree."""
    pre = prefill_signal(config, model, loads, kv_hit_rate)
    dec = decode_signal(config, model, loads, accept_length)
    ttft, itl = pre.ttft_ms, dec.itl_ms
    if pre.reason == "insufficient_data" and dec.reason == "insufficient_data":
        return LoadSignal(0, "insufficient_data")
    if pre.step > 0 or dec.step > 0:
        return LoadSignal(max(pre.step, dec.step), "scale_up", ttft, itl)
    if pre.step < 0 and dec.step < 0:
        return LoadSignal(-1, "scale_down", ttft, itl)
    if pre.step < 0 or dec.step < 0:
        return LoadSignal(0, "scale_down_refused_consolidation", ttft, itl)
    return LoadSignal(0, "no_change", ttft, itl)


# --- threshold ("easy") targets: throughput, latency, load -------------------

_PREFILL_THRESHOLDS = {"throughput": (1.0, 0.1), "latency": (0.1, 0.0)}
_DECODE_THRESHOLDS = {"throughput": (1.0, 0.6), "latency": (0.4, 0.1)}


def threshold_signal(
    config: PlannerConfig, role: str, engines: Sequence[ForwardPassMetrics],
    context_length: int | None, max_kv_tokens: int | None,
) -> LoadSignal:
    """Static-threshold scaling that needs no perf model (Dynamo's easy modes).

    Prefill looks at queued prompt tokens per context length, decode at KV
    utilisation; up if any engine is over, down if all are under and the
    remaining engines would not cross the up threshold (consolidation guard).
    Agg engines are judged as Dynamo's ``_agg_easy_decision`` judges them, by
    KV utilisation alone with the queued prompts counted as KV: a prefill
    vote on top scaled up agg engines with 2 % of their cache in use once
    ``context_length`` was set.
    """
    target = config.optimization_target
    n = _workers(engines)
    votes: list[int] = []
    if role == "prefill" and context_length:
        if target == "load":
            up = config.prefill_scale_up_queue_tokens / context_length
            down = config.prefill_scale_down_queue_tokens / context_length
        else:
            up, down = _PREFILL_THRESHOLDS[target]
        ratios = [f.queued.sum_prefill_tokens / context_length for f in engines]
        votes.append(_threshold_vote(ratios, up, down, n, strict_zero=(target == "latency")))
    if role in ("decode", "agg") and max_kv_tokens:
        if target == "load":
            up = config.decode_scale_up_kv_rate / 100.0
            down = config.decode_scale_down_kv_rate / 100.0
        else:
            up, down = _DECODE_THRESHOLDS[target]
        utils = []
        for f in engines:
            kv = f.scheduled.sum_decode_kv_tokens + f.queued.sum_decode_kv_tokens
            if role == "agg":
                kv += f.queued.sum_prefill_tokens
            utils.append(kv / max_kv_tokens)
        votes.append(_threshold_vote(utils, up, down, n, strict_zero=False, up_inclusive=False))
    if not votes:
        return LoadSignal(0, "insufficient_data")
    if any(v > 0 for v in votes):
        return LoadSignal(+1, "scale_up")
    if all(v < 0 for v in votes):
        return LoadSignal(-1, "scale_down")
    return LoadSignal(0, "no_change")


def _threshold_vote(
    values: Sequence[float], up: float, down: float, n: int,
    *, strict_zero: bool, up_inclusive: bool = True,
) -> int:
    over = (lambda v: v >= up) if up_inclusive else (lambda v: v > up)
    if any(over(v) for v in values):
        return +1
    under = all(v == 0 for v in values) if strict_zero else all(v < down for v in values)
    if under and n > 1 and not over(max(values) * n / (n - 1)):
        return -1
    return 0
