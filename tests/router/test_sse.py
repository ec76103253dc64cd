"""The router's one server-sent-events reader and writer (server/sse.py): events cut right whatever the chunks,
line ends, comments and multi-line data read as the standard says, and what the writer writes read back."""

from __future__ import annotations

import json

import pytest
from llmgw_router.server import sse

STREAM = (
    b'data: {"id":"a","choices":[{"delta":{"content":"Hel"}}]}\n\n'
    b": keep-alive\n\n"
    b'event: response.output_text.delta\ndata: {"delta":"lo"}\n\n'
    b"data: first line\ndata: second line\n\n"
    b"data: [DONE]\n\n"
)


def _events_in_chunks(stream: bytes, cuts: list[int]) -> list[bytes]:
    reader = sse.EventReader()
    out: list[bytes] = []
    at = 0
    for cut in [*cuts, len(stream)]:
        out += reader.feed(stream[at:cut])
        at = cut
    rest = reader.take_pending()
    assert rest in (b"", b"\n"), "only the LF of a CRLF cut after its CR may be left"
    return [*out, rest] if rest else out


def test_a_stream_cut_anywhere_gives_the_same_events() -> None:
    whole = _events_in_chunks(STREAM, [])
    assert len(whole) == 5
    assert b"".join(whole) == STREAM
    for cut in range(1, len(STREAM)):
        assert _events_in_chunks(STREAM, [cut]) == whole, f"cut at byte {cut}"
    assert _events_in_chunks(STREAM, list(range(1, len(STREAM)))) == whole  # one byte at a time


def test_an_incomplete_event_waits_for_its_blank_line() -> None:
    reader = sse.EventReader()
    assert reader.feed(b"data: one\n") == []
    assert reader.pending == b"data: one\n"
    assert reader.feed(b"\ndata: tw") == [b"data: one\n\n"]
    assert reader.take_pending() == b"data: tw"
    assert reader.pending == b""


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
def test_feed_block_gives_every_complete_event_in_one_piece(end: bytes) -> None:
    reader = sse.EventReader()
    assert reader.feed_block(b"data: a\n\ndata: b\n\ndata: c".replace(b"\n", end)) == (
        b"data: a\n\ndata: b\n\n".replace(b"\n", end)
    )
    assert reader.feed_block(b"") == b""
    assert reader.feed_block(b"\n".replace(b"\n", end)) == b""
    assert reader.feed_block(b"\n".replace(b"\n", end)) == b"data: c\n\n".replace(b"\n", end)
    assert reader.pending == b""


@pytest.mark.parametrize("end", [b"\r\n", b"\r", b"\n"])
def test_every_line_end_the_standard_allows(end: bytes) -> None:
    stream = STREAM.replace(b"\n", end)
    events = _events_in_chunks(stream, [])
    assert [sse.parse(e).data for e in events] == [
        b'{"id":"a","choices":[{"delta":{"content":"Hel"}}]}',
        None,
        b'{"delta":"lo"}',
        b"first line\nsecond line",
        b"[DONE]",
    ]
    for cut in range(1, len(stream)):  # a CRLF cut between two chunks still reads as one line end
        cut_events = _events_in_chunks(stream, [cut])
        assert b"".join(cut_events) == stream
        assert [d for e in cut_events if (d := sse.parse(e).data)] == [
            d for e in events if (d := sse.parse(e).data)
        ], f"cut at byte {cut}"


def test_a_crlf_line_end_is_not_a_blank_line() -> None:
    reader = sse.EventReader()
    assert reader.feed(b"data: x\r\n") == []
    assert reader.feed(b"data: y\r\n") == []
    assert reader.feed(b"\r\n") == [b"data: x\r\ndata: y\r\n\r\n"]
    # A CRLF cut in two: the CR ends the event; the LF after it is a blank line the next event starts with.
    assert reader.feed(b"data: z\r\n\r") == [b"data: z\r\n\r"]
    assert reader.feed(b"\ndata: w\r\n\r\n") == [b"\ndata: w\r\n\r\n"]
    assert sse.parse(b"\ndata: w\r\n\r\n").data == b"w"


def test_parse_reads_fields_skips_comments_and_takes_one_space_only() -> None:
    event = sse.parse(
        b": a comment\nevent: message_start\nid: 7\nretry: 10\ndata:  two spaces\ndata:none\n\n"
    )
    assert event.name == b"message_start"
    assert event.id == b"7"
    assert event.data == b" two spaces\nnone"
    assert not event.done
    assert sse.parse(b": only a comment\n\n") == sse.Event()
    assert sse.parse(b"data: [DONE]\n\n").done
    assert sse.parse(b"data:[DONE]\n\n").done


def test_json_is_the_data_read_or_none() -> None:
    assert sse.parse(b'data: {"a": 1}\n\n').json() == {"a": 1}
    assert sse.parse(b'data: {"a":\ndata: 1}\n\n').json() == {"a": 1}  # multi-line data joined
    assert sse.parse(b"data: not json\n\n").json() is None
    assert sse.parse(b"data: [DONE]\n\n").json() is None
    assert sse.parse(b": ping\n\n").json() is None


def test_split_keeps_a_trailing_incomplete_event() -> None:
    assert sse.split(b"data: a\n\ndata: b") == [b"data: a\n\n", b"data: b"]
    assert sse.split(b"data: a\n\n") == [b"data: a\n\n"]


def test_what_the_writer_writes_reads_back() -> None:
    obj = {"text": "two\nlines", "n": 1}
    raw = sse.format_json(obj, "response.created")
    assert raw == b'event: response.created\ndata: {"text": "two\\nlines", "n": 1}\n\n'
    assert sse.parse(raw).json() == obj
    multi = sse.format_event(b"one\r\ntwo\nthree", b"x", id=b"9")
    assert multi == b"event: x\nid: 9\ndata: one\ndata: two\ndata: three\n\n"
    assert sse.parse(multi) == sse.Event(b"one\ntwo\nthree", b"x", b"9")
    assert sse.EventReader().feed(multi + sse.DONE_EVENT) == [multi, sse.DONE_EVENT]


def test_data_events_counts_events_by_their_field_not_a_value() -> None:
    text = json.dumps({"content": "data: looks like a field"}).encode()
    block = sse.format_event(text) + b": ping\n\n" + sse.format_event(b"x", "named") + sse.DONE_EVENT
    assert sse.data_events(block) == 2
    assert sse.DONE_LINE in block


def test_could_start_knows_a_field_from_anything_else() -> None:
    assert sse.could_start(b"data: {")
    assert sse.could_start(b"da")  # too short to tell: it could be
    assert sse.could_start(b": ping\n\n")
    assert not sse.could_start(b"<html>")
    assert not sse.could_start(b'{"error": "x"}')
