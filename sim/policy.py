"""The policy interface: race any autoscaler against fleetplan's planner.

``fleetplan simulate --policy MODULE:CLASS`` loads a class, instantiates it
with no arguments and, every ``interval_s`` seconds of virtual time (default
5), calls ``decide(view)``. The view holds what an autoscaler could observe
in production:

- ``time``: the tick time (seconds of virtual time);
- ``traffic``: requests that *finished* in the last window (count, mean
  ISL/OSL), as a frontend's metrics show them;
- ``latest_fpm``: the latest forward-pass metrics of each ready engine,
  ``"worker_id/dp_rank" -> ForwardPassMetrics``;
- ``ready`` and ``expected`` workers per role (expected = ready + starting:
  where the fleet is heading).

``decide`` returns the target replica count per role, or ``None`` to leave
the fleet as it is. The simulated connector applies targets exactly as it
applies the planner's decisions (startup time, draining). A policy may also
define ``bind(context)``, called once before the run with the roles, the
planner config (for its SLA), the profile, the startup time and the
deployment name. Example::

    class QueueThreshold:
        interval_s = 10.0

        def decide(self, view):
            queued = sum(f.queued.sum_prefill_tokens for f in view.latest_fpm.values()
                         if f.role == "prefill")
            n = view.expected["prefill"]
            if queued > 20_000 * n:
                return {"prefill": n + 1, "decode": view.expected["decode"]}
            return None

Baselines (static-peak, static-mean, oracle) are policies too
(:mod:`fleetplan.sim.baselines`), so every contender runs on the same trace,
fleet and connector.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fleetplan.schemas.events import ForwardPassMetrics

MAX_POLICY_ENGINES = 10_000
"""The most engines of a role a policy may ask for, ``--initial``'s ceiling: a simulated
fleet of more runs for hours, and 10**9 ran without end, its engines filling memory."""


class PolicyError(ValueError):
    """A ``MODULE:CLASS`` that cannot be loaded or does not fit the interface."""


@dataclass(frozen=True)
class Traffic:
    """Requests finished in the window ending at the tick."""

    duration_s: float
    num_req: int
    isl: float
    osl: float

    @property
    def rps(self) -> float:
        return self.num_req / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class PolicyView:
    time: float
    traffic: Traffic
    latest_fpm: Mapping[str, ForwardPassMetrics]
    ready: Mapping[str, int]
    expected: Mapping[str, int]


@dataclass(frozen=True)
class PolicyContext:
    roles: tuple[str, ...]
    config: Any  # PlannerConfig: ttft_ms, itl_ms, limits
    profile: Any  # ProfileData
    startup_s: float
    gpus_per_engine: Mapping[str, int]
    deployment: str = "sim"  # the name on the fleet's events (``--deployment``)


@runtime_checkable
class Policy(Protocol):
    def decide(self, view: PolicyView) -> Mapping[str, int] | None: ...


def policy_interval(policy: object) -> float:
    value = getattr(policy, "interval_s", 5.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise PolicyError(f"{type(policy).__name__}.interval_s must be a number, got {value!r}") from None
    if not value > 0:
        raise PolicyError(f"{type(policy).__name__}.interval_s must be > 0, got {value}")
    return value


def load_policy(spec: str) -> object:
    """Import ``MODULE:CLASS`` and instantiate it with no arguments."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise PolicyError(f"policy {spec!r}: expected MODULE:CLASS (e.g. mypkg.scalers:MyPolicy)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise PolicyError(f"policy {spec!r}: cannot import {module_name!r} ({err})") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise PolicyError(f"policy {spec!r}: module {module_name!r} has no {class_name!r}")
    try:
        policy = cls()
    except Exception as err:  # noqa: BLE001 - a user's constructor can fail any way
        raise PolicyError(f"policy {spec!r}: {class_name}() failed: {err}") from None
    if not callable(getattr(policy, "decide", None)):
        raise PolicyError(f"policy {spec!r}: {class_name} has no decide(view) method")
    policy_interval(policy)
    return policy


def check_targets(policy: object, targets: object, roles: tuple[str, ...]) -> dict[str, int] | None:
    """Validate what ``decide`` returned: None, or a count in [0, ``MAX_POLICY_ENGINES``] for known roles."""
    if targets is None:
        return None
    name = type(policy).__name__
    if not isinstance(targets, Mapping):
        raise PolicyError(f"{name}.decide returned {type(targets).__name__}, expected a mapping or None")
    out: dict[str, int] = {}
    for role, n in targets.items():
        if role not in roles:
            raise PolicyError(f"{name}.decide: unknown role {role!r} (roles: {', '.join(roles)})")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise PolicyError(f"{name}.decide: {role} target must be an int >= 0, got {n!r}")
        if n > MAX_POLICY_ENGINES:
            raise PolicyError(f"{name}.decide: {role} target {n:,} is more than {MAX_POLICY_ENGINES:,} engines")
        out[role] = n
    return out
