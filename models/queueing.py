"""Prefill replicas from a queueing model: enough engines that prompts rarely wait past the TTFT.

The perf model's prefill capacity is the rate at which an engine is busy
all the time with batches that each finish within the TTFT target: a
saturation rate. Prompts arrive at random, so an engine fed at that rate
queues without bound, and one fed at 80% of it still makes a prompt that
arrives behind a long pass wait for it. What the SLA needs is the share of
prompts that wait longer than the TTFT leaves after their own prefill, and
that depends on how many engines share the queue (the router sends a
prompt to an idle engine when there is one).

The fleet is modelled as M/M/n (Erlang C): n engines, each serving
``engine_rps`` prompts per second, Poisson arrivals at ``demand_rps``. A
prompt waits with probability ``C(n, a)`` (a = demand / engine rate, the
busy engines on average) and, if it waits, longer than t with probability
``exp(-(n·mu - lambda)·t)``. The loop takes the fewest engines for which

    C(n, a) · exp(-(n·mu - lambda) · budget) <= 1 - share

with ``budget = ttft - service`` (the TTFT left after the prompt's own
pass) and ``share`` the SLA attainment aimed for (``queueing_sla_share``).
With the window's length mix the budget is per class of prompt (one per
(ISL, OSL) bucket of ``models/mix.py``, at the bucket's mean prompt): all
classes share the queue, each has its own ``budget``, and the share is met
on the share-weighted average. Classes
whose own pass already takes the whole TTFT are left out. That matters at
tight targets on long-prompt traffic, where the *mean* prompt cannot meet
the TTFT at all and a mean-based floor would have nothing to say, while
the short prompts still make it if an engine is free when they arrive.

Arrivals are not Poisson: their burstiness stretches the wait tail by a
factor ``k`` (``wait_stretch``): Kingman's ``(1 + D) / 2`` for an index of
dispersion ``D`` measured at one time scale, or, from the dispersion at
1 to 16 s, the stretch the Gaussian approximation of the queue gives at
the scale where a backlog builds (bursts that last seconds count more the
closer the fleet runs to its capacity).

Exponential service is pessimistic for prefill (pass times vary little),
which is the safe side; large fleets come out close to the rate-based
count (square-root staffing), small ones get the headroom they need.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from scipy.special import pdtr

MAX_EXTRA_ENGINES = 10_000
MAX_ENGINES = 100_000
"""Most engines of one role any sizing returns: no GPU budget holds more (``MAX_GPU_BUDGET``),
and past 2**53 engines the Erlang arithmetic breaks in floats (a seeded window of 1e12
requests of 600k tokens asked for 2e19)."""
RECURSION_SERVERS = 256
"""Up to this many servers (engines) Erlang B comes from its recursion; past it (decode slots), from
the Poisson law, which agrees with it to 3e-10 (257 to 300,000 servers) and costs 5 µs where the
recursion costs 0.13 ms at 1,024 (bench/bench_queueing.py)."""


def erlang_c(servers: int, offered: float) -> float:
    """Probability an arrival waits in M/M/servers with offered load ``offered`` (< servers)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    if servers <= RECURSION_SERVERS:
        blocking = 1.0  # Erlang B, by the stable recursion
        for k in range(1, servers + 1):
            blocking = offered * blocking / (k + offered * blocking)
    else:
        # decode slots number in the thousands: Erlang B is P(X = n) / P(X <= n) for X ~ Poisson(a),
        # in O(1) where the recursion takes O(n)
        log_pmf = servers * math.log(offered) - offered - math.lgamma(servers + 1)
        blocking = min(1.0, math.exp(log_pmf) / float(pdtr(servers, offered)))
    return servers * blocking / (servers - offered * (1.0 - blocking))


def wait_exceeds(
    servers: int, demand_rps: float, engine_rps: float, budget_s: float, arrival_dispersion: Dispersion = 1.0,
) -> float:
    """P(a prompt waits longer than ``budget_s``) with ``servers`` engines."""
    return miss_share(servers, demand_rps, engine_rps, [(1.0, budget_s)], arrival_dispersion)


Budgets = float | Sequence[tuple[float, float]]
"""One wait budget (s) for every prompt, or ``(share, budget_s)`` per class of prompt."""

Dispersion = float | Sequence[Sequence[float]]
"""The arrivals' index of dispersion: one number, or ``(tau_s, I)`` per time scale (``wait_stretch``)."""


def budget_classes(budget: Budgets) -> list[tuple[float, float]]:
    """The prompt classes that any number of engines can serve in time (budget > 0)."""
    classes = [(1.0, budget)] if isinstance(budget, int | float) else list(budget)
    return [(share, b) for share, b in classes if share > 0 and b > 0]


