"""Long-horizon workloads from ServeGen's per-client description.

ServeGen (Alibaba, Apache-2.0) describes production traffic per client and
10-minute window: a request rate, the CV of inter-arrival times and the
fitted inter-arrival distribution (Gamma or Weibull, parameters ``p1, p2``).
Drawing each client's arrivals from its own distribution and summing the
clients reproduces the bursts that real tenants make, which a smooth
aggregate rate curve hides.

Choices made here (ServeGen publishes no more than this):

- Each client is a renewal process. Its gaps are drawn from the window's
  distribution and rescaled so their mean is ``1 / (rate · rate_scale)``:
  the shape (and so the CV) is the fitted one, the rate is the recorded
  one. Rescaling the gaps, rather than thinning, keeps a client's burstiness
  when the workload is scaled down to a small fleet.
- A client active in consecutive windows continues from its last arrival;
  a client (re)appearing starts at a uniformly random phase of its first gap.
- Only 6-hour mean ISL/OSL are published; lengths are drawn from a
  lognormal with that mean and ``sigma`` (default 1.0, roughly the spread of
  the Azure traces), clamped to ``[1, max_tokens]``.

The stream is generated window by window, so a week of traffic never sits
in memory, and the same seed gives the same requests.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import heapq
import io
import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetplan.sim.traces import TraceRequest
from fleetplan.sim.workload import MAX_SCALED_REQUESTS, Workload

WINDOW_S = 600.0
MAX_CLIENT_RATE = 100_000.0
"""Requests/s one client row may carry: 50 times the busiest in ServeGen's week (1,927);
a window draws rate × 600 gaps, so 1e9 asked for terabytes."""
_HEADER = ("t", "rate", "cv", "dist", "p1", "p2", "client", "model")


class ServeGenError(ValueError):
    """A ServeGen file that cannot be used: names file:line and the field."""


@dataclass(frozen=True)
class ClientWindow:
    t: float
    rate: float
    dist: str
    p1: float
    p2: float
    client: str


def read_client_windows(
    path: str | Path, model: str, start_s: float = 0.0, end_s: float = math.inf
) -> list[ClientWindow]:
    """The rows of ``model`` with ``start_s <= t < end_s``, sorted by (t, client)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        fh = opener(p, "rb")
    except OSError as err:
        raise ServeGenError(f"{p}: cannot open ({err.strerror})") from None
    rows: list[ClientWindow] = []
    with io.TextIOWrapper(fh, encoding="utf-8", newline="") as text:
        reader = csv.reader(text)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != _HEADER:
            raise ServeGenError(f"{p}:1: header: expected {','.join(_HEADER)}")
        for lineno, fields in enumerate(reader, start=2):
            if not fields:
                continue
            if len(fields) != len(_HEADER):
                raise ServeGenError(f"{p}:{lineno}: row: expected {len(_HEADER)} fields")
            if fields[7] != model:
                continue
            try:
                t = float(fields[0])
                rate, p1, p2 = float(fields[1]), float(fields[4]), float(fields[5])
            except ValueError:
                raise ServeGenError(f"{p}:{lineno}: t/rate/p1/p2: expected numbers") from None
            if not (math.isfinite(t) and t >= 0):
                raise ServeGenError(f"{p}:{lineno}: t: expected seconds >= 0, got {fields[0]!r}")
            if not start_s <= t < end_s:
                continue
            if not (math.isfinite(rate) and 0 <= rate <= MAX_CLIENT_RATE):
                raise ServeGenError(
                    f"{p}:{lineno}: rate: expected requests/s in [0, {MAX_CLIENT_RATE:,.0f}], got {fields[1]!r}"
                )
            if fields[3] not in ("Gamma", "Weibull", "Exponential"):
                raise ServeGenError(
                    f"{p}:{lineno}: dist: expected Gamma, Weibull or Exponential, got {fields[3]!r}"
                )
            if fields[3] != "Exponential" and not (math.isfinite(p1) and p1 > 0 and math.isfinite(p2) and p2 > 0):
                raise ServeGenError(
                    f"{p}:{lineno}: p1/p2: a {fields[3]} needs a shape and a scale > 0, got {fields[4]!r}, {fields[5]!r}"
                )
            rows.append(ClientWindow(t, rate, fields[3], p1, p2, fields[6]))
    if not rows:
        raise ServeGenError(f"{p}: no rows for model {model!r} in [{start_s}, {end_s})")
    rows.sort(key=lambda w: (w.t, w.client))
    return rows


