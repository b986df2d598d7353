"""How low can a one-step loss go on the forecast benchmark's series?

    .venv/bin/python bench/forecast_bound.py [--data ../shared/data] [--scores forecast.json]

Issue 5 asks for a predictor at <= 0.8x the frozen-order ARIMA's loss on
every series of ``bench/forecast.py --split test``. This script asks how
much room the series leave, with two predictors no real forecaster can be:

- **hindsight EWMA**: exponential smoothing in log1p space of the count and
  of the mean lengths, with the pair of smoothing factors (0.05 .. 1 by
  0.05; 1 is the last value) picked per series *on the scored windows
  themselves*. It bounds what that whole family (the constant, every
  EWMA) can reach on a series;
- **sees the next window**: the mean, in log1p space, of the windows before
  and after the one predicted. For a random walk this halves the variance
  of the one-step error; it shows how much of a series' loss is noise that
  one more window of data would average out.

Both are scored with the reference's ``window_loss`` on the same windows
as ``bench/forecast.py``. With ``--scores`` (its ``--json`` output) each
loss is also given as a ratio to the frozen-order ARIMA's and to the best
reference kind's on that series, the two ratios the goal bounds. Not a test:
nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast import DEFAULT_DATA, REFERENCE_KINDS, Series, test_series  # noqa: E402

from fleetplan.models.forecast import window_loss  # noqa: E402

ALPHAS = np.round(np.arange(0.05, 1.0001, 0.05), 2)


def _logs(series: Series) -> np.ndarray:
    return np.log1p(np.array([[w.num_req, w.isl, w.osl] for w in series.windows], dtype=float))


def _loss(pred: np.ndarray, series: Series, rows: range) -> float:
    """Mean window loss of log1p predictions ``pred[i]`` for windows ``rows``."""
    windows = series.windows
    losses = [window_loss(tuple(np.expm1(pred[i])), (windows[i].num_req, windows[i].isl, windows[i].osl)) for i in rows]
    return math.fsum(losses) / len(losses)


def _ewma(z: np.ndarray, alpha: float) -> np.ndarray:
    """One-step EWMA forecasts: out[i] predicts z[i] from z[:i] (out[0] = z[0])."""
    out = np.empty_like(z)
    level = z[0]
    for i, value in enumerate(z):
        out[i] = level
        level = level + alpha * (value - level)
    return out


def hindsight_ewma(series: Series) -> tuple[float, float, float]:
    """(loss, alpha for the count, alpha for the lengths) of the best pair on the scored windows."""
    z = _logs(series)
    rows = range(series.warm, len(series.windows))
    count = {a: _ewma(z[:, 0], a) for a in ALPHAS}
    lengths = {a: np.stack([_ewma(z[:, 1], a), _ewma(z[:, 2], a)], axis=1) for a in ALPHAS}
    best = (math.inf, 1.0, 1.0)
    for a_n in ALPHAS:
        for a_l in ALPHAS:
            pred = np.column_stack([count[a_n], lengths[a_l]])
            loss = _loss(pred, series, rows)
            if loss < best[0]:
                best = (loss, float(a_n), float(a_l))
    return best


def sees_next(series: Series) -> float:
    """Loss of predicting each scored window from the mean of its two neighbours (log1p)."""
    z = _logs(series)
    rows = range(series.warm, len(series.windows) - 1)  # the last window has no next
    pred = z.copy()
    pred[1:-1] = (z[:-2] + z[2:]) / 2.0
    return _loss(pred, series, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--scores", type=Path, help="bench/forecast.py --json output (for the ratios)")
    args = parser.parse_args()
    frozen: dict[str, float] = {}
    best_ref: dict[str, float] = {}
    if args.scores:
        rows = json.loads(args.scores.read_text())["scores"]
        frozen = {r["series"]: r["loss"] for r in rows if r["kind"] == "arima_frozen"}
        for r in rows:
            if r["kind"] in REFERENCE_KINDS:
                best_ref[r["series"]] = min(r["loss"], best_ref.get(r["series"], math.inf))

    def versus(loss: float, name: str) -> str:
        """Ratios to arima_frozen and to the best reference kind (the goal: <= 0.8 and <= 0.9)."""
        return f"{loss / frozen[name]:.2f} / {loss / best_ref[name]:.2f}" if name in frozen else ""

    print("| series | scored | hindsight EWMA loss | alphas (count, lengths) | vs arima_frozen / best ref "
          "| sees the next window | vs arima_frozen / best ref |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for series in test_series(args.data):
        loss, a_n, a_l = hindsight_ewma(series)
        nxt = sees_next(series)
        print(f"| {series.name} | {len(series.windows) - series.warm} | {loss:.4f} | {a_n:g}, {a_l:g} | "
              f"{versus(loss, series.name)} | {nxt:.4f} | {versus(nxt, series.name)} |")


if __name__ == "__main__":
    main()
