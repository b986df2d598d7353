"""Trace readers on real slices (tests/data/traces) and on broken lines."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fleetplan.sim.traces import TraceFormatError, TraceRequest, read_trace, trace_arrivals

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
AZURE = TRACES / "azure2023_code_head30.csv"
MOONCAKE = TRACES / "mooncake_conversation_head20.jsonl"
DYNAMO = TRACES / "pi_request_trace_head24.jsonl.gz"

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def dynamo_line(
    request_id: str = "r1",
    received: int | None = 1_000_000,
    event_time: int = 1_000_500,
    event_type: str = "request_end",
    **request,
) -> str:
    req = {
        "request_id": request_id,
        "input_tokens": 100,
        "output_tokens": 10,
        "cached_tokens": 0,
        "total_time_ms": 250.5,
        **request,
    }
    if received is not None:
        req["request_received_ms"] = received
    event = {
        "schema": "dynamo.request.trace.v1",
        "event_type": event_type,
        "event_time_unix_ms": event_time,
        "request": req,
    }
    return json.dumps({"timestamp": 0, "event": event}) + "\n"


def assert_sorted_from_zero(reqs: list[TraceRequest]) -> None:
    assert reqs[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))


# --- real slices -------------------------------------------------------------


def test_azure_slice():
    reqs = read_trace(AZURE)
    assert len(reqs) == 30
    assert_sorted_from_zero(reqs)
    # rows 1, 2 and 30: 18:17:03.9799600 (4808, 10), 18:17:04.0319600, 18:17:37.0599550 (730, 36)
    assert (reqs[0].input_tokens, reqs[0].output_tokens) == (4808, 10)
    assert reqs[1].arrival_s == 0.052
    assert reqs[-1].arrival_s == 33.079995
    assert (reqs[-1].input_tokens, reqs[-1].output_tokens) == (730, 36)
    assert reqs[0].hash_ids == () and reqs[0].request_id is None


def test_azure_timestamps_are_exact_to_the_tick(tmp_path):
    path = write(
        tmp_path,
        "t.csv",
        AZURE_HEADER
        + "2023-11-16 18:47:03.0000001,1,1\n"  # 30 min and one 100 ns tick later
        + "2023-11-16 18:17:03.0000000,1,1\n"
        + "2023-11-16 18:17:03.0000001,1,1\n"
        + "2023-11-17 00:00:00.5,1,1\n",  # across midnight, short fraction
    )
    got = [r.arrival_s for r in read_trace(path)]
    assert got == [0.0, 1e-7, 1800.0000001, 20577.5]
    assert got[2] == 18_000_000_001 / 10_000_000  # one rounding, no drift


def test_azure_2024_timestamps_carry_a_utc_offset(tmp_path):
    """Azure's 2024 week (AzureLLMInferenceTrace_{code,conv}_1week.csv) has the 2023 header
    but logs ``2024-05-10 00:00:00.009930+00:00``: microseconds and a UTC offset. Every row
    was refused (line 2: TIMESTAMP), so the week the span bound was sized for could not be read."""
    path = write(
        tmp_path,
        "week.csv",
        AZURE_HEADER
        + "2024-05-10 00:00:00.009930+00:00,2162,5\n"
        + "2024-05-10 00:00:01+00:00,10,1\n"  # a whole second is logged without a fraction
        + "2024-05-10 02:00:02.5+02:00,10,1\n"  # another offset: 00:00:02.5 UTC
        + "2024-05-10 00:00:03Z,10,1\n",
    )
    got = [r.arrival_s for r in read_trace(path)]
    assert got == [0.0, 0.99007, 2.49007, 2.99007]
    bad = write(tmp_path, "bad.csv", AZURE_HEADER + "2024-05-10 00:00:00.5+24:00,1,1\n")
    with pytest.raises(TraceFormatError) as info:
        read_trace(bad)
    assert (info.value.line, info.value.field) == (2, "TIMESTAMP")


def test_mooncake_slice():
    reqs = read_trace(MOONCAKE)
    assert len(reqs) == 20
    assert_sorted_from_zero(reqs)
    first = reqs[0]
    assert (first.input_tokens, first.output_tokens) == (6758, 500)
    assert first.hash_ids == tuple(range(14))
    assert reqs[-1].arrival_s == 3.0  # timestamps are milliseconds


def test_dynamo_slice_reads_request_end_rows_only():
    reqs = read_trace(DYNAMO)
    assert len(reqs) == 7  # 24 lines, 17 of them tool events
    assert_sorted_from_zero(reqs)
    first = reqs[0]
    assert first.request_id == "71491777-4c0d-4d7f-a8a5-54f11a28dde2"
    assert (first.input_tokens, first.output_tokens, first.cached_tokens) == (15, 3, 0)
    assert first.hash_ids == (1549729496416048079,)
    # the third request_end: received at 1779163102526, first at 1779163048815
    third = next(r for r in reqs if r.cached_tokens == 5232)
    assert third.arrival_s == pytest.approx(53.711)
    assert len(third.hash_ids) == 356


def test_trace_arrivals_feed_bucketing():
    reqs = read_trace(MOONCAKE)
    arrivals = trace_arrivals(reqs)
    assert arrivals[0] == (0.0, 6758.0, 500.0)
    assert len(arrivals) == len(reqs)


# --- ordering and detection --------------------------------------------------


def test_sorted_by_arrival_stable_and_relative_to_earliest(tmp_path):
    rows = [(2000, 1), (500, 2), (2000, 3), (500, 4)]
    text = "".join(
        json.dumps({"timestamp": t, "input_length": i, "output_length": 1, "hash_ids": []}) + "\n"
        for t, i in rows
    )
    reqs = read_trace(write(tmp_path, "m.jsonl", text))
    assert [(r.arrival_s, r.input_tokens) for r in reqs] == [
        (0.0, 2),
        (0.0, 4),
        (1.5, 1),
        (1.5, 3),
    ]


def test_detection_by_content_and_explicit_format(tmp_path):
    csv_text = AZURE.read_text()
    assert len(read_trace(write(tmp_path, "azure.txt", csv_text))) == 30
    assert len(read_trace(write(tmp_path, "azure.log", csv_text), fmt="azure")) == 30
    plain = write(tmp_path, "d.jsonl", gzip.decompress(DYNAMO.read_bytes()).decode())
    assert read_trace(plain) == read_trace(DYNAMO)
    assert read_trace(plain, fmt="dynamo") == read_trace(DYNAMO)
    assert read_trace(write(tmp_path, "empty.jsonl", "")) == []
    assert read_trace(write(tmp_path, "header.csv", AZURE_HEADER)) == []
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(plain, fmt="parquet")


def test_mixed_formats_are_rejected(tmp_path):
    mooncake = MOONCAKE.read_text().splitlines(keepends=True)[0]
    path = write(tmp_path, "mixed.jsonl", mooncake + dynamo_line())
    with pytest.raises(TraceFormatError, match=r"mixed\.jsonl:2: line: .*mixed formats"):
        read_trace(path)


# --- Dynamo request_end rules -------------------------------------------------


def test_dynamo_arrival_falls_back_to_end_time_minus_total_time(tmp_path):
    path = write(
        tmp_path,
        "d.jsonl",
        dynamo_line("a", received=1_000_000)
        + dynamo_line("b", received=None, event_time=1_002_000, total_time_ms=499.75),
    )
    a, b = read_trace(path)
    assert (a.request_id, b.request_id) == ("a", "b")
    assert b.arrival_s == 1.50025  # (1_002_000 - 499.75 - 1_000_000) ms, exactly


def test_dynamo_repeated_request_id_keeps_the_first_row(tmp_path):
    path = write(
        tmp_path,
        "d.jsonl.gz",
        dynamo_line("x", received=10, output_tokens=1)
        + dynamo_line("x", received=5, output_tokens=2)
        + dynamo_line("y", received=20),
    )
    reqs = read_trace(path)
    assert [(r.request_id, r.output_tokens) for r in reqs] == [("x", 1), ("y", 10)]


def test_dynamo_input_length_prefers_the_replay_block(tmp_path):
    replay = {"trace_block_size": 16, "input_length": 64, "input_sequence_hashes": [7, 8, 9, 10]}
    path = write(
        tmp_path,
        "d.jsonl",
        dynamo_line("a", input_tokens=60, replay=replay) + dynamo_line("b", input_tokens=33),
    )
    a, b = read_trace(path)
    assert (a.input_tokens, a.hash_ids, a.block_tokens) == (64, (7, 8, 9, 10), 16)
    assert (b.input_tokens, b.hash_ids, b.block_tokens) == (33, (), None)


def test_dynamo_other_event_types_are_skipped(tmp_path):
    tool = json.dumps(
        {"timestamp": 1, "event": {"schema": "dynamo.request.trace.v1", "event_type": "tool_end"}}
    )
    path = write(tmp_path, "d.jsonl", tool + "\n" + dynamo_line("a") + "\n")
    assert [r.request_id for r in read_trace(path)] == ["a"]


# --- malformed lines name file:line and the field ------------------------------


def trace_error(path) -> TraceFormatError:
    """The error reading ``path`` raises (the test fails if it reads)."""
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    return err.value


@pytest.mark.parametrize(
    "name,text,line,field",
    [
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.1,5,5\n2023-13-16 18:17:03.1,5,5\n", 3, "TIMESTAMP"),
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.12345678,5,5\n", 2, "TIMESTAMP"),
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.1,-5,5\n", 2, "ContextTokens"),
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.1,5,x\n", 2, "GeneratedTokens"),
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.1,5\n", 2, "row"),
        ("a.csv", "time,isl,osl\n", 1, "header"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5}\n', 2, "output_length"),
        ("m.jsonl", '{"timestamp": "soon", "input_length": 5, "output_length": 1}\n', 1, "timestamp"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n', 1, "input_length"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "a"]}\n', 1, "hash_ids"),
        ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 0,\n', 2, "line"),
        ("d.jsonl", dynamo_line() + dynamo_line("b", output_tokens=None), 2, "event.request.output_tokens"),
        ("d.jsonl", dynamo_line(received=None, total_time_ms=None), 1, "event.request.request_received_ms"),
        ("d.jsonl", dynamo_line(request_id=""), 1, "event.request.request_id"),
        ("d.jsonl.gz", dynamo_line() + dynamo_line(replay={"input_length": -1}), 2, "event.request.replay.input_length"),
        ("d.jsonl", '{"timestamp": 0, "event": {"schema": "other.v2", "event_type": "request_end"}}\n', 1, "event.schema"),
        ("d.jsonl", '{"timestamp": 0, "event": {"event_type": "request_end", "request": 5}}\n', 1, "event.request"),
        ("x.jsonl", '{"hello": 1}\n', 1, "line"),
    ],
)  # fmt: skip
def test_malformed_line_names_file_line_and_field(tmp_path, name, text, line, field):
    path = write(tmp_path, name, text)
    err = trace_error(path)
    assert str(err).startswith(f"{path}:{line}: {field}: ")
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert isinstance(err, ValueError)


def test_byte_order_mark_is_not_part_of_line_one(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + AZURE.read_bytes())
    assert read_trace(path) == read_trace(AZURE)
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + MOONCAKE.read_bytes())
    assert read_trace(path) == read_trace(MOONCAKE)


# --- values and files that parse but cannot be replayed --------------------------


def mooncake_line(timestamp: object = 0, input_length: object = 5, output_length: object = 1) -> str:
    return (
        f'{{"timestamp": {timestamp}, "input_length": {input_length}, '
        f'"output_length": {output_length}}}\n'
    )


def test_a_timestamp_beyond_float_range_names_its_line(tmp_path):
    path = write(tmp_path, "m.jsonl", mooncake_line(0) + mooncake_line("1e400"))
    err = trace_error(path)
    assert str(err) == f"{path}:2: timestamp: a finite number of ms, got 1E+400"


@pytest.mark.parametrize(
    "name,text,line,field",
    [
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.1,5,5\n2023-11-16 18:17:03.2," + "1" + "0" * 30 + ",5\n", 3, "ContextTokens"),
        ("a.csv", AZURE_HEADER + "2023-11-16 18:17:03.1,5,10000001\n", 2, "GeneratedTokens"),
        ("m.jsonl", mooncake_line() + mooncake_line(1, "1e26"), 2, "input_length"),
        ("m.jsonl", mooncake_line(output_length=10**8), 1, "output_length"),
        ("d.jsonl", dynamo_line(input_tokens=10**20), 1, "event.request.input_tokens"),
        ("d.jsonl", dynamo_line(replay={"input_length": 10**20}), 1, "event.request.replay.input_length"),
    ],
)  # fmt: skip
def test_a_token_count_above_the_bound_names_line_and_field(tmp_path, name, text, line, field):
    path = write(tmp_path, name, text)
    err = trace_error(path)
    assert str(err).startswith(f"{path}:{line}: {field}: at most 10,000,000 tokens, got ")


def test_an_absurd_span_blames_the_outlying_row_and_unsorted_rows_still_sort(tmp_path):
    rows = ["2023-11-16 18:17:03.5,5,5\n", "2023-11-16 18:17:03.1,6,5\n", "2023-11-16 18:17:04.0,7,5\n"]
    ok = read_trace(write(tmp_path, "ok.csv", AZURE_HEADER + "".join(rows)))
    assert [r.input_tokens for r in ok] == [6, 5, 7]  # out of order in the file: sorted, kept
    future = rows[:2] + ["9999-12-31 23:59:59.0000000,8,5\n"] + rows[2:]
    path = write(tmp_path, "far.csv", AZURE_HEADER + "".join(future))
    err = trace_error(path)
    assert (err.line, err.field) == (4, "TIMESTAMP")
    assert "within 366 days" in str(err) and "9999-12-31 23:59:59.0000000" in str(err)
    past = [mooncake_line(t) for t in (10**13, 5_000, 10**13 + 1_000, 10**13 + 2_000)]
    err = trace_error(write(tmp_path, "m.jsonl", "".join(past)))
    assert (err.line, err.field) == (2, "timestamp")  # the far-past row, not the rest


def test_a_truncated_or_fake_gzip_names_the_file(tmp_path):
    whole = gzip.compress(("".join(mooncake_line(t) for t in range(200))).encode())
    cut = tmp_path / "x.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    err = trace_error(cut)
    assert str(err) == f"{cut}: the compressed file ends early (truncated gzip)"
    fake = tmp_path / "notgz.jsonl.gz"
    fake.write_text(mooncake_line())
    err = trace_error(fake)
    assert str(err) == f"{fake}: not a gzip file"


@pytest.mark.parametrize("name", ["latin1.csv", "latin1.csv.gz"])
def test_text_that_is_not_utf8_names_line_and_byte(tmp_path, name):
    text = (AZURE_HEADER + "2023-11-16 18:17:03.1,5,5 caf\xe9\n").encode("latin-1")
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    err = trace_error(path)
    assert str(err) == f"{path}:2: not UTF-8 (byte 0xe9)"
