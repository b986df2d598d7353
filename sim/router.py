"""Routers: which ready engine of a role takes a request.

Three policies, as a frontend would run them:

- ``round-robin``: the next engine in turn, blind to load;
- ``least-loaded``: prompts go to the engine with the fewest prompt tokens
  not yet computed (queued, plus the pass in flight), transferred KV to the
  decode engine with the least context reserved, waiting or in transfer;
- ``prefix``: prefix-aware (KV-cache-aware) routing for prompts: the cost of
  an engine is its prompt backlog plus the tokens this prompt would still
  have to compute there after its cached leading blocks (``hash_ids``
  overlap), lowest cost wins. Decode placement is least-loaded.

Ties go to the engine that became ready first, so routing is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetplan.sim.engines import Engine, SimRequest

ROUTERS = ("round-robin", "least-loaded", "prefix")


class Router:
    name = "base"

    def pick(self, role: str, engines: Sequence[Engine], req: SimRequest) -> Engine:
        raise NotImplementedError


class RoundRobinRouter(Router):
    name = "round-robin"

    def __init__(self) -> None:
        self._turn: dict[str, int] = {}

    def pick(self, role, engines, req):
        i = self._turn.get(role, 0)
        self._turn[role] = i + 1
        return engines[i % len(engines)]


def _least_decode(engines: Sequence[Engine]) -> Engine:
    best = engines[0]
    best_load = best.decode_load()
    for e in engines[1:]:
        load = e.decode_load()
        if load < best_load:
            best, best_load = e, load
    return best


class LeastLoadedRouter(Router):
    name = "least-loaded"

    def pick(self, role, engines, req):
        if role == "decode":
            return _least_decode(engines)
        best = engines[0]
        best_load = (best.prefill_load(), best.decode_load())
        for e in engines[1:]:
            load = (e.prefill_load(), e.decode_load())
            if load < best_load:
                best, best_load = e, load
        return best


class PrefixAwareRouter(Router):
    name = "prefix"

    def pick(self, role, engines, req):
        if role == "decode":
            return _least_decode(engines)
        best = None
        best_cost = None
        for e in engines:
            cost = (e.prefill_load() + req.isl - e.cached_prefix_tokens(req), e.decode_load())
            if best_cost is None or cost < best_cost:
                best, best_cost = e, cost
        assert best is not None
        return best


def make_router(name: str) -> Router:
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name == "prefix":
        return PrefixAwareRouter()
    raise ValueError(f"unknown router {name!r}; valid: {', '.join(ROUTERS)}")
