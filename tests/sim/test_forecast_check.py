"""The simulator's score of the planner's forecasts against what then arrived (sim/forecast_check.py)."""

from __future__ import annotations

import pytest

from fleetplan.sim.forecast_check import coverage_line, forecast_coverage


def _steady(rate: float, start: float, end: float) -> list[float]:
    """``rate`` arrivals a second, evenly spaced, in [start, end)."""
    n = round(rate * (end - start))
    return [start + (i + 0.5) / rate for i in range(n)]


def _score(ticks, arrivals, **kw):
    return forecast_coverage(ticks, arrivals, **{"end_s": 600.0, "interval_s": 180.0, "burst_s": 60.0,
                                                 "quantile": 0.9, **kw})


def test_the_point_is_scored_on_the_next_window_and_the_quantile_on_the_busiest_burst_of_its_horizon():
    # 10 rps throughout, with one minute at 40 rps: minute 4 (240-300 s), inside the second window
    arrivals = _steady(10, 0, 240) + _steady(40, 240, 300) + _steady(10, 300, 600)
    ticks = [
        # the next window [180, 360): 60 s at 10 and 60 at 40 and 60 at 10 = 20 rps; the horizon
        # [180, 540) peaks at the 40-rps minute
        {"t": 180.0, "predicted_rps": 20.0, "sized_rps": 39.0, "horizon_windows": 2, "quantile_calibrated": False},
        # [360, 540) is 10 rps, under-forecast by 10 %; the horizon ends at 720 > 600: not scored
        {"t": 360.0, "predicted_rps": 9.0, "sized_rps": 50.0, "horizon_windows": 2, "quantile_calibrated": True},
        # a window past the end: nothing scored
        {"t": 540.0, "predicted_rps": 9.0, "sized_rps": 50.0, "horizon_windows": 1, "quantile_calibrated": True},
    ]
    out = _score(ticks, arrivals)
    assert out["point"]["scored"] == 2
    assert out["point"]["mape_pct"] == pytest.approx(5.0)  # 0 % and 10 %
    assert out["point"]["under_share"] == 0.5
    sized = out["sized"]
    assert (sized["scored"], sized["exceeded"]) == (1, 1)  # 40 rps over the 39 sized
    assert (sized["calibrated_scored"], sized["calibrated_exceeded"]) == (0, 0)
    assert sized["calibrated_exceeded_share"] is None
    # the same tick sized at 40 covers the minute
    ticks[0]["sized_rps"] = 40.0
    assert _score(ticks, arrivals)["sized"]["exceeded"] == 0


def test_the_windows_p90_is_scored_on_the_busiest_window_of_its_horizon():
    """``burst_sizing: queueing``: the rate count's P90 is of the window's own count, so it is
    scored on the windows after the tick, not on their busiest minute."""
    arrivals = _steady(10, 0, 240) + _steady(40, 240, 300) + _steady(10, 300, 600)
    # the horizon [180, 540): the window [180, 360) at 20 rps, then [360, 540) at 10
    tick = {"t": 180.0, "predicted_rps": 20.0, "sized_rps": 41.0, "window_sized_rps": 20.5,
            "horizon_windows": 2, "quantile_calibrated": True}
    out = _score([tick], arrivals)
    assert out["sized"]["exceeded"] == 0 and out["window"]["exceeded"] == 0
    assert (out["window"]["scored"], out["window"]["calibrated_scored"]) == (1, 1)
    tick["window_sized_rps"] = 19.5
    out = _score([tick], arrivals)
    assert (out["window"]["exceeded"], out["window"]["calibrated_exceeded_share"]) == (1, 1.0)
    assert "the window's own P90 (prefill's rate count) exceeded on 1 of 1 ticks (1 of the 1 conformal ones)" \
        in coverage_line(out)
    # without the window's quantile there is nothing to score for it
    del tick["window_sized_rps"]
    assert "window" not in _score([tick], arrivals)


def test_conformal_ticks_are_counted_apart():
    arrivals = _steady(10, 0, 1200)
    ticks = [{"t": 180.0 * k, "predicted_rps": 10.0, "sized_rps": 10.5 if k % 2 else 9.5,
              "horizon_windows": 1, "quantile_calibrated": k >= 3} for k in range(1, 6)]
    sized = _score(ticks, arrivals, end_s=1200.0)["sized"]
    # sized 9.5 (exceeded) at k = 2, 4; k = 3, 4, 5 are conformal, of which k = 4 is exceeded
    assert (sized["scored"], sized["exceeded"], sized["exceeded_share"]) == (5, 2, 0.4)
    assert (sized["calibrated_scored"], sized["calibrated_exceeded"]) == (3, 1)
    line = coverage_line(_score(ticks, arrivals, end_s=1200.0))
    assert "exceeded on 2 of 5 ticks (1 of the 3 conformal ones)" in line
    assert "P90" in line


