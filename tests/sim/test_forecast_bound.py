"""The linear-predictor bound of bench/forecast_bound.py on series whose answer is known.

docs/forecasting.md rests the per-series goal's verdict on this estimate,
so it is checked where theory gives the ratio: a random walk (nothing beats
the last value: 1) and changes that are AR(1) with coefficient phi (the
best predictor keeps only the innovation: sqrt(1 - phi^2) of the change).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from bench import forecast_bound
from bench.forecast import Series, score
from bench.forecast_bound import SPECTRAL_MIN_WINDOWS, sees_next, spectral_bound
from fleetplan.models.forecast import TrafficObservation

WINDOWS = 4_001


def _series(log_counts: np.ndarray, isl: np.ndarray | None = None) -> Series:
    isl = np.full(len(log_counts), 1000.0) if isl is None else isl
    windows = tuple(
        TrafficObservation(duration_s=600.0, num_req=float(np.expm1(z)), isl=float(i), osl=200.0)
        for z, i in zip(log_counts, isl, strict=True)
    )
    return Series("synthetic", 600.0, windows, warm=0)


def _walk(changes: np.ndarray, start: float = 8.0) -> np.ndarray:
    return start + np.concatenate([[0.0], np.cumsum(changes)])


def test_a_random_walk_leaves_nothing_over_the_last_value():
    changes = np.random.default_rng(1).normal(0.0, 0.05, WINDOWS - 1)
    ratio, se = spectral_bound(_series(_walk(changes)))
    assert abs(ratio - 1.0) < 3 * se


@pytest.mark.parametrize("phi", [-0.5, 0.6])
def test_ar1_changes_keep_only_their_innovation(phi):
    rng = np.random.default_rng(2)
    noise = rng.normal(0.0, 0.05, WINDOWS - 1)
    changes = np.empty_like(noise)
    changes[0] = noise[0]
    for i in range(1, len(noise)):
        changes[i] = phi * changes[i - 1] + noise[i]
    ratio, se = spectral_bound(_series(_walk(changes)))
    assert abs(ratio - math.sqrt(1.0 - phi * phi)) < 3 * se
    assert ratio < 1.0 - 3 * se  # the estimate sees the room a model has


def test_the_token_series_can_be_steadier_than_its_parts():
    # the count and the prompt length swing against each other: each part is a random walk,
    # their product is white noise around a level, which a mean predicts better than the last value
    rng = np.random.default_rng(3)
    swing = _walk(rng.normal(0.0, 0.05, WINDOWS - 1), start=0.0)
    jitter = rng.normal(0.0, 0.01, WINDOWS)
    log_n = 8.0 + swing + jitter
    isl = np.exp(7.0 - swing)
    series = _series(log_n, isl)
    count, _ = spectral_bound(series)
    tokens, se = spectral_bound(series, "prefill tokens")
    assert count > 0.95
    assert tokens < 0.9 - 3 * se


def test_too_short_a_series_has_no_spectrum():
    assert spectral_bound(_series(np.full(SPECTRAL_MIN_WINDOWS, 8.0))) is None


def _jump_at_the_end() -> Series:
    """Five warm-up windows, then five scored: four steady, and a jump in the last."""
    counts = [100.0] * 9 + [5000.0]
    windows = tuple(TrafficObservation(180.0, n, 1000.0, 200.0) for n in counts)
    return Series("synthetic-180s", 180.0, windows, warm=5)


def test_the_benchmark_keeps_each_scored_windows_loss():
    series = _jump_at_the_end()
    scored = score("constant", series)
    assert len(scored.losses) == scored.windows == 5
    assert math.fsum(scored.losses) / 5 == scored.loss
    assert scored.losses[-1] > 1.0 > max(scored.losses[:-1])


def test_the_next_window_is_compared_on_the_windows_it_scores(tmp_path, monkeypatch, capsys):
    # the last scored window has no next one, so "sees the next window" scores one window
    # fewer than bench/forecast.py; its ratios are to the references' losses on those windows,
    # not to their means over a window it never faced
    series = _jump_at_the_end()
    losses = [0.1, 0.1, 0.1, 0.1, 2.0]  # the jump costs the references what it costs anyone
    rows = [
        {"series": series.name, "kind": kind, "loss": math.fsum(losses) / 5, "losses": losses}
        for kind in ("arima_frozen", "constant")
    ]
    scores = tmp_path / "forecast.json"
    scores.write_text(json.dumps({"scores": rows}))
    monkeypatch.setattr(forecast_bound, "test_series", lambda data: [series])
    monkeypatch.setattr(sys, "argv", ["forecast_bound.py", "--data", str(tmp_path), "--scores", str(scores)])
    forecast_bound.main()
    cells = [c.strip() for c in capsys.readouterr().out.splitlines()[-1].split("|")]
    nxt = sees_next(series)
    assert cells[7] == f"{nxt / 0.1:.2f} / {nxt / 0.1:.2f}"  # over the first four windows' 0.1
    hindsight = float(cells[3])
    assert cells[5] == f"{hindsight / 0.48:.2f} / {hindsight / 0.48:.2f}"  # all five: 0.48
