"""Readers for recorded request traces: Azure 2023 CSV, Mooncake, Dynamo.

Every reader returns the same thing, a list of ``TraceRequest`` sorted by
arrival with times relative to the first request, so the simulator and the
predictor warm-up never care where a trace came from. Times are computed
from exact integers or decimals and rounded to a float once, so two
readings of one trace agree to the bit and a 30-minute trace has no
accumulated drift.

A malformed line stops the read with ``TraceFormatError`` naming the file,
the line and the field: a replay on silently skipped rows would be a
replay of a different workload.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

__all__ = [
    "TRACE_FORMATS",
    "TraceFormatError",
    "TraceRequest",
    "read_trace",
    "trace_arrivals",
]

TRACE_FORMATS = ("azure", "mooncake", "dynamo")
DYNAMO_SCHEMA = "dynamo.request.trace.v1"
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One recorded request: when it arrived and how big it was."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    # Prefix-block hashes: equal ids mean a shared prefix (KV reuse).
    hash_ids: tuple[int, ...] = ()
    cached_tokens: int = 0
    request_id: str | None = None


class TraceFormatError(ValueError):
    """A trace line that does not parse: ``path:line: field: expected``."""

    def __init__(self, path: str | os.PathLike[str], line: int, field: str, expected: str):
        self.path = str(path)
        self.line = line
        self.field = field
        super().__init__(f"{self.path}:{line}: {field}: {expected}")


@dataclass(frozen=True, slots=True)
class _Row:
    """A parsed request with its arrival still exact (ticks or decimal ms)."""

    arrival: int | Decimal
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    cached_tokens: int
    request_id: str | None


def read_trace(path: str | os.PathLike[str], fmt: str = "auto") -> list[TraceRequest]:
    """Read a trace file (``.gz`` allowed) into requests sorted by arrival.

    ``fmt`` is ``"auto"`` (by extension, then by content) or one of
    ``TRACE_FORMATS``. The first request arrives at 0.0; ties keep file
    order.
    """
    path = Path(path)
    if fmt != "auto" and fmt not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; valid: auto, {', '.join(TRACE_FORMATS)}")
    with _open_text(path) as lines:
        numbered = enumerate(lines, start=1)
        if fmt == "auto":
            fmt, numbered = _detect(path, numbered)
        if fmt == "azure":
            return _to_requests(list(_azure_rows(path, numbered)), _ticks_to_s)
        return _to_requests(list(_jsonl_rows(path, numbered, fmt)), _ms_to_s)


def trace_arrivals(reqs: Iterable[TraceRequest]) -> list[tuple[float, float, float]]:
    """``(arrival_s, isl, osl)`` tuples, the input of ``bucket_traffic``."""
    return [(r.arrival_s, float(r.input_tokens), float(r.output_tokens)) for r in reqs]


# --- plumbing ----------------------------------------------------------------


def _open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of line 1
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _base_suffix(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return Path(name).suffix


def _detect(path: Path, numbered: Iterator[tuple[int, str]]):
    """Pick the format from the extension or the first non-blank line.

    Returns the format and an iterator that still yields every line.
    """
    suffix = _base_suffix(path)
    if suffix == ".csv":
        return "azure", numbered
    buffered: list[tuple[int, str]] = []
    fmt = None
    for lineno, line in numbered:
        buffered.append((lineno, line))
        if not line.strip():
            continue
        if line.startswith("TIMESTAMP"):
            fmt = "azure"
        else:
            record = _json_object(path, lineno, line)
            fmt = _jsonl_kind(record)
            if fmt is None:
                raise TraceFormatError(
                    path,
                    lineno,
                    "line",
                    "a Mooncake row (timestamp, input_length, output_length) "
                    f"or a {DYNAMO_SCHEMA} record (event)",
                )
        break
    if fmt is None:
        fmt = "mooncake"  # blank file: no rows either way

    def replay() -> Iterator[tuple[int, str]]:
        yield from buffered
        yield from numbered

    return fmt, replay()


def _ticks_to_s(ticks: int) -> float:
    return ticks / _TICKS_PER_S  # int / int is correctly rounded


def _ms_to_s(ms: int | Decimal) -> float:
    return float(Decimal(ms).scaleb(-3))  # exact shift, one rounding


def _to_requests(rows: list[_Row], to_seconds: Callable[[Any], float]) -> list[TraceRequest]:
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: r.arrival)  # stable: ties keep file order
    origin = ordered[0].arrival
    return [
        TraceRequest(
            # the difference is exact (ints or decimals); rounding happens once
            arrival_s=to_seconds(row.arrival - origin),
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            hash_ids=row.hash_ids,
            cached_tokens=row.cached_tokens,
            request_id=row.request_id,
        )
        for row in ordered
    ]


# --- Azure 2023 CSV ----------------------------------------------------------

_TICKS_PER_S = 10_000_000  # the trace's 7 fractional digits are 100 ns ticks
_AZURE_TS = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?")


def _azure_ticks(path: Path, lineno: int, text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` as integer 100 ns ticks (exact)."""
    match = _AZURE_TS.fullmatch(text.strip())
    expected = "a timestamp YYYY-MM-DD HH:MM:SS.fffffff"
    if match is None:
        raise TraceFormatError(path, lineno, "TIMESTAMP", f"{expected}, got {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction = match.group(7) or ""
    try:
        days = dt.date(year, month, day).toordinal()
    except ValueError:
        raise TraceFormatError(path, lineno, "TIMESTAMP", f"{expected}, got {text!r}") from None
    if hour > 23 or minute > 59 or second > 59:
        raise TraceFormatError(path, lineno, "TIMESTAMP", f"{expected}, got {text!r}")
    seconds = ((days * 24 + hour) * 60 + minute) * 60 + second
    return seconds * _TICKS_PER_S + int(fraction.ljust(7, "0"))


def _azure_tokens(path: Path, lineno: int, field: str, text: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise TraceFormatError(path, lineno, field, f"a non-negative integer, got {text!r}")
    return int(value)


def _azure_rows(path: Path, numbered: Iterable[tuple[int, str]]) -> Iterator[_Row]:
    header_seen = False
    for lineno, line in numbered:
        if not line.strip():
            continue
        fields = next(csv.reader([line]))
        if not header_seen:
            names = tuple(f.strip() for f in fields)
            if names != AZURE_HEADER:
                raise TraceFormatError(
                    path, lineno, "header", f"{','.join(AZURE_HEADER)}, got {line.strip()!r}"
                )
            header_seen = True
            continue
        if len(fields) != len(AZURE_HEADER):
            raise TraceFormatError(
                path, lineno, "row", f"3 fields {','.join(AZURE_HEADER)}, got {len(fields)}"
            )
        yield _Row(
            arrival=_azure_ticks(path, lineno, fields[0]),
            input_tokens=_azure_tokens(path, lineno, "ContextTokens", fields[1]),
            output_tokens=_azure_tokens(path, lineno, "GeneratedTokens", fields[2]),
            hash_ids=(),
            cached_tokens=0,
            request_id=None,
        )


# --- JSONL: Mooncake and dynamo.request.trace.v1 ---------------------------------


def _json_object(path: Path, lineno: int, line: str) -> dict[str, Any]:
    try:
        # Decimal keeps fractional milliseconds exact until the one rounding.
        record = json.loads(line, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path, lineno, "line", f"a JSON object ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceFormatError(path, lineno, "line", "a JSON object")
    return record


def _jsonl_kind(record: dict[str, Any]) -> str | None:
    if "event" in record:
        return "dynamo"
    if "input_length" in record or "hash_ids" in record:
        return "mooncake"
    return None


def _jsonl_rows(path: Path, numbered: Iterable[tuple[int, str]], fmt: str) -> Iterator[_Row]:
    seen_ids: set[str] = set()
    for lineno, line in numbered:
        if not line.strip():
            continue
        record = _json_object(path, lineno, line)
        kind = _jsonl_kind(record)
        if kind is not None and kind != fmt:
            raise TraceFormatError(
                path, lineno, "line", f"a {fmt} row like the rest of the file (mixed formats)"
            )
        if fmt == "mooncake":
            yield _mooncake_row(path, lineno, record)
            continue
        row = _dynamo_row(path, lineno, record)
        if row is None:
            continue
        if row.request_id in seen_ids:
            continue  # a re-emitted request_end: the first one wins
        seen_ids.add(row.request_id)
        yield row


class _Fields:
    """Typed access to a JSON object, failing with the dotted field name."""

    def __init__(self, path: Path, lineno: int, obj: dict[str, Any], prefix: str = ""):
        self.path, self.lineno, self.obj, self.prefix = path, lineno, obj, prefix

    def fail(self, key: str, expected: str) -> TraceFormatError:
        return TraceFormatError(self.path, self.lineno, self.prefix + key, expected)

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def obj_field(self, key: str, required: bool = True) -> _Fields | None:
        value = self.obj.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, "an object")
        return _Fields(self.path, self.lineno, value, f"{self.prefix}{key}.")

    def number(self, key: str) -> int | Decimal:
        value = self.obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int | Decimal):
            raise self.fail(key, f"a number, got {value!r}")
        if isinstance(value, Decimal) and not value.is_finite():
            raise self.fail(key, f"a finite number, got {value!r}")
        return value

    def count(self, key: str, default: int | None = None) -> int:
        value = self.obj.get(key)
        if value is None and default is not None:
            return default
        if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(key, f"a non-negative integer, got {value!r}")
        return value

    def text(self, key: str) -> str:
        value = self.obj.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"a non-empty string, got {value!r}")
        return value

    def hashes(self, key: str) -> tuple[int, ...]:
        value = self.obj.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise self.fail(key, "a list of integers")
        return tuple(value)


