"""Local event logs (fleetplan/eventlog.py): a broken file is an error naming it and the line."""

from __future__ import annotations

import gzip

import pytest

from fleetplan.eventlog import EventLogError, read_events
from fleetplan.schemas.codec import encode_event
from fleetplan.schemas.events import ClockEvent


def _lines(n: int) -> bytes:
    return b"".join(encode_event(ClockEvent(deployment="d", time=float(t))) + b"\n" for t in range(n))


def test_a_truncated_gzip_log_names_the_file_and_the_line_it_stopped_at(tmp_path):
    whole = gzip.compress(_lines(2000))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    read = []
    with pytest.raises(EventLogError, match=r"cut\.jsonl\.gz:\d+: the compressed file ends early \(truncated gzip\)"):
        for event in read_events(path):
            read.append(event)
    assert read and [e.time for e in read] == [float(t) for t in range(len(read))]  # what came before is kept


def test_a_plain_file_named_gz_is_not_a_gzip_file(tmp_path):
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(_lines(3))
    with pytest.raises(EventLogError, match=r"plain\.jsonl\.gz: not a gzip file"):
        list(read_events(path))


def test_a_byte_order_mark_on_the_first_line_is_read_past(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _lines(2))
    assert [e.time for e in read_events(path)] == [0.0, 1.0]


@pytest.mark.parametrize("damage", ["crc", "trailing"])
def test_a_damaged_gzip_log_is_corrupt_data_at_a_line_not_a_file_that_is_not_gzip(tmp_path, damage):
    """A bad CRC, or bytes after the compressed stream, was reported as 'not a gzip file' with no
    line (until 2026-12-05), after every line had been read from what is a gzip file."""
    whole = bytearray(gzip.compress(_lines(2000)))
    if damage == "crc":
        whole[-8] ^= 0xFF  # the trailer's CRC-32
    else:
        whole += b"junk"
    path = tmp_path / "damaged.jsonl.gz"
    path.write_bytes(whole)
    with pytest.raises(EventLogError, match=r"damaged\.jsonl\.gz:\d+: corrupt gzip data \(") as caught:
        list(read_events(path))
    assert "not a gzip file" not in str(caught.value)
