"""The planner's perf models: one per role of the mode, from config and profile.

Engine limits come from the config (Dynamo reads them from the model card);
a profile, when given, seeds each model so the throughput loop can size the
fleet before the first live forward pass (Dynamo's NPZ bootstrap, ``monitoring/perf_metrics.py``).
"""

from __future__ import annotations

from fleetplan.models.config import PlannerConfig
from fleetplan.models.perf import (
    EngineLimits,
    RegressionSettings,
    perf_model_for,
    perf_model_from_state,
    seeded_perf_model,
)

__all__ = ["make_perf_models", "perf_model_from_state"]


def _profile_covers(profile, role: str) -> bool:
    if role == "prefill":
        return profile.has_prefill
    if role == "decode":
        return profile.has_decode
    return profile.has_prefill and profile.has_decode


def make_perf_models(config: PlannerConfig, profile=None) -> dict:
    # The profile's measured KV cache is every role's engine's, also where the profile cannot
    # seed the role (agg from a profile without prompt rows): without it the threshold rules,
    # which check_kv_capacity let through on the profile's word, had no cache to judge KV use by.
    profile_kv = None if profile is None else profile.max_kv_tokens
    limits = EngineLimits(
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_kv_tokens=config.max_kv_tokens if config.max_kv_tokens is not None else profile_kv,
        max_context_length=config.context_length,
    )
    settings = RegressionSettings(
        max_num_fpm_samples=config.max_num_fpm_samples,
        fpm_sample_bucket_size=config.fpm_sample_bucket_size,
        load_min_observations=config.load_min_observations,
        prefill_quadratic=config.prefill_time_model == "quadratic",
    )
    models = {}
    for role in config.roles:
        if profile is not None and _profile_covers(profile, role):
            models[role] = seeded_perf_model(profile, role, limits, settings)
        else:
            models[role] = perf_model_for(role, limits, settings)
    return models
