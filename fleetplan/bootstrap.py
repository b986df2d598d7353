"""Build a :class:`~fleetplan.models.planner.Planner` from files, failing fast.

Every entry point (plan, simulate, worker, audit) starts here, so a config,
a profile or a warm-up trace is read and validated the same way everywhere,
and a bad one stops the program at start with the file and field named.
"""

from __future__ import annotations

from pathlib import Path

from fleetplan.models.config import (
    ConfigError,
    PlannerConfig,
    check_kv_capacity,
    check_profile_budget,
    check_profile_engines,
    engine_gpus_wanted,
    load_config,
)
from fleetplan.models.forecast import bucket_peaks, bucket_traffic
from fleetplan.models.planner import Planner


def load_warmup(config: PlannerConfig) -> dict:
    """``Planner`` keywords from ``load_predictor_warmup_trace``: its windows at the throughput
    interval (``warmup``) and their busiest bursts (``warmup_peaks``, what the sizing quantile
    calibrates on); none without a trace."""
    if not config.load_predictor_warmup_trace:
        return {}
    from fleetplan.sim.traces import read_trace, trace_arrivals

    try:
        requests = read_trace(config.load_predictor_warmup_trace)
    except (ValueError, OSError) as err:  # the reader names the file, line and field
        raise ConfigError(f"load_predictor_warmup_trace: {err}") from None
    arrivals, interval = trace_arrivals(requests), config.throughput_adjustment_interval_seconds
    return {"warmup": bucket_traffic(arrivals, interval),
            "warmup_peaks": bucket_peaks(arrivals, interval, config.burst_seconds)}


def load_profile_for(config: PlannerConfig, profile: str | Path | None = None):
    """The profile named on the command line, else the config's ``profile_results_dir``."""
    source = profile if profile is not None else config.profile_results_dir
    if source is None:
        return None
    from fleetplan.sim.profiles import load_profile

    try:
        loaded = load_profile(source, tp=config.profile_tp, engine_gpus=engine_gpus_wanted(config))
    except (ValueError, OSError) as err:
        where = "--profile" if profile is not None else "profile_results_dir"
        raise ConfigError(f"{where}: {err}") from None
    check_profile_engines(config, loaded.engine_gpus, loaded.name)
    # the budget must hold one engine of each role as the planner prices them (the profile's,
    # where the config does not say): else the budget, which wins over the floors, keeps a role at 0
    try:
        check_profile_budget(config, loaded.engine_gpus)
    except ConfigError as err:
        raise ConfigError(f"{err} (engines of the profile {loaded.name or source})") from None
    return loaded


def build_planner(
    config: PlannerConfig | str | Path | None, profile: str | Path | None = None
) -> Planner:
    cfg = config if isinstance(config, PlannerConfig) else load_config(config)
    loaded = load_profile_for(cfg, profile)
    check_kv_capacity(cfg, None if loaded is None else loaded.max_kv_tokens)
    return Planner(cfg, profile=loaded, **load_warmup(cfg))
