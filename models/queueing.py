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
ISL bucket, ``models/mix.py``): all classes share the queue, each has its
own ``budget``, and the share is met on the share-weighted average. Classes
whose own pass already takes the whole TTFT are left out. That matters at
tight targets on long-prompt traffic, where the *mean* prompt cannot meet
the TTFT at all and a mean-based floor would have nothing to say, while
the short prompts still make it if an engine is free when they arrive.

Exponential service is pessimistic for prefill (pass times vary little),
which is the safe side; large fleets come out close to the rate-based
count (square-root staffing), small ones get the headroom they need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MAX_EXTRA_ENGINES = 10_000


def erlang_c(servers: int, offered: float) -> float:
    """Probability an arrival waits in M/M/servers with offered load ``offered`` (< servers)."""
    if offered <= 0:
        return 0.0
    if offered >= servers:
        return 1.0
    blocking = 1.0  # Erlang B, by the stable recursion
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return servers * blocking / (servers - offered * (1.0 - blocking))


def wait_exceeds(
    servers: int, demand_rps: float, engine_rps: float, budget_s: float, arrival_dispersion: float = 1.0,
) -> float:
    """P(a prompt waits longer than ``budget_s``) with ``servers`` engines."""
    return miss_share(servers, demand_rps, engine_rps, [(1.0, budget_s)], arrival_dispersion)


Budgets = float | Sequence[tuple[float, float]]
"""One wait budget (s) for every prompt, or ``(share, budget_s)`` per class of prompt."""


def budget_classes(budget: Budgets) -> list[tuple[float, float]]:
    """The prompt classes that any number of engines can serve in time (budget > 0)."""
    classes = [(1.0, budget)] if isinstance(budget, int | float) else list(budget)
    return [(share, b) for share, b in classes if share > 0 and b > 0]


def miss_share(
    servers: int, demand_rps: float, engine_rps: float, classes: Sequence[tuple[float, float]],
    arrival_dispersion: float = 1.0,
) -> float:
    """Share of the prompts that wait past their budget, all classes in one queue.

    One class waits past ``t`` with probability ``C(n, a) · exp(-(n·mu -
    lambda) · t / k)``; only ``t`` differs between classes.
    """
    offered = demand_rps / engine_rps
    if offered >= servers:
        return 1.0
    waits = erlang_c(servers, offered)
    stretch = max(1.0, (arrival_dispersion + 1.0) / 2.0)
    total = math.fsum(share for share, _ in classes)
    return math.fsum(
        share * (waits * math.exp(-(servers * engine_rps - demand_rps) * b / stretch)) for share, b in classes
    ) / total


def queueing_replicas(
    demand_rps: float, engine_rps: float, budget_s: Budgets, share: float, minimum: int,
    arrival_dispersion: float = 1.0,
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
    n = max(math.floor(demand_rps / engine_rps) + 1, 1)
    for _ in range(MAX_EXTRA_ENGINES):
        if miss_share(n, demand_rps, engine_rps, classes, arrival_dispersion) <= 1.0 - share:
            return max(n, minimum)
        n += 1
    return max(n, minimum)
