"""The daily cycle of a traffic series, learned online.

Production LLM traffic has a clear daily shape (ServeGen's week of Bailian
traffic swings 2-3x between night and afternoon). ``DailyProfile`` learns
that shape from the series itself as a few Fourier harmonics of the time
of day, fitted by recursive least squares with forgetting, in log space
(so the cycle is a multiplicative factor on the load, as it is in
practice). It is a building block of the ensemble predictor, not a
predictor: it answers "how much higher is the load at phase b than at
phase a", which is what a one-step forecast needs.

Why this form:

- a handful of harmonics is smooth by construction: a window-level daily
  profile (144 bins at 10 minutes) learned from a few days is mostly noise,
  and its bin-to-bin differences are worse than no seasonality at all;
- the state is ``1 + 2K`` coefficients and a ``(1 + 2K)^2`` covariance,
  whatever the window length, so it fits in a changelog table;
- forgetting (a memory of a few days) lets the shape drift with the week;
- residuals are clipped at a few times their running mean absolute size
  before the update, so an outage (a run of zero windows) or a one-off
  burst bends the profile by a bounded amount instead of wrecking it.

Time is a window index from the caller: the window's start time over the
window length when the planner gives it (so the phase is the time of day,
whatever the first window, a restart or a gap in the windows), else the
windows fed so far, idle ones included (the phase is then relative to the
first window seen). All arithmetic is plain
Python floats in a fixed order, so a restored profile continues bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["DailyProfile", "DAY_S"]

DAY_S = 86_400.0


class DailyProfile:
    """Log-space daily cycle: ``z(t) ~ a0 + sum_k a_k cos(2pi k phase) + b_k sin(2pi k phase)``.

    ``interval_s`` is the window length, ``harmonics`` the number K of
    harmonics, ``memory_days`` the forgetting time constant, ``clip`` the
    residual clip in running mean absolute residuals.

    K is held below half the windows a day: a day of N windows shows the
    fit N phases, and harmonic k needs 2k < N of them (at 6-hour windows
    sin 2x is 0 and 3x is x again). A direction no window excites is never
    fitted, only forgotten: its covariance grew by 1/forget a window and
    the coefficients diverged (1e19 after 1,000 windows; later a NaN the
    state cannot carry, or fsum raising).

    The ensemble fits only busy windows, so a deployment idle part of the
    day shows the fit fewer phases than it has coefficients whatever K is
    (at 2-hour windows, busy 08:00-16:00: 4 phases of 7 coefficients, and
    the fit diverged within a year). So no coefficient's variance grows
    past ``P0`` times what a day of forgetting adds: a fitted direction's
    stays far below that, one no window excites is held there.
    """

    P0 = 100.0  # initial covariance: the first day moves the coefficients freely

    def __init__(
        self,
        interval_s: float,
        harmonics: int = 3,
        memory_days: float = 3.0,
        clip: float = 4.0,
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0.0):
            raise ValueError(f"interval_s must be a positive finite number, got {interval_s!r}")
        if harmonics < 1:
            raise ValueError("harmonics must be >= 1")
        self.interval_s = float(interval_s)
        self.harmonics = max(1, min(int(harmonics), math.ceil(self.windows_per_day / 2.0) - 1))
        self.memory_days = float(memory_days)
        self.clip = float(clip)
        n = 1 + 2 * self.harmonics
        self._theta = [0.0] * n
        self._cov = [[self.P0 if i == j else 0.0 for j in range(n)] for i in range(n)]
        self._abs_residual = 0.0  # running mean |residual|, 0 until the first update
        self._updates = 0

    # --- geometry ------------------------------------------------------------

    @property
    def windows_per_day(self) -> float:
        return DAY_S / self.interval_s

    @property
    def usable(self) -> bool:
        """True when the windows are short enough for a day to have a shape.

        With 12-hour windows a "daily cycle" is two points: nothing to learn.
        """
        return self.windows_per_day >= 4.0

    @property
    def updates(self) -> int:
        """Windows fitted so far."""
        return self._updates

    def covers_a_day(self) -> bool:
        """True once a full day of windows has been fitted."""
        return self._updates >= self.windows_per_day

    def _regressors(self, t: int) -> list[float]:
        # phase in [0, 1): reduce the integer index first so a long-running
        # series never loses precision in the angle
        per_day = self.windows_per_day
        phase = math.fmod(float(t), per_day) / per_day
        out = [1.0]
        for k in range(1, self.harmonics + 1):
            angle = 2.0 * math.pi * k * phase
            out.append(math.cos(angle))
            out.append(math.sin(angle))
        return out

    def shift(self, windows: int) -> None:
        """Move the learned cycle ``windows`` later: ``shape(t + windows)`` becomes the old ``shape(t)``.

        For a series whose clock was a window count and is now the time of
        day: each harmonic's coefficient pair, and the covariance with them,
        is rotated by the phase the clock jumped.
        """
        per_day = self.windows_per_day
        n = 1 + 2 * self.harmonics
        rotation = [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]
        delta = math.fmod(float(windows), per_day) / per_day
        for k in range(1, self.harmonics + 1):
            angle = 2.0 * math.pi * k * delta
            c, s = math.cos(angle), math.sin(angle)
            i = 2 * k - 1  # cos at i, sin at i + 1
            rotation[i][i], rotation[i][i + 1] = c, -s
            rotation[i + 1][i], rotation[i + 1][i + 1] = s, c
        self._theta = [math.fsum(rotation[i][j] * self._theta[j] for j in range(n)) for i in range(n)]
        rp = [[math.fsum(rotation[i][m] * self._cov[m][j] for m in range(n)) for j in range(n)] for i in range(n)]
        cov = [[math.fsum(rp[i][m] * rotation[j][m] for m in range(n)) for j in range(n)] for i in range(n)]
        for i in range(n):  # exactly symmetric, as update keeps it
            for j in range(i + 1, n):
                cov[j][i] = cov[i][j]
        self._cov = cov

    # --- use -----------------------------------------------------------------

    def shape(self, t: int) -> float:
        """The cycle's log-space offset at window ``t`` (the mean level excluded)."""
        x = self._regressors(t)
        return math.fsum(self._theta[i] * x[i] for i in range(1, len(x)))

    def update(self, t: int, z: float) -> None:
        """Fit the value ``z`` (log space) seen at window ``t``."""
        x = self._regressors(t)
        n = len(x)
        if self._updates == 0:
            self._theta[0] = z  # start the level at the data, not at 0
        residual = z - math.fsum(self._theta[i] * x[i] for i in range(n))
        if self._abs_residual > 0.0:
            bound = self.clip * self._abs_residual
            residual = max(-bound, min(bound, residual))
        forget = 1.0 - 1.0 / (self.memory_days * self.windows_per_day)
        cov = self._cov
        px = [math.fsum(cov[i][j] * x[j] for j in range(n)) for i in range(n)]
        denom = forget + math.fsum(x[i] * px[i] for i in range(n))
        gain = [v / denom for v in px]
        for i in range(n):
            self._theta[i] += gain[i] * residual
        # P = (P - k (P x)^T) / forget, kept exactly symmetric
        for i in range(n):
            for j in range(i, n):
                v = (cov[i][j] - gain[i] * px[j]) / forget
                cov[i][j] = v
                cov[j][i] = v
        self._bound_covariance(forget)
        # the running residual scale, a time constant of about a day
        rate = max(1.0 / self.windows_per_day, 1.0 / (self._updates + 1))
        self._abs_residual += rate * (abs(residual) - self._abs_residual)
        self._updates += 1

    def _bound_covariance(self, forget: float) -> None:
        """Scale down the rows and columns whose variance passed the bound (``D P D``: still
        symmetric and positive semi-definite), so an unexcited direction stops growing."""
        bound = self.P0 / forget ** self.windows_per_day
        cov = self._cov
        n = len(cov)
        scale = [math.sqrt(bound / cov[i][i]) if cov[i][i] > bound else 1.0 for i in range(n)]
        if all(s == 1.0 for s in scale):
            return
        for i in range(n):
            for j in range(n):
                cov[i][j] *= scale[i] * scale[j]

    # --- state ---------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "harmonics": self.harmonics,
            "memory_days": self.memory_days,
            "clip": self.clip,
            "theta": list(self._theta),
            "cov": [list(row) for row in self._cov],
            "abs_residual": self._abs_residual,
            "updates": self._updates,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> DailyProfile:
        profile = cls(
            float(state["interval_s"]),
            int(state["harmonics"]),
            float(state["memory_days"]),
            float(state["clip"]),
        )
        if len(state["theta"]) != len(profile._theta):
            return profile  # stored with harmonics its windows cannot resolve, and diverging: start again
        profile._theta = [float(v) for v in state["theta"]]
        profile._cov = [[float(v) for v in row] for row in state["cov"]]
        profile._abs_residual = float(state["abs_residual"])
        profile._updates = int(state["updates"])
        return profile