def test_burst_zero_scores_the_window_mean_and_a_burst_that_does_not_divide_the_window():
    arrivals = _steady(10, 0, 240) + _steady(40, 240, 300) + _steady(10, 300, 600)
    tick = [{"t": 180.0, "predicted_rps": 20.0, "sized_rps": 25.0, "horizon_windows": 1}]
    # no sub-windows: the window's own mean, 20 rps, is under 25
    assert _score(tick, arrivals, burst_s=0.0)["sized"]["exceeded"] == 0
    # 50-s sub-windows keyed floor(t / 50), as the core keys them: [250, 300) is all at 40 rps
    assert _score(tick, arrivals, burst_s=50.0)["sized"]["exceeded"] == 1


def test_nothing_to_score():
    assert _score([], _steady(10, 0, 600)) is None
    assert _score([{"t": 540.0, "predicted_rps": 5.0}], _steady(10, 0, 600)) is None  # past the end
    assert coverage_line(None) is None
    # a point-sized run has no quantile to score
    out = _score([{"t": 180.0, "predicted_rps": 10.0}], _steady(10, 0, 600), quantile=None)
    assert "sized" not in out and out["point"]["mape_pct"] == pytest.approx(0.0)
    assert coverage_line(out).startswith("forecast: point forecast off by 0.0 %")


@pytest.mark.parametrize(("basis", "simulator"), [("requests", (4, 44)), ("floor_tokens", (3, 44))])
def test_the_planners_own_count_of_its_exceeded_quantiles_is_the_simulators(tmp_path, basis, simulator):
    """What a live deployment reports (``predicted.quantile_exceeded``, scored by the forecaster as
    each quantile's windows close) is what the simulator counts afterwards from the arrivals: the
    conformal P90s of the busiest 5 s over the horizon, 4 of 44 exceeded on Azure code at 10-s ticks.
    With ``floor_tokens`` the sized rate is the larger of two quantiles (the count's and prefill's
    prompt tokens'): the planner reports the record of the one that was larger at its last tick
    (4 of 44), the simulator reads each sub-window as the larger of its requests and
    its prompt tokens against the larger quantile (3 of 44), so the two counts need not agree."""
    import orjson
    from typer.testing import CliRunner

    from fleetplan.cli import _register_optional, app
    from tests.sim.sim_helpers import CODE

    _register_optional()
    config = tmp_path / "fast.yaml"
    config.write_text("throughput_adjustment_interval_seconds: 10\nload_adjustment_interval_seconds: 5\n"
                      "burst_window_seconds: 5\nstartup_seconds: 20\nenable_load_scaling: false\n"
                      f"quantile_basis: {basis}\n")
    result = CliRunner().invoke(app, [
        "simulate", "--trace", str(CODE), "--profile", "h200-llama3.1-8b", "--config", str(config),
        "--rate-scale", "20", "--startup", "15", "--out", str(tmp_path / "run"), "--json", "--no-baselines",
    ])
    assert result.exit_code == 0, result.output
    sized = orjson.loads(result.stdout)["forecast"]["sized"]
    assert (sized["planner_exceeded"], sized["planner_scored"]) == (4, 44)
    assert (sized["calibrated_exceeded"], sized["calibrated_scored"]) == simulator
    assert sized.get("basis", "requests") == basis


# --- quantile_basis: tokens: the sized rate is of each role's tokens, not of the requests ---------


def _lengths(arrivals: list[float], isl: float, osl: float) -> list[tuple[float, float, float]]:
    return [(t, isl, osl) for t in arrivals]


def test_a_token_basis_run_is_scored_on_the_tokens_its_roles_work_on():
    """With ``quantile_basis: tokens`` the sized rate is a quantile of tokens, in requests of the
    forecast lengths (the most any role was sized for): 10 rps of prompts half the forecast's and
    answers half the forecast's are 5 rps of work, which 6 covers, though 10 requests a second
    are over it; prompts half as long again as the forecast's are 15 rps of prefill work, which
    12 does not cover, though the 10 requests are under it."""
    arrivals = _steady(10, 0, 600)
    tick = {"t": 180.0, "predicted_rps": 10.0, "predicted_isl": 2000.0, "predicted_osl": 200.0,
            "sized_rps": 6.0, "window_sized_rps": 6.0, "horizon_windows": 1, "quantile_calibrated": True}
    by_count = _score([tick], arrivals)
    assert (by_count["sized"]["exceeded"], by_count["window"]["exceeded"]) == (1, 1)
    short = _score([tick], _lengths(arrivals, 1000.0, 100.0), work=("isl", "osl"))
    assert (short["sized"]["exceeded"], short["window"]["exceeded"]) == (0, 0)
    tick = {**tick, "sized_rps": 12.0, "window_sized_rps": 12.0}
    assert _score([tick], arrivals)["sized"]["exceeded"] == 0
    long = _score([tick], _lengths(arrivals, 3000.0, 200.0), work=("isl", "osl"))
    assert (long["sized"]["exceeded"], long["window"]["exceeded"]) == (1, 1)
    # a decode-only fleet's sized rate is of the answers alone: the long prompts are not its work
    assert _score([tick], _lengths(arrivals, 3000.0, 200.0), work=("osl",))["sized"]["exceeded"] == 0
    line = coverage_line(long)
    assert "of the busiest 60 s (tokens, the most any role's)" in line
    assert "the window's own P90 of prompt tokens (prefill's rate count)" in line


