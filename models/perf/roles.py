"""One perf model per role: construction, seeding from a profile, restoring state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fleetplan.models.perf.agg import AggPerfModel
from fleetplan.models.perf.base import RolePerfModel
from fleetplan.models.perf.decode import DecodePerfModel
from fleetplan.models.perf.limits import EngineLimits
from fleetplan.models.perf.prefill import PrefillPerfModel
from fleetplan.models.perf.profile import ProfileData, seed_samples
from fleetplan.models.perf.settings import RegressionSettings
from fleetplan.schemas import Role

PERF_MODEL_TYPES: dict[str, type[RolePerfModel]] = {
    "prefill": PrefillPerfModel,
    "decode": DecodePerfModel,
    "agg": AggPerfModel,
}


def perf_model_for(
    role: Role, limits: EngineLimits | None = None, settings: RegressionSettings | None = None
) -> RolePerfModel:
    try:
        model_type = PERF_MODEL_TYPES[role]
    except KeyError:
        raise ValueError(f"unknown role {role!r}") from None
    return model_type(limits, settings)


def seeded_perf_model(
    profile: ProfileData,
    role: Role,
    limits: EngineLimits | None = None,
    settings: RegressionSettings | None = None,
) -> RolePerfModel:
    """A role model bootstrapped from ``profile``.

    The profile's measured KV-cache size fills ``max_kv_tokens`` when the
    limits leave it unknown: it is the same engine configuration.
    """
    limits = limits if limits is not None else EngineLimits()
    if limits.max_kv_tokens is None and profile.max_kv_tokens is not None:
        limits = replace(limits, max_kv_tokens=profile.max_kv_tokens)
    model = perf_model_for(role, limits, settings)
    model.seed(seed_samples(profile, role))
    return model


def perf_model_from_state(state: dict[str, Any]) -> RolePerfModel:
    return PERF_MODEL_TYPES[state["role"]].from_state(state)
