"""The perf model: forward-pass time per role, learned online from FPMs.

It serves both planner loops: the throughput loop asks each role model for
an engine's capacity (``capacity_rps``), the load loop for each engine's
estimated TTFT/ITL from its latest FPM (``estimate_ttft_ms``,
``estimate_itl_ms``). Pure: no I/O, no clock; state is plain data.
See docs/perf-model.md.
"""

from fleetplan.models.perf.agg import AggPerfModel
from fleetplan.models.perf.averages import MovingAverage
from fleetplan.models.perf.base import RolePerfModel
from fleetplan.models.perf.capacity import (
    MAX_BATCH_CANDIDATES,
    Capacity,
    agg_capacity,
    backlog_prefill_rps,
    batch_candidates,
    decode_capacity,
    prefill_capacity,
)
from fleetplan.models.perf.chunking import chunked_time, chunked_time_many
from fleetplan.models.perf.columns import FpmColumns
from fleetplan.models.perf.decode import DecodePerfModel
from fleetplan.models.perf.fit import MIN_WALL_TIME_S, LinearFit, fit_nonnegative
from fleetplan.models.perf.limits import EngineLimits
from fleetplan.models.perf.prefill import PrefillPerfModel
from fleetplan.models.perf.profile import FILE_KEYS, InvalidProfile, ProfileData, seed_samples
from fleetplan.models.perf.regression import OnlineRegression
from fleetplan.models.perf.request_shape import (
    MAX_KV_HIT_RATE,
    clamp_kv_hit_rate,
    decode_context_length,
    effective_isl,
    normalize_accept_length,
)
from fleetplan.models.perf.retention import BucketedSamples
from fleetplan.models.perf.roles import (
    PERF_MODEL_TYPES,
    perf_model_for,
    perf_model_from_state,
    seeded_perf_model,
)
from fleetplan.models.perf.settings import RegressionSettings

__all__ = [
    "FILE_KEYS", "MAX_BATCH_CANDIDATES", "MAX_KV_HIT_RATE", "MIN_WALL_TIME_S", "PERF_MODEL_TYPES",
    "AggPerfModel", "BucketedSamples", "Capacity", "DecodePerfModel", "EngineLimits",
    "FpmColumns", "InvalidProfile", "LinearFit", "MovingAverage", "OnlineRegression",
    "PrefillPerfModel", "ProfileData", "RegressionSettings", "RolePerfModel", "agg_capacity", "backlog_prefill_rps",
    "batch_candidates", "chunked_time", "chunked_time_many", "clamp_kv_hit_rate",
    "decode_capacity", "decode_context_length", "effective_isl", "fit_nonnegative",
    "normalize_accept_length", "perf_model_for", "perf_model_from_state", "prefill_capacity",
    "seed_samples", "seeded_perf_model",
]
