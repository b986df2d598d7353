"""How long a new worker takes from "starting" to "ready".

Pulling weights, loading them on GPUs and warming up takes minutes, and it
is the delay every autoscaler has to plan around (the DynoSim study found
an SLA cliff at 100–120 s). A spec is a fixed number of seconds or a seeded
distribution:

- ``120``: always 120 s (the default);
- ``uniform:LO:HI``;
- ``normal:MEAN:SD`` (clamped at 0);
- ``lognormal:MEDIAN:SIGMA``.

``upper()`` is a value no draw is expected to exceed (the 99th percentile for
unbounded distributions): the hindsight oracle starts workers that much
ahead of need. It may be at most ``MAX_STARTUP_SECONDS`` (a day), the
config's bound on ``startup_seconds``: the simulator plans that far ahead a
second at a time, and a startup of 1e7 s ran for minutes before its first
request.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from fleetplan.models.config import MAX_STARTUP_SECONDS


@dataclass
class StartupTime:
    kind: str
    a: float
    b: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def sample(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return self._rng.uniform(self.a, self.b)
        if self.kind == "normal":
            return max(0.0, self._rng.gauss(self.a, self.b))
        return self.a * math.exp(self._rng.gauss(0.0, self.b))

    def upper(self) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return self.b
        if self.kind == "normal":
            return self.a + 2.326 * self.b
        try:
            return self.a * math.exp(2.326 * self.b)
        except OverflowError:
            return math.inf

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g} s"
        return f"{self.kind}({self.a:g}, {self.b:g})"


def parse_startup(spec: str | float, seed: int = 0) -> StartupTime:
    """Parse a startup spec; ``ValueError`` says what is wrong.

    Every parameter must be finite: NaN passed a ``< 0`` check and started
    engines at a NaN time (or failed later in ``--initial``), and infinity
    raised a traceback.
    """
    if isinstance(spec, int | float):
        value = float(spec)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"startup time must be a finite number of seconds >= 0, got {spec}")
        if value > MAX_STARTUP_SECONDS:
            raise ValueError(f"startup: at most {MAX_STARTUP_SECONDS:g} s (a day), got {value:g}")
        return StartupTime("fixed", value, seed=seed)
    text = str(spec).strip()
    parts = text.split(":")
    try:
        numbers = [float(p) for p in parts[1:]] if len(parts) > 1 else [float(parts[0])]
    except ValueError:
        raise ValueError(
            f"startup: expected seconds or uniform:LO:HI, normal:MEAN:SD, lognormal:MEDIAN:SIGMA; got {text!r}"
        ) from None
    if len(parts) == 1:
        return parse_startup(numbers[0], seed)
    kind = parts[0]
    if kind not in ("uniform", "normal", "lognormal") or len(numbers) != 2:
        raise ValueError(
            f"startup: expected uniform:LO:HI, normal:MEAN:SD or lognormal:MEDIAN:SIGMA; got {text!r}"
        )
    a, b = numbers
    if not all(math.isfinite(x) and x >= 0 for x in (a, b)) or (kind == "uniform" and b < a):
        raise ValueError(f"startup: parameters must be finite and >= 0 (and LO <= HI); got {text!r}")
    startup = StartupTime(kind, a, b, seed=seed)
    if startup.upper() > MAX_STARTUP_SECONDS:
        raise ValueError(f"startup: at most {MAX_STARTUP_SECONDS:g} s (a day), got {text!r} "
                         f"(engines planned to start within {startup.upper():.3g} s)")
    return startup