def miss_share(
    servers: int, demand_rps: float, engine_rps: float, classes: Sequence[tuple[float, float]],
    arrival_dispersion: Dispersion = 1.0,
) -> float:
    """Share of the prompts that wait past their budget, all classes in one queue.

    One class waits past ``t`` with probability ``C(n, a) · exp(-(n·mu -
    lambda) · t / k)``; only ``t`` differs between classes.
    """
    offered = demand_rps / engine_rps
    if offered >= servers:
        return 1.0
    waits = erlang_c(servers, offered)
    capacity = servers * engine_rps
    shares = np.array([share for share, _ in classes], dtype=float)
    budgets = np.array([b for _, b in classes], dtype=float)
    stretch = wait_stretches(arrival_dispersion, capacity, demand_rps, budgets)
    tails = waits * np.exp(-(capacity - demand_rps) * budgets / stretch)
    return math.fsum((shares * tails).tolist()) / math.fsum(shares.tolist())


def dispersion_points(dispersion: Dispersion) -> list[tuple[float, float]]:
    """``[(tau_s, I), ...]`` of a dispersion: a single number is the 1-s point, as it is measured."""
    if isinstance(dispersion, int | float):
        return [(1.0, float(dispersion))]
    return [(float(t), float(i)) for t, i in dispersion]


def wait_stretch(dispersion: Dispersion, capacity_rps: float, demand_rps: float, budget_s: float) -> float:
    """How many times longer than Poisson arrivals' the wait tail is: ``k`` in ``exp(-(C - lambda) t / k)``.

    A number is the index of dispersion ``D`` of the arrivals at one time
    scale, taken for every scale: Kingman's ``k = (1 + D) / 2`` (with
    exponential service). A curve ``[(tau, I(tau)), ...]`` says how the
    dispersion changes with the time scale, and the wait then depends on
    the scale at which a backlog of ``budget`` builds up. In the Gaussian
    approximation of a queue (the most probable way to a backlog x = C·t
    takes the time tau that minimises ``(x + (C - lambda)·tau)² / (2·V(tau))``,
    V(tau) = lambda·tau·(I(tau) + 1) the variance of arrivals plus service
    over tau), the tail's exponent is that minimum, and ``k`` is what makes
    the Erlang form match it. A flat curve gives Kingman's ``k`` exactly;
    a curve that grows with tau (bursts that last seconds) gives a larger
    one, the more so the closer the fleet runs to its capacity, since the
    critical scale ``x / (C - lambda)`` then grows. ``I`` is taken flat
    below the curve's first scale and beyond its last; never below 1.
    """
    return float(wait_stretches(dispersion, capacity_rps, demand_rps, np.array([budget_s], dtype=float))[0])


def wait_stretches(dispersion: Dispersion, capacity_rps: float, demand_rps: float, budgets_s: np.ndarray) -> np.ndarray:
    """``wait_stretch`` for several wait budgets at once (one per class of prompt)."""
    if isinstance(dispersion, int | float):
        return np.full(budgets_s.shape, _kingman(float(dispersion)))
    curve = tuple(dispersion_points(dispersion))
    if not curve:
        return np.ones(budgets_s.shape)
    spare = capacity_rps - demand_rps
    kingman = _kingman(curve[0][1])
    if spare <= 0 or demand_rps <= 0:
        return np.full(budgets_s.shape, kingman)
    grid, grid_variance, log_scales, values = _curve_grid(curve)
    backlog = capacity_rps * np.maximum(budgets_s, 0.0)
    # the grid, and each budget's critical scale of a flat curve (so a flat minimum is exact)
    scan = ((backlog[:, None] + spare * grid[None, :]) ** 2 / grid_variance[None, :]).min(axis=1)
    critical = np.maximum(backlog / spare, 1e-12)
    at_critical = (backlog + spare * critical) ** 2 / (
        critical * (np.interp(np.log(critical), log_scales, values) + 1.0))
    best = np.minimum(scan, at_critical) / (2.0 * demand_rps)
    out = np.full(budgets_s.shape, kingman)
    live = backlog > 0
    out[live] = np.maximum(1.0, spare * backlog[live] / (demand_rps * best[live]))
    return out


def _kingman(dispersion: float) -> float:
    """Kingman's heavy-traffic stretch ``(c_a² + c_s²) / 2`` with ``c_s² = 1``; never below Poisson's."""
    return max(1.0, (dispersion + 1.0) / 2.0)


