"""``prefill_capacity: backlog``: prefill rated at what an engine with a queue sustains (docs/sizing.md)."""

from __future__ import annotations

import pytest

from fleetplan.models.config import config_from_dict
from fleetplan.models.perf_models import make_perf_models
from fleetplan.models.throughput import engine_capacity
from fleetplan.sim.profiles import load_profile


def _capacities(profile, mode: str, isl: float = 1243.0, osl: float = 250.0):
    cfg = config_from_dict({"prefill_capacity": mode, "ttft_ms": 1200, "itl_ms": 50})
    models = make_perf_models(cfg, profile)
    return {role: engine_capacity(models[role], cfg, isl, osl, 0.0, 1.0) for role in ("prefill", "decode")}


@pytest.mark.parametrize(("name", "tp", "share"), [("h100-llama3.3-70b", 4, 0.959), ("h200-llama3.1-8b", None, 0.991)])
def test_the_rate_is_the_packed_pass_and_the_batch_and_ttft_stay_the_best_batchs(name, tp, share):
    """On both bundled profiles tokens a second peak below the 8,192-token pass (the 70B at TP4:
    17.6k at 4,000, 16.5k at 8,192), so the rate drops; the queueing floor's service time (the
    best batch's TTFT) and decode do not move."""
    profile = load_profile(name, tp=tp)
    best, backlog = _capacities(profile, "best"), _capacities(profile, "backlog")
    assert backlog["prefill"].rps == pytest.approx(share * best["prefill"].rps, abs=0.002 * best["prefill"].rps)
    assert (backlog["prefill"].batch, backlog["prefill"].ttft_ms) == (best["prefill"].batch, best["prefill"].ttft_ms)
    assert backlog["decode"] == best["decode"]


def test_the_reference_and_the_default_keep_dynamos_best_batch():
    assert config_from_dict({}).prefill_capacity == "best"
    with pytest.raises(ValueError, match="prefill_capacity"):
        config_from_dict({"prefill_capacity": "packed"})
