"""``prefill_capacity``: prefill sized at what an engine with a queue sustains (docs/sizing.md)."""

from __future__ import annotations

import pytest

from fleetplan.models.config import REFERENCE_SIZING, config_from_dict
from fleetplan.models.perf_models import make_perf_models
from fleetplan.models.throughput import engine_capacity, rate_count_capacity
from fleetplan.sim.profiles import load_profile

ISL, OSL = 1243.0, 250.0  # Azure conv's mean prompt and answer at ×10.8 on the 70B at TP4


def _sized(profile, mode: str):
    """Each role's capacity as the sizing reads it, and the rate its rate count divides by (mix factor 0.9)."""
    cfg = config_from_dict({"prefill_capacity": mode, "ttft_ms": 1200, "itl_ms": 50})
    models = make_perf_models(cfg, profile)
    caps = {role: engine_capacity(models[role], cfg, ISL, OSL, 0.0, 1.0) for role in ("prefill", "decode")}
    rates = {role: rate_count_capacity(cfg, role, models[role], caps[role].rps, 0.9, ISL, 0.0) for role in caps}
    return caps, rates


@pytest.mark.parametrize(("name", "tp", "share"), [("h100-llama3.3-70b", 4, 0.959), ("h200-llama3.1-8b", None, 0.991)])
def test_backlog_lowers_the_rate_count_alone_and_backlog_all_every_use(name, tp, share):
    """On both bundled profiles tokens a second peak below the 8,192-token pass (the 70B at TP4:
    17.6k at 4,000, 16.5k at 8,192), so the backlogged rate is lower. ``backlog`` hands it to the rate
    count only; ``backlog_all`` to the capacity every count reads. The best batch and its TTFT (the
    queueing floor's service time) and decode never move."""
    profile = load_profile(name, tp=tp)
    (best, best_rate), (rate_only, rate_only_rate), (everywhere, everywhere_rate) = (
        _sized(profile, mode) for mode in ("best", "backlog", "backlog_all"))
    backlogged = share * best["prefill"].rps
    assert best_rate["prefill"] == pytest.approx(0.9 * best["prefill"].rps, rel=1e-12)
    assert rate_only["prefill"] == best["prefill"]
    assert rate_only_rate["prefill"] == pytest.approx(0.9 * backlogged, rel=0.002)
    assert everywhere["prefill"].rps == pytest.approx(backlogged, rel=0.002)
    assert everywhere_rate["prefill"] == pytest.approx(0.9 * everywhere["prefill"].rps, rel=1e-12)
    assert (everywhere["prefill"].batch, everywhere["prefill"].ttft_ms) == (best["prefill"].batch, best["prefill"].ttft_ms)
    assert best["decode"] == rate_only["decode"] == everywhere["decode"]
    assert best_rate["decode"] == rate_only_rate["decode"] == everywhere_rate["decode"]


def test_the_default_backlogs_the_rate_count_dynamos_keeps_its_best_batch_and_an_unknown_value_is_refused():
    assert config_from_dict({}).prefill_capacity == "backlog"
    assert config_from_dict(REFERENCE_SIZING).prefill_capacity == "best"
    with pytest.raises(ValueError, match="prefill_capacity"):
        config_from_dict({"prefill_capacity": "packed"})
