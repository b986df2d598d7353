"""Local event logs: JSONL files that stand in for topics.

``fleetplan simulate`` writes its whole run (inputs, decisions, acks) to one
such file, ``fleetplan plan`` folds one, and ``fleetplan audit`` checks one
like a topic. Lines are the events' canonical JSON, one per line.
"""

from __future__ import annotations

import gzip
import itertools
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO

from fleetplan.schemas.codec import SchemaError, decode_event, encode_event


class EventLogError(ValueError):
    """A line of a local event log that is not a valid event: names file:line and field."""


def _open(path: Path) -> IO[bytes]:
    """The log for reading (gunzipped by its suffix); one it cannot open is an :class:`EventLogError`."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    except OSError as err:
        raise EventLogError(f"{path}: cannot open event log ({err.strerror})") from None


def read_events(
    path: str | Path, *, skip_invalid: bool = False, errors: list | None = None,
    check: Callable[[object], str | None] | None = None,
) -> Iterator:
    """The events of a JSONL log in file order; the log is opened, and its first line read, now.

    A log that cannot be opened, or a ``.gz`` that is not gzip (gzip reads its
    header on the first read, not at open), raises :class:`EventLogError`
    here, so a caller that opens output files after this call (truncating
    them) does not empty them for a typo. The log is opened once: a pipe
    (``--events <(zcat log.gz)``, ``/dev/stdin``) cannot be read twice, and
    until 2026-12-05 a separate check read its first lines and dropped them.

    A bad line raises :class:`EventLogError` naming ``file:line`` and the
    field, unless ``skip_invalid``: then it is appended to ``errors`` as
    ``(line, message)`` and skipped, and nothing read before it is lost.
    ``check`` is the intake's judgement of a well-formed event (a problem,
    or None), so a line the live worker would dead-letter is a bad line here
    too.
    """
    p = Path(path)
    fh = _open(p)
    lines = _lines(fh, p)
    try:
        first = next(lines, None)
    except EventLogError:
        fh.close()
        raise
    ahead = [] if first is None else [first]
    return _events(fh, p, itertools.chain(ahead, lines), skip_invalid, errors, check)


def _events(
    fh: IO[bytes], p: Path, lines: Iterator[tuple[int, bytes]], skip_invalid: bool,
    errors: list | None, check: Callable[[object], str | None] | None,
) -> Iterator:
    with fh:
        for n, raw in lines:
            line = raw.strip()
            if n == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark, as editors write
            if not line:
                continue
            try:
                event = decode_event(line)
                problem = None if check is None else check(event)
            except SchemaError as err:
                problem = str(err)
            if problem is None:
                yield event
                continue
            message = f"{p}:{n}: {problem}"
            if not skip_invalid:
                raise EventLogError(message) from None
            if errors is not None:
                errors.append((n, message))


def _lines(fh: IO[bytes], p: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered lines; a broken gzip file is an error naming it, not an abort or a bare zlib message."""
    n = 0
    try:
        for n, raw in enumerate(fh, start=1):  # noqa: B007 - n names the line a gzip error stopped at
            yield n, raw
    except EOFError:
        raise EventLogError(f"{p}:{n + 1}: the compressed file ends early (truncated gzip)") from None
    except gzip.BadGzipFile as err:
        # the header's magic before any data is "not gzip"; a bad CRC or length at a member's end,
        # or bytes after the last member, is damage at a line (until 2026-12-05 all "not a gzip file")
        if n == 0 and str(err).startswith("Not a gzipped file"):
            raise EventLogError(f"{p}: not a gzip file") from None
        raise EventLogError(f"{p}:{n + 1}: corrupt gzip data ({err})") from None
    except zlib.error as err:
        raise EventLogError(f"{p}:{n + 1}: corrupt gzip data ({err})") from None


def write_events(events: Iterable, out: IO[bytes]) -> int:
    """Write events as JSONL; returns how many were written."""
    count = 0
    for event in events:
        out.write(encode_event(event) + b"\n")
        count += 1
    return count
