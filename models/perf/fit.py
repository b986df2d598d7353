"""Linear fits of forward-pass wall time with non-negative slopes.

More prefill tokens, more decode requests or more KV tokens can never make a
forward pass faster, so every slope is constrained to be >= 0 (Lawson-Hanson
NNLS, ``scipy.optimize.nnls``). Dynamo's legacy fit rejects a negative slope
and waits for more data; a constrained fit instead gives the best physical
model the samples allow, so the planner never stalls on noise.

The intercept is free by default, as in Dynamo: the profiles are convex in the
token count (attention is quadratic), so the best straight line over the
range crosses zero slightly above x=0 and its intercept is negative. A free
intercept is solved exactly by centring: for fixed slopes the best intercept
is ``mean(y) - mean(X)·slopes``, so the slopes solve an NNLS on centred data.

A free intercept has one hazard: below the sampled range the line can go to
zero or negative (the H100 70B TP2 profile crosses zero at 579 prefill
tokens), and a pass predicted to take ~0 s makes a capacity search report
absurd rates. So predictions are floored at the fastest forward pass among
the retained samples (never below 1e-6 s): no pass is faster than the
engine's fixed per-iteration cost, and the fastest observed pass is the best
estimate of that cost the data offers. Inside the sampled range the floor
never binds for the shipped profiles, so Dynamo's figures are unchanged.

Predictions are evaluated as ``intercept + c0*x0 + c1*x1`` left to right, in
both the scalar and the numpy path, so both give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

MIN_WALL_TIME_S = 1e-6
"""No prediction is ever below this, whatever the samples (Dynamo's clamp)."""


@dataclass(frozen=True)
class LinearFit:
    intercept: float
    coef: tuple[float, ...]
    floor: float = MIN_WALL_TIME_S
    """Smallest prediction: the fastest retained pass, at least ``MIN_WALL_TIME_S``."""

    def predict(self, *x: float) -> float:
        """Wall time in seconds for one feature vector, never below ``floor``."""
        y = self.intercept
        for c, v in zip(self.coef, x, strict=True):
            y = y + c * v
        return y if y > self.floor else self.floor

    def predict_many(self, *x: np.ndarray | float) -> np.ndarray:
        """Vectorised :meth:`predict`; each argument is one feature column."""
        y = np.asarray(self.intercept, dtype=np.float64)
        for c, v in zip(self.coef, x, strict=True):
            y = y + c * np.asarray(v, dtype=np.float64)
        return np.maximum(y, self.floor)

    def to_state(self) -> dict[str, Any]:
        return {"intercept": self.intercept, "coef": list(self.coef), "floor": self.floor}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LinearFit:
        kind = QuadraticFit if state.get("kind") == "quadratic" else LinearFit
        return kind(
            float(state["intercept"]),
            tuple(float(c) for c in state["coef"]),
            float(state["floor"]),
        )


@dataclass(frozen=True)
class QuadraticFit(LinearFit):
    """``wall ≈ a + b·t + c·t²`` in one input ``t``, fitted as a line in (t, t²).

    Prefill time is convex in the prompt tokens (attention is quadratic), so
    a straight line through a profile under-predicts short passes: on the
    H100 70B TP2 profile it gives 32.5 ms at 440 tokens where the engine
    takes 61.8 ms (docs/sizing.md). Both slopes stay >= 0, so the curve is
    physical: never faster with more tokens. Callers pass ``t`` alone.
    """

    def predict(self, *x: float) -> float:
        (t,) = x
        return LinearFit.predict(self, t, t * t)

    def predict_many(self, *x: np.ndarray | float) -> np.ndarray:
        (t,) = x
        t = np.asarray(t, dtype=np.float64)
        return LinearFit.predict_many(self, t, t * t)

    def to_state(self) -> dict[str, Any]:
        return {**LinearFit.to_state(self), "kind": "quadratic"}


def fit_quadratic(t: np.ndarray, y: np.ndarray, *, nonnegative_intercept: bool = False) -> QuadraticFit:
    """:func:`fit_nonnegative` on the columns (t, t²) of a one-column ``t``."""
    t = np.asarray(t, dtype=np.float64).reshape(-1)
    line = fit_nonnegative(np.column_stack([t, t * t]), y, nonnegative_intercept=nonnegative_intercept)
    return QuadraticFit(line.intercept, line.coef, line.floor)


def fit_nonnegative(x: np.ndarray, y: np.ndarray, *, nonnegative_intercept: bool = False) -> LinearFit:
    """Least-squares fit of ``y ≈ intercept + x @ coef`` with ``coef >= 0``.

    ``x`` is (n, d), ``y`` is (n,). Columns are scaled to unit norm before the
    NNLS (tokens are ~1e4, seconds ~1e-2) and the slopes scaled back. A column
    with no spread carries no information about its slope; its slope is 0.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"bad fit input shapes x={x.shape} y={y.shape}")
    floor = max(MIN_WALL_TIME_S, float(y.min()))
    if nonnegative_intercept:
        return _fit_with_nonnegative_intercept(x, y, floor)
    d = x.shape[1]
    x_mean = x.mean(axis=0)
    y_mean = float(y.mean())
    xc = x - x_mean
    coef = np.zeros(d)
    norms = np.sqrt((xc * xc).sum(axis=0))
    active = norms > 0.0
    if active.any():
        solution, _ = nnls(xc[:, active] / norms[active], y - y_mean)
        coef[active] = solution / norms[active]
    intercept = y_mean
    for c, m in zip(coef.tolist(), x_mean.tolist(), strict=True):
        intercept = intercept - c * m
    return LinearFit(float(intercept), tuple(float(c) for c in coef), floor)


def _fit_with_nonnegative_intercept(x: np.ndarray, y: np.ndarray, floor: float) -> LinearFit:
    design = np.column_stack([x, np.ones(x.shape[0])])
    norms = np.sqrt((design * design).sum(axis=0))
    active = norms > 0.0
    solution = np.zeros(design.shape[1])
    sol, _ = nnls(design[:, active] / norms[active], y)
    solution[active] = sol / norms[active]
    return LinearFit(float(solution[-1]), tuple(float(c) for c in solution[:-1]), floor)
