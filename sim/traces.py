"""Readers for recorded request traces: Azure 2023 CSV, Mooncake, Dynamo.

Every reader returns the same thing, a list of ``TraceRequest`` sorted by
arrival with times relative to the first request, so the simulator and the
predictor warm-up never care where a trace came from. Times are computed
from exact integers or decimals and rounded to a float once, so two
readings of one trace agree to the bit and a 30-minute trace has no
accumulated drift.

A malformed line stops the read with ``TraceFormatError`` naming the file,
the line and the field: a replay on silently skipped rows would be a
replay of a different workload. So does a file that is not what its name
says (a ``.gz`` that is not gzip or is cut short, text that is not UTF-8),
a token count above ``MAX_REQUEST_TOKENS`` and a trace whose arrivals span
more than ``MAX_TRACE_SPAN_S``: those are unit or corruption errors, and
replaying them would only exhaust memory or time.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

from fleetplan.schemas.events import MAX_REQUEST_TOKENS

__all__ = [
    "MAX_REQUEST_TOKENS",
    "MAX_TRACE_SPAN_S",
    "TRACE_FORMATS",
    "TraceFormatError",
    "TraceRequest",
    "read_trace",
    "trace_arrivals",
]

TRACE_FORMATS = ("azure", "mooncake", "dynamo")
DYNAMO_SCHEMA = "dynamo.request.trace.v1"
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")

MAX_TRACE_SPAN_S = 366 * 86_400
"""Longest span, first to last arrival, a trace may cover: a year.

Published traces cover an hour (Azure 2023, Mooncake) to a week (Azure
2024); a longer span comes from one mistyped or unit-confused timestamp
(a year 9999, nanoseconds read as ms), and replaying it would size
billions of empty windows."""


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
    # Tokens per hash block where the trace says (Dynamo's replay.trace_block_size); None: it
    # does not (Mooncake's are 512), and the simulator's --prefix-block-tokens applies.
    block_tokens: int | None = None


class TraceFormatError(ValueError):
    """A trace line that does not parse: ``path:line: field: expected``.

    ``line`` and ``field`` are None for a problem of the whole file (a
    truncated gzip stream): the message is then ``path: problem``.
    """

    def __init__(
        self, path: str | os.PathLike[str], line: int | None, field: str | None, expected: str
    ):
        self.path = str(path)
        self.line = line
        self.field = field
        if line is None:
            super().__init__(f"{self.path}: {expected}")
        elif field is None:
            super().__init__(f"{self.path}:{line}: {expected}")
        else:
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
    block_tokens: int | None = None
    # where the arrival came from, for errors found only once all rows are read
    line: int = 0
    arrival_field: str = ""
    arrival_text: str = ""


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
        numbered = _numbered_lines(path, lines)
        if fmt == "auto":
            fmt, numbered = _detect(path, numbered)
        if fmt == "azure":
            return _to_requests(path, list(_azure_rows(path, numbered)), _ticks_to_s)
        return _to_requests(path, list(_jsonl_rows(path, numbered, fmt)), _ms_to_s)


def trace_arrivals(reqs: Iterable[TraceRequest]) -> list[tuple[float, float, float]]:
    """``(arrival_s, isl, osl)`` tuples, the input of ``bucket_traffic``."""
    return [(r.arrival_s, float(r.input_tokens), float(r.output_tokens)) for r in reqs]


# --- plumbing ----------------------------------------------------------------


def _open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of line 1
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _numbered_lines(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` pairs; a broken file raises ``TraceFormatError``.

    gzip and the UTF-8 decoder fail mid-iteration with messages that name
    neither the file nor the line (and click reads gzip's ``EOFError`` as a
    Ctrl-D abort), so their errors are translated here, where every
    reader's lines pass.
    """
    try:
        yield from enumerate(lines, start=1)
    except EOFError:
        raise TraceFormatError(path, None, None, "the compressed file ends early (truncated gzip)") from None
    except gzip.BadGzipFile as exc:
        if str(exc).startswith("Not a gzipped file"):
            raise TraceFormatError(path, None, None, "not a gzip file") from None
        raise TraceFormatError(path, None, None, f"corrupt gzip data ({exc})") from None
    except zlib.error as exc:
        raise TraceFormatError(path, None, None, f"corrupt gzip data ({exc})") from None
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> TraceFormatError:
    """Where the first undecodable byte is: the text decoder only knows its chunk offset."""
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as raw:
        for lineno, line in enumerate(raw, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                return TraceFormatError(path, lineno, None, f"not UTF-8 (byte 0x{line[bad.start]:02x})")
    return TraceFormatError(path, None, None, f"not UTF-8 ({exc.reason})")  # split across lines


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


def _to_requests(
    path: Path, rows: list[_Row], to_seconds: Callable[[Any], float]
) -> list[TraceRequest]:
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: r.arrival)  # stable: ties keep file order
    _check_span(path, ordered, to_seconds)
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
            block_tokens=row.block_tokens,
        )
        for row in ordered
    ]


def _check_span(path: Path, ordered: list[_Row], to_seconds: Callable[[Any], float]) -> None:
    """Refuse a trace spanning more than ``MAX_TRACE_SPAN_S``, blaming the outlying row.

    The row blamed is the one beside the widest gap between consecutive
    arrivals, on the side of the gap with fewer rows: one stray timestamp
    (far future or far past) is that row itself.
    """
    span_s = to_seconds(ordered[-1].arrival - ordered[0].arrival)
    if span_s <= MAX_TRACE_SPAN_S:
        return
    _, i = max((b.arrival - a.arrival, i) for i, (a, b) in enumerate(pairwise(ordered)))
    row = ordered[i] if i + 1 < len(ordered) - (i + 1) else ordered[i + 1]
    days = span_s / 86_400
    span = f"{days:,.0f} days" if math.isfinite(days) else "more days than a float holds"
    raise TraceFormatError(
        path,
        row.line,
        row.arrival_field,
        f"a time within {MAX_TRACE_SPAN_S // 86_400} days of the other requests, "
        f"got {row.arrival_text}: the trace would span {span}, an absurd span for a replay",
    )