def _mooncake_row(path: Path, lineno: int, record: dict[str, Any]) -> _Row:
    row = _Fields(path, lineno, record)
    return _Row(
        arrival=row.number("timestamp"),
        input_tokens=row.count("input_length"),
        output_tokens=row.count("output_length"),
        hash_ids=row.hashes("hash_ids"),
        cached_tokens=0,
        request_id=None,
    )


def _dynamo_row(path: Path, lineno: int, record: dict[str, Any]) -> _Row | None:
    """A request_end record as a row; None for other event types."""
    event = _Fields(path, lineno, record).obj_field("event")
    assert event is not None
    if event.obj.get("schema", DYNAMO_SCHEMA) != DYNAMO_SCHEMA:
        raise event.fail("schema", f"{DYNAMO_SCHEMA!r}, got {event.obj.get('schema')!r}")
    if event.text("event_type") != "request_end":
        return None
    request = event.obj_field("request")
    assert request is not None
    replay = request.obj_field("replay", required=False)

    if request.has("request_received_ms"):
        arrival = request.number("request_received_ms")
    elif event.has("event_time_unix_ms") and request.has("total_time_ms"):
        # the end time minus the request's duration is when it arrived
        arrival = Decimal(event.number("event_time_unix_ms")) - Decimal(
            request.number("total_time_ms")
        )
    else:
        raise request.fail(
            "request_received_ms",
            "a number (or event.event_time_unix_ms with request.total_time_ms)",
        )
    if replay is not None and replay.has("input_length"):
        input_tokens = replay.count("input_length")
    else:
        input_tokens = request.count("input_tokens")
    return _Row(
        arrival=arrival,
        input_tokens=input_tokens,
        output_tokens=request.count("output_tokens"),
        hash_ids=() if replay is None else replay.hashes("input_sequence_hashes"),
        cached_tokens=request.count("cached_tokens", default=0),
        request_id=request.text("request_id"),
    )