@functools.lru_cache(maxsize=64)
def _curve_grid(curve: tuple[tuple[float, float], ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The time scales the stretch is minimised over, and ``tau·(I(tau) + 1)`` at each.

    Eight scales per doubling, from a 64th of the curve's first scale to
    four times its last; ``I`` is linear in log tau between the curve's
    points and flat outside them. Cached: a window's curve serves every
    engine count and prompt class the floor tries.
    """
    log_scales = np.log(np.array([t for t, _ in curve]))
    values = np.array([i for _, i in curve])
    lo, hi = curve[0][0] / 64.0, curve[-1][0] * 4.0
    steps = int(math.ceil(math.log2(hi / lo) * 8))
    grid = lo * 2.0 ** (np.arange(steps + 1) / 8.0)
    variance = grid * (np.interp(np.log(grid), log_scales, values) + 1.0)
    return grid, variance, log_scales, values


def queueing_replicas(
    demand_rps: float, engine_rps: float, budget_s: Budgets, share: float, minimum: int,
    arrival_dispersion: Dispersion = 1.0,
) -> int | None:
    """Fewest engines keeping the share of prompts that wait too long <= ``1 - share``.

    ``budget_s`` is the wait one prompt can afford, or per class of prompt
    ``(share, budget)``: a window mixing short and long prompts leaves each a
    different budget, and prompts whose own prefill takes the whole TTFT
    (budget <= 0) are left out, since no number of engines serves them in
    time. None if no prompt has a budget: the caller falls back to sizing by rate.
    """
    if demand_rps <= 0:
        return minimum
    if engine_rps <= 0:
        raise ValueError("engine capacity must be positive")
    classes = budget_classes(budget_s)
    if not classes:
        return None
    return _fewest(
        demand_rps / engine_rps, share, minimum,
        lambda n: miss_share(n, demand_rps, engine_rps, classes, arrival_dispersion),
    )


def slot_replicas(
    demand_rps: float, engine_rps: float, slots: int, budget_s: Budgets, share: float, minimum: int,
    arrival_dispersion: Dispersion = 1.0, rest: tuple[float, float] | None = None,
) -> int | None:
    """Fewest decode engines keeping the share of requests that wait too long for a slot <= ``1 - share``.

    Where the decode rate is set by the engine's sequence or KV limit, not
    by the ITL target, a request that finds every one of the ``slots``
    batch places taken waits for one to free, and that wait is spread over
    its answer: the ITL it is measured by is ``(end - first token) / (osl -
    1)``. The ITL target then leaves ``(itl - itl at the limit) · (osl - 1)``
    seconds of waiting (``budget_s``, one per OSL class). The fleet is
    M/M/c over its slots (``c = engines · slots``, each freeing at
    ``engine_rps / slots``); with thousands of slots the wait probability
    falls steeply past the mean load, so the fleet can run closer to its
    limit than a fixed utilisation allows, and no closer than the budget
    says. None if no class has a budget.

    ``rest`` ``(share, rps)``: only part of the requests arrive at
    ``demand_rps`` (a window's busiest burst); ``share`` of them arrive at
    ``rps``, and the share that waits too long is the two parts' misses
    weighted by their requests (``window_miss_share``), never on fewer
    engines than the burst's rate needs.
    """
    if demand_rps <= 0:
        return minimum
    if engine_rps <= 0 or slots <= 0:
        raise ValueError("engine capacity and slots must be positive")
    classes = budget_classes(budget_s)
    if not classes:
        return None
    slot_rps = engine_rps / slots
    rest_share, rest_rps = rest if rest is not None else (0.0, 0.0)

    def miss(n: int) -> float:
        return window_miss_share(
            lambda rps: miss_share(n * slots, rps, slot_rps, classes, arrival_dispersion),
            demand_rps, rest_share, rest_rps,
        )

    # searched from the burst's rate, not the rest's: under it the burst's backlog runs into the
    # window's other seconds, which no steady miss at the rest's rate sees (and a burst far over
    # the rest ran the search out of MAX_EXTRA_ENGINES)
    return _fewest(demand_rps / engine_rps, share, minimum, miss)


def window_miss_share(miss_at, burst_rps: float, rest_share: float, rest_rps: float) -> float:
    """The share of a window's requests that miss, its busiest burst and the rest each at its own rate.

    The SLA counts requests, and the busiest burst holds only part of a
    window's. Held to ``1 - share`` at the burst's rate, every request of
    the window is sized as if it arrived in the burst: a minute a few
    percent over its window, on a fleet near its batch limit, asks for an
    engine the window's other minutes do not need. ``miss_at(rps)`` is the
    share that misses at a steady ``rps``; the burst's requests weigh
    ``1 - rest_share``, so a burst that holds most of a window (a spike)
    still sizes for itself.
    """
    burst = miss_at(burst_rps) * (1.0 - rest_share)
    if rest_share <= 0 or rest_rps <= 0:
        return burst
    return burst + rest_share * miss_at(rest_rps)


def _fewest(offered_engines: float, share: float, minimum: int, miss) -> int:
    """The fewest engines past ``offered_engines`` whose ``miss(n)`` is at most ``1 - share``."""
    if offered_engines >= MAX_ENGINES:
        return MAX_ENGINES
    n = max(math.floor(offered_engines) + 1, 1)
    for _ in range(MAX_EXTRA_ENGINES):
        if n >= MAX_ENGINES or miss(n) <= 1.0 - share:
            break
        n += 1
    return min(max(n, minimum), MAX_ENGINES)