# --- Azure 2023 CSV ----------------------------------------------------------

_TICKS_PER_S = 10_000_000  # the trace's 7 fractional digits are 100 ns ticks
_AZURE_TS = re.compile(
    r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7}))?(Z|([+-])(\d{2}):(\d{2}))?"
)


def _azure_ticks(path: Path, lineno: int, text: str) -> int:
    """``YYYY-MM-DD HH:MM:SS.fffffff[±HH:MM]`` as integer 100 ns ticks (exact).

    The 2023 traces log times without a zone, 7 fractional digits; the 2024
    week logs microseconds with a UTC offset (``...00.009930+00:00``), which
    is subtracted so every row is on one clock.
    """
    match = _AZURE_TS.fullmatch(text.strip())
    expected = "a timestamp YYYY-MM-DD HH:MM:SS.fffffff (optionally +HH:MM)"
    if match is None:
        raise TraceFormatError(path, lineno, "TIMESTAMP", f"{expected}, got {text!r}")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction = match.group(7) or ""
    sign, offset_h, offset_m = match.group(9), int(match.group(10) or 0), int(match.group(11) or 0)
    try:
        days = dt.date(year, month, day).toordinal()
    except ValueError:
        raise TraceFormatError(path, lineno, "TIMESTAMP", f"{expected}, got {text!r}") from None
    if hour > 23 or minute > 59 or second > 59 or offset_h > 23 or offset_m > 59:
        raise TraceFormatError(path, lineno, "TIMESTAMP", f"{expected}, got {text!r}")
    offset_s = (offset_h * 60 + offset_m) * 60 * (-1 if sign == "-" else 1)
    seconds = ((days * 24 + hour) * 60 + minute) * 60 + second - offset_s
    return seconds * _TICKS_PER_S + int(fraction.ljust(7, "0"))


def _azure_tokens(path: Path, lineno: int, field: str, text: str) -> int:
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise TraceFormatError(path, lineno, field, f"a non-negative integer, got {text!r}")
    return _bounded_tokens(path, lineno, field, int(value))


def _bounded_tokens(path: Path, lineno: int, field: str, tokens: int) -> int:
    """``tokens`` if at most ``MAX_REQUEST_TOKENS``: a larger count is not a request."""
    if tokens > MAX_REQUEST_TOKENS:
        raise TraceFormatError(
            path, lineno, field, f"at most {MAX_REQUEST_TOKENS:,} tokens, got {tokens}"
        )
    return tokens


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
            line=lineno,
            arrival_field="TIMESTAMP",
            arrival_text=fields[0].strip(),
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

    def millis(self, key: str) -> int | Decimal:
        """A time in ms that stays finite in seconds (``1e400`` parses but overflows)."""
        value = self.number(key)
        if not math.isfinite(_ms_to_s(value)):
            raise self.fail(key, f"a finite number of ms, got {value}")
        return value

    def tokens(self, key: str, default: int | None = None) -> int:
        """A token count, at most ``MAX_REQUEST_TOKENS``."""
        return _bounded_tokens(self.path, self.lineno, self.prefix + key, self.count(key, default))

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
    arrival = row.millis("timestamp")
    return _Row(
        arrival=arrival,
        input_tokens=row.tokens("input_length"),
        output_tokens=row.tokens("output_length"),
        hash_ids=row.hashes("hash_ids"),
        cached_tokens=0,
        request_id=None,
        line=lineno,
        arrival_field="timestamp",
        arrival_text=f"{arrival} ms",
    )


def _block_tokens(replay: _Fields | None) -> int | None:
    """``replay.trace_block_size``: the tokens each of the row's hashes covers (None: not given)."""
    if replay is None or not replay.has("trace_block_size"):
        return None
    size = replay.count("trace_block_size")
    if size == 0:
        raise replay.fail("trace_block_size", "a positive integer, got 0")
    return size


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
        arrival_field = "event.request.request_received_ms"
        arrival = request.millis("request_received_ms")
    elif event.has("event_time_unix_ms") and request.has("total_time_ms"):
        # the end time minus the request's duration is when it arrived
        arrival_field = "event.event_time_unix_ms"
        arrival = Decimal(event.millis("event_time_unix_ms")) - Decimal(
            request.millis("total_time_ms")
        )
    else:
        raise request.fail(
            "request_received_ms",
            "a number (or event.event_time_unix_ms with request.total_time_ms)",
        )
    if replay is not None and replay.has("input_length"):
        input_tokens = replay.tokens("input_length")
    else:
        input_tokens = request.tokens("input_tokens")
    return _Row(
        arrival=arrival,
        input_tokens=input_tokens,
        output_tokens=request.tokens("output_tokens"),
        hash_ids=() if replay is None else replay.hashes("input_sequence_hashes"),
        cached_tokens=request.tokens("cached_tokens", default=0),
        request_id=request.text("request_id"),
        block_tokens=_block_tokens(replay),
        line=lineno,
        arrival_field=arrival_field,
        arrival_text=f"{arrival} ms",
    )