_LENGTH_COLUMNS = ("window6h_start_s", "input_tokens", "output_tokens")


def read_mean_lengths(path: str | Path) -> list[tuple[float, float, float]]:
    """``(window_start_s, mean_isl, mean_osl)`` rows of a ``*_mean_isl_osl_6h.csv``.

    Columns are found by name: the text models' files are
    ``window6h_start_s,input_tokens,output_tokens``, but mm-image's lists
    its modalities first and ``input_tokens`` last.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ServeGenError(f"{p}: cannot open ({err.strerror})") from None
    rows = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(rows, [])]
    if not set(_LENGTH_COLUMNS) <= set(header):
        raise ServeGenError(f"{p}:1: header: expected columns {', '.join(_LENGTH_COLUMNS[:2])} and {_LENGTH_COLUMNS[2]}")
    columns = [header.index(name) for name in _LENGTH_COLUMNS]
    out = []
    for lineno, fields in enumerate(rows, start=2):
        if not fields:
            continue
        try:
            start, isl, osl = (float(fields[i]) for i in columns)
        except (ValueError, IndexError):
            raise ServeGenError(f"{p}:{lineno}: expected numbers in {', '.join(_LENGTH_COLUMNS)}") from None
        out.append((start, isl, osl))
    if not out:
        raise ServeGenError(f"{p}: no rows")
    return out


def servegen_workload(
    clients_path: str | Path,
    model: str,
    *,
    start_s: float = 0.0,
    duration_s: float = 86_400.0,
    rate_scale: float = 1.0,
    seed: int = 0,
    lengths_path: str | Path | None = None,
    sigma: float = 1.0,
    max_tokens: int = 16_000,
) -> Workload:
    """A seeded ServeGen workload of ``duration_s`` seconds starting at ``start_s``."""
    if not rate_scale > 0:
        raise ValueError(f"rate_scale must be > 0, got {rate_scale}")
    clients_path = Path(clients_path)
    end_s = start_s + duration_s
    # from the window ``start_s`` falls in (its traffic after ``start_s`` is the run's)
    windows = read_client_windows(clients_path, model, start_s - start_s % WINDOW_S, end_s)
    _check_window_draws(windows, rate_scale)
    if lengths_path is None:
        lengths_path = clients_path.parent / f"{model}_mean_isl_osl_6h.csv"
    lengths = read_mean_lengths(lengths_path)

    def generate() -> Iterator[TraceRequest]:
        return _generate(windows, lengths, start_s, end_s, rate_scale, seed, sigma, max_tokens)

    return Workload(f"servegen-{model}", float(duration_s), generate)


def _check_window_draws(windows: list[ClientWindow], rate_scale: float) -> None:
    """Refuse a ``rate_scale`` whose busiest window would draw more than a replay holds.

    A window's arrivals are drawn at once (every client's gaps, then their
    lengths), so its request count, not the day's, is what memory bounds;
    the day's is streamed.
    """
    per_window: dict[float, float] = defaultdict(float)
    for w in windows:
        per_window[w.t] += w.rate * WINDOW_S
    if not per_window:
        return
    t, drawn = max(per_window.items(), key=lambda kv: (kv[1], -kv[0]))
    if drawn * rate_scale > MAX_SCALED_REQUESTS:
        raise ValueError(f"--rate-scale: {rate_scale:g} × the {drawn:,.0f} requests of the window at {t:g} s "
                         f"is {drawn * rate_scale:.3g}, more than the {MAX_SCALED_REQUESTS:,} one window may draw")


def _generate(windows, lengths, start_s, end_s, rate_scale, seed, sigma, max_tokens) -> Iterator[TraceRequest]:
    rng = np.random.default_rng(seed)
    by_t: dict[float, list[ClientWindow]] = defaultdict(list)
    for w in windows:
        by_t[w.t].append(w)
    carried: dict[str, float] = {}  # client -> its last arrival, if active in the previous window
    prev_t = None
    for t in sorted(by_t):
        end = t + WINDOW_S
        arrivals: list[np.ndarray] = []
        still: dict[str, float] = {}
        for w in by_t[t]:
            rate = w.rate * rate_scale
            if rate <= 0:
                continue
            mean_gap = 1.0 / rate
            last = carried.get(w.client) if prev_t == t - WINDOW_S else None
            times = _client_arrivals(rng, w, mean_gap, t, end, last)
            if times.size:
                arrivals.append(times)
                still[w.client] = float(times[-1])
            elif last is not None:
                still[w.client] = last
        carried, prev_t = still, t
        if not arrivals:
            continue
        times = np.sort(np.concatenate(arrivals), kind="stable")
        isl_mean, osl_mean = _lengths_at(lengths, t)
        isl = _lognormal(rng, isl_mean, sigma, times.size, max_tokens)
        osl = _lognormal(rng, osl_mean, sigma, times.size, max_tokens)
        for a, i, o in zip(times.tolist(), isl.tolist(), osl.tolist(), strict=True):
            if start_s <= a < end_s:  # a window cut by the run's start or end
                yield TraceRequest(a - start_s, i, o)


def _client_arrivals(rng, w: ClientWindow, mean_gap, t, end, last) -> np.ndarray:
    expected = (end - t) / mean_gap
    out: list[np.ndarray] = []
    if last is None:
        cursor = t + rng.random() * _gaps(rng, w, mean_gap, 1)[0]
        out.append(np.array([cursor]))
    else:
        cursor = last
    while cursor < end:
        n = int(expected * 1.2) + 16
        times = cursor + np.cumsum(_gaps(rng, w, mean_gap, n))
        out.append(times)
        cursor = float(times[-1])
    allt = np.concatenate(out)
    return allt[(allt >= t) & (allt < end)]


def _gaps(rng, w: ClientWindow, mean_gap: float, n: int) -> np.ndarray:
    """n inter-arrival gaps of the window's distribution, rescaled to ``mean_gap``."""
    if w.dist == "Gamma" and w.p1 > 0 and w.p2 > 0:
        raw = rng.gamma(w.p1, w.p2, n)
        mean = w.p1 * w.p2
    elif w.dist == "Weibull" and w.p1 > 0 and w.p2 > 0:
        raw = w.p2 * rng.weibull(w.p1, n)
        mean = w.p2 * math.gamma(1.0 + 1.0 / w.p1)
    else:
        raw = rng.exponential(1.0, n)
        mean = 1.0
    return raw * (mean_gap / mean)


def _lengths_at(lengths, t: float) -> tuple[float, float]:
    starts = [row[0] for row in lengths]
    i = max(0, bisect.bisect_right(starts, t) - 1)
    return lengths[i][1], lengths[i][2]


def _lognormal(rng, mean: float, sigma: float, n: int, max_tokens: int) -> np.ndarray:
    mu = math.log(max(mean, 1.0)) - sigma * sigma / 2.0
    draws = rng.lognormal(mu, sigma, n)
    return np.clip(np.rint(draws), 1, max_tokens).astype(np.int64)


def merge_sorted(*streams: Iterator[TraceRequest]) -> Iterator[TraceRequest]:
    """Merge arrival-ordered streams into one (several models on one fleet)."""
    return heapq.merge(*streams, key=lambda r: r.arrival_s)