@pytest.mark.parametrize("sized", [9.99, 10.0])
def test_lengths_as_forecast_score_as_the_count(sized):
    """Prompts and answers of the forecast lengths are one request's work each: every arrival's
    tokens are counted, and the token score is the count's, to the request."""
    arrivals = _steady(10, 0, 600)
    tick = {"t": 180.0, "predicted_rps": 10.0, "predicted_isl": 2000.0, "predicted_osl": 200.0,
            "sized_rps": sized, "window_sized_rps": sized, "horizon_windows": 1, "quantile_calibrated": True}
    by_count = _score([tick], arrivals)
    by_tokens = _score([tick], _lengths(arrivals, 2000.0, 200.0), work=("isl", "osl"))
    exceeded = int(sized < 10.0)
    for part in ("sized", "window"):
        assert by_count[part]["exceeded"] == by_tokens[part]["exceeded"] == exceeded, part


@pytest.mark.parametrize("missing", [0.0, None, float("nan")])
def test_a_length_the_tick_did_not_forecast_scores_its_requests(missing):
    """The planner reads a window whose length it had no forecast of at ratio 1, its count: so is
    it scored. Divided by 1 token, 2,000-token prompts read as 20,000 rps over a covering 12."""
    arrivals = _steady(10, 0, 600)
    tick = {"t": 180.0, "predicted_rps": 10.0, "predicted_isl": missing, "predicted_osl": 200.0,
            "sized_rps": 12.0, "window_sized_rps": 12.0, "horizon_windows": 1, "quantile_calibrated": True}
    scored = _score([tick], _lengths(arrivals, 2000.0, 200.0), work=("isl", "osl"))
    assert (scored["sized"]["exceeded"], scored["window"]["exceeded"]) == (0, 0)
    tick = {**tick, "sized_rps": 9.0, "window_sized_rps": 9.0}
    scored = _score([tick], _lengths(arrivals, 2000.0, 200.0), work=("isl", "osl"))
    assert (scored["sized"]["exceeded"], scored["window"]["exceeded"]) == (1, 1)


def test_run_coverage_reads_the_basis_from_the_config():
    from types import SimpleNamespace

    from fleetplan.models.config import config_from_dict
    from fleetplan.sim.forecast_check import run_coverage
    from fleetplan.sim.traces import TraceRequest

    rows = [TraceRequest(t, 3000, 200) for t in _steady(10, 0, 600)]
    workload = SimpleNamespace(requests=lambda: iter(rows), duration_s=600.0)
    tick = {"t": 180.0, "predicted_rps": 10.0, "predicted_isl": 2000.0, "predicted_osl": 200.0,
            "sized_rps": 12.0, "horizon_windows": 1, "quantile_calibrated": True}
    result = SimpleNamespace(ticks=[tick])
    kw = {"throughput_adjustment_interval_seconds": 180, "burst_window_seconds": 60}
    assert run_coverage(result, workload, config_from_dict({**kw, "quantile_basis": "requests"}))["sized"]["exceeded"] == 0
    # the default, floor_tokens: the count (10) is covered, prefill's prompt tokens (15 rps of work) are not
    floor = run_coverage(result, workload, config_from_dict(kw))["sized"]
    assert (floor["exceeded"], floor["basis"]) == (1, "floor_tokens")
    assert run_coverage(result, workload, config_from_dict({**kw, "quantile_basis": "tokens"}))["sized"]["exceeded"] == 1
    # a fleet of one role is scored on its own work: the long prompts are prefill's, not decode's
    by_mode = {mode: run_coverage(result, workload, config_from_dict({**kw, "mode": mode, "quantile_basis": "tokens"}))
               for mode in ("prefill", "decode")}
    assert (by_mode["prefill"]["sized"]["exceeded"], by_mode["decode"]["sized"]["exceeded"]) == (1, 0)
    # an aggregated engine does both: answers half as long again as the forecast's are 15 rps of
    # its work, which 12 does not cover, though its prompts are those forecast
    rows[:] = [TraceRequest(t, 2000, 300) for t in _steady(10, 0, 600)]
    agg = config_from_dict({**kw, "mode": "agg", "quantile_basis": "tokens"})
    assert run_coverage(result, workload, agg)["sized"]["exceeded"] == 1
    assert run_coverage(result, workload, config_from_dict({**kw, "quantile_basis": "tokens"}))["sized"]["exceeded"] == 1
